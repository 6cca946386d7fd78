"""The cut: the ``k``-th lowest unit in the tie-rule order, found by passes that write nothing.

A cut is a pair ``(value, order)``: the units pruned are the eligible ones whose
``(key, order)`` is at most the cut's, where a unit's *order* is its global position in the
tie-rule order (its source's base, the units of all earlier full sources, plus its global flat
index). Locally that is, per source, every key below ``value`` and the keys equal to it at a
local flat index below the source's *stop* (:func:`local_stops`), so one pass writes the masks.

Sharded, the candidates stay on their ranks: counting collectives narrow them until a few are
left, which are then gathered (:func:`resolve`); a ``k``-th key held by more units than a pass
may gather is resolved by counting the tied units of every source on every rank
(:func:`tie_cut`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import tuning
from tensorplay.ao.pruning.selection.buffers import Worker
from tensorplay.ao.pruning.selection.floats import largest, next_down, next_up
from tensorplay.ao.pruning.selection.passes import Band, count_below, fused_pass
from tensorplay.ao.pruning.selection.plan import Chunk, Selection
from tensorplay.ao.pruning.selection.refine import bounds_after, narrow, split_points
from tensorplay.ao.pruning.selection.sample import guess_band
from tensorplay.ao.pruning.selection.sharding import Collectives
from tensorplay.ao.pruning.selection.stream import zero_chunk
from tensorplay.ao.pruning.selection.threads import run_chunks

__all__ = [
    "count_cut",
    "cut_between",
    "find_cut",
    "local_stops",
    "lowest",
    "resolve",
    "tie_cut",
    "write_cut",
]


def bases(selection: Selection) -> list[int]:
    """Per source, the order of its full tensor's first unit (the units of earlier sources)."""
    out, total = [], 0
    for layout in selection.layouts:
        out.append(total)
        total += layout.numel
    return out


def find_cut(selection: Selection, k: int, n_eligible: int) -> tuple[float, int]:
    """The cut of the ``k`` eligible units of lowest key (``0 < k < n_eligible``), checking on
    the way that every eligible score is finite.

    Args:
        selection: the selection (sharded or not).
        k: how many eligible units to prune.
        n_eligible: the eligible units (over all ranks).

    Returns:
        ``(value, order)``.
    """
    dtype = selection.keys.dtype
    if n_eligible <= selection.cap:
        lo, hi = -math.inf, largest(dtype)
    else:
        lo, hi = guess_band(selection, k, n_eligible)
    if lo == hi:  # the sample says the k-th key is heavily tied: pin it down by counting
        return cut_between(selection, k, 0.0, math.inf, check=True)
    band = fused_pass(selection, lo, hi, None, check=True)
    below, size, overflow = selection.comm.sum([band.below, band.size, band.overflow])
    if not overflow and below < k <= below + size:
        return resolve(selection, band, k - below, lo, next_up(hi, dtype))
    low, high = bounds_after(Band(below, overflow=bool(overflow)), k, lo, hi, dtype)
    return cut_between(selection, k, low, high)


def cut_between(
    selection: Selection, k: int, low: float, high: float, *, check: bool = False
) -> tuple[float, int]:
    """The cut of the ``k`` eligible units of lowest key, known to lie in ``[low, high)``.

    Counting passes narrow the interval (:func:`~.refine.narrow`), then one pass gathers it,
    or a tie pass finds the position in a heavily tied key.

    Args:
        selection: the selection.
        k: how many eligible units to prune.
        low: a key with fewer than ``k`` eligible keys below it.
        high: a key with at least ``k`` eligible keys below it.
        check: whether the first pass checks that every eligible score is finite.

    Returns:
        ``(value, order)``.
    """
    low, high, below, inside = narrow(selection, k, low, high, check=check)
    if inside > selection.cap:
        return tie_cut(selection, k - below, low)
    dtype = selection.keys.dtype
    band = fused_pass(selection, low, next_down(high, dtype), None, check=False, bounded=False)
    return resolve(selection, band, k - below, low, high)


def resolve(
    selection: Selection, band: Band, wanted: int, low: float, high: float
) -> tuple[float, int]:
    """The cut at the ``wanted``-th lowest candidate of every rank's band in ``[low, high)``.

    Args:
        selection: the selection.
        band: this rank's candidates.
        wanted: the rank of the cut among all candidates (from 1).
        low: the band's lowest key.
        high: above the band's highest key.

    Returns:
        ``(value, order)``.
    """
    device = band.values[0].device if band.values else torch.device("cpu")
    dtype = selection.keys.dtype
    start = bases(selection)
    values = torch.cat([v.to(device) for v in band.values]) if band.values else torch.empty(0)
    order = (
        torch.cat(
            [
                p.to(device) + (start[i] + selection.layouts[i].offset)
                for i, p in zip(band.sources, band.positions, strict=True)
            ]
        )
        if band.positions
        else torch.empty(0, dtype=torch.int64)
    )
    comm = selection.comm
    if comm.group is None:
        return lowest(values.to(dtype), order, wanted)
    values, order, wanted = _narrow_candidates(comm, values.to(dtype), order, wanted, low, high)
    both = comm.gather(torch.stack([values.double(), order.double()], 1).cpu())
    return lowest(both[:, 0].to(dtype), both[:, 1].long(), wanted)


def _narrow_candidates(
    comm: Collectives, values: Tensor, order: Tensor, wanted: int, low: float, high: float
) -> tuple[Tensor, Tensor, int]:
    """The candidates of an interval holding the ``wanted``-th and at most ``tuning.GATHER``.

    Each round counts the candidates below 31 split points over all ranks (one collective):
    first of the keys' bit patterns, then, within one tied key, of the order.
    """
    total = comm.sum([values.numel()])[0]
    first, last = 0, 1 << 62
    while total > tuning.GATHER:
        tied = next_up(low, values.dtype) >= high
        if tied:
            field: Tensor = order
            points: list[float] = [first, *_int_points(first, last), last]
        else:
            field = values
            points = [low, *split_points(low, high, values.dtype, None), high]
        inner = comm.sum([int(torch.count_nonzero(field < p)) for p in points[1:-1]])
        counts = [0, *inner, total]
        j = next(j for j in range(len(counts) - 1) if counts[j] < wanted <= counts[j + 1])
        inside = (field >= points[j]) & (field < points[j + 1])
        values, order = values[inside], order[inside]
        wanted, total = wanted - counts[j], counts[j + 1] - counts[j]
        if tied:
            first, last = int(points[j]), int(points[j + 1])
        else:
            low, high = points[j], points[j + 1]
    return values, order, wanted


def _int_points(first: int, last: int) -> list[int]:
    """Integers strictly inside ``(first, last)``, about evenly spaced, sorted."""
    n = tuning.THRESHOLDS_PER_PASS
    return sorted({first + (last - first) * j // (n + 1) for j in range(1, n + 1)} - {first})


def lowest(values: Tensor, order: Tensor, wanted: int) -> tuple[float, int]:
    """The cut at the ``wanted``-th lowest ``(value, order)`` pair (from 1).

    Example:
        >>> lowest(torch.tensor([0.5, 0.1, 0.5]), torch.tensor([7, 9, 3]), 2)
        (0.5, 3)
    """
    value = torch.kthvalue(values, wanted).values
    ties = wanted - int(torch.count_nonzero(values < value))
    return float(value), int(torch.kthvalue(order[values == value], ties).values)


def tie_cut(selection: Selection, wanted: int, value: float) -> tuple[float, int]:
    """The cut at the ``wanted``-th unit of key ``value`` in the tie-rule order, when too many
    units hold it to gather: each rank counts the tied units of each source (one pass), the
    counts of all ranks are gathered, and the rank holding the cut finds its position.

    Args:
        selection: the selection.
        wanted: the rank of the cut among the units of key ``value`` (from 1).
        value: the ``k``-th key.

    Returns:
        ``(value, order)``.
    """
    n = len(selection.sizes)

    def work(worker: Worker, chunks: list[Chunk]) -> list[Tensor]:
        ties = [torch.zeros((), dtype=torch.int64) for _ in range(n)]
        for chunk in chunks:
            key = worker.chunk_keys(chunk)
            flags = worker.flags(key.device)[: key.numel()]
            torch.eq(key, value, out=flags)
            for i, a, b in _piece_slices(chunk):
                ties[i] = ties[i] + flags[a:b].sum().to("cpu", torch.int64)
        return ties

    local = [sum(int(part[i]) for part in run_chunks(selection, work)) for i in range(n)]
    comm = selection.comm
    rows = comm.rows([*local, *(layout.offset for layout in selection.layouts)])
    owner, source, nth = _locate(rows, n, wanted)
    order = -1
    if owner == comm.rank:
        position = _nth_tie(selection, source, value, nth)
        order = bases(selection)[source] + selection.layouts[source].offset + position
    return value, comm.maximum(order)


def _locate(rows: list[list[int]], n: int, wanted: int) -> tuple[int, int, int]:
    """(rank, source, nth): where the ``wanted``-th tied unit lies, from every rank's counts."""
    for source in range(n):
        for offset, rank, ties in sorted(
            (row[n + source], r, row[source]) for r, row in enumerate(rows)
        ):
            del offset
            if wanted <= ties:
                return rank, source, wanted
            wanted -= ties
    raise RuntimeError("Lost the tied k-th key: please report.")


def _nth_tie(selection: Selection, source: int, value: float, nth: int) -> int:
    """The local flat index of the ``nth`` unit of key ``value`` in ``source`` (from 1)."""
    worker = Worker(selection)
    for chunk in selection.chunks():
        if all(i != source for i, _, _ in chunk):
            continue
        key = worker.chunk_keys(chunk)
        for (i, start, _), (_, a, b) in zip(chunk, _piece_slices(chunk), strict=True):
            if i != source:
                continue
            at = torch.nonzero(key[a:b] == value).view(-1)
            if nth <= at.numel():
                return start + int(at[nth - 1])
            nth -= at.numel()
    raise RuntimeError("Lost the tied k-th key: please report.")


def _piece_slices(chunk: Chunk) -> list[tuple[int, int, int]]:
    """Per piece of a chunk: (source, first, stop) within the chunk's buffers."""
    out, offset = [], 0
    for i, start, stop in chunk:
        out.append((i, offset, offset + stop - start))
        offset += stop - start
    return out


def local_stops(selection: Selection, order: int) -> list[int]:
    """Per source, the local flat index below which units of the cut's key are pruned."""
    return [
        min(max(order - base - layout.offset + 1, 0), size)
        for base, layout, size in zip(
            bases(selection), selection.layouts, selection.sizes, strict=True
        )
    ]


def write_cut(
    selection: Selection,
    values: list[float],
    stops: list[int],
    outs: list[Tensor],
    zero: list[Tensor | None] | None = None,
) -> None:
    """Clear in ``outs`` (the flat bool keep masks) the eligible units of each source ``i``
    with a key below ``values[i]``, or equal to it at a local flat index below ``stops[i]``.

    Args:
        selection: the selection; its eligibility is ``outs`` themselves (or every unit, where
            a source's eligibility is ``None``).
        values: per source, the cut's key (``-inf``: nothing pruned).
        stops: per source, where the pruned ties end.
        outs: the flat keep masks, updated in place.
        zero: per source, a flat tensor multiplied by its new keep mask in the same pass, or
            ``None``.
    """

    def work(worker: Worker, chunks: list[Chunk]) -> None:
        for chunk in chunks:
            key = worker.raw_keys(chunk)
            keep = worker.flags(key.device)[: key.numel()]
            for (i, start, _), (_, a, b) in zip(chunk, _piece_slices(chunk), strict=True):
                value = values[i]
                if value == -math.inf:
                    keep[a:b].fill_(1)
                    continue
                torch.ge(key[a:b], value, out=keep[a:b])
                tied = min(max(stops[i] - start, 0), b - a)
                if tied:
                    torch.gt(key[a : a + tied], value, out=keep[a : a + tied])
            if any(selection.eligible[i] is not None for i, _, _ in chunk):
                scratch = worker.scratch(key.device)[: key.numel()]
                keep.mul_(worker.eligible_flags(chunk, scratch))
            worker.write(chunk, keep, outs)
            if zero is not None:
                zero_chunk(chunk, keep, zero)

    run_chunks(selection, work)


def count_cut(selection: Selection, values: list[float], stops: list[int]) -> list[int]:
    """Per source, the eligible units :func:`write_cut` would clear, over all ranks.

    Args:
        selection: the selection.
        values: per source, the cut's key.
        stops: per source, where the pruned ties end.

    Returns:
        One count per source.
    """
    n = len(selection.sizes)

    def work(worker: Worker, chunks: list[Chunk]) -> list[Tensor]:
        counts = [torch.zeros((), dtype=torch.int64) for _ in range(n)]
        for chunk in chunks:
            key = worker.chunk_keys(chunk)
            for (i, start, _), (_, a, b) in zip(chunk, _piece_slices(chunk), strict=True):
                tied = min(max(stops[i] - start, 0), b - a)
                found = torch.count_nonzero(key[a:b] < values[i])
                if tied:
                    found = found + torch.count_nonzero(key[a : a + tied] == values[i])
                counts[i] = counts[i] + found.to("cpu")
        return counts

    local = [sum(int(part[i]) for part in run_chunks(selection, work)) for i in range(n)]
    return selection.comm.sum(local)


def check_pass(selection: Selection) -> None:
    """One counting pass that checks every eligible score is finite (``k`` is 0 or all)."""
    count_below(selection, [], check=True)
