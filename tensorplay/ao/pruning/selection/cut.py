"""The k-th key engine: where every selection decides its cut, by passes that count and gather.

A cut is a pair ``(value, order)``: the units pruned are the eligible ones whose
``(key, order)`` is at most the cut's, where a unit's *order* is its global position in the
tie-rule order (its source's base, the units of all earlier full sources, plus its global flat
index). Locally that is, per source, every key below ``value`` and the keys equal to it at a
local flat index below the source's *stop* (:func:`local_stops`), so one pass writes the masks
(:mod:`~.write`).

The band policy, once for every caller (:func:`find_cut`): a sampled band, one pass over it
(what it writes on the way is the caller's :class:`~.scans.Scan`), the cut among its
candidates if they bracket the ``k``-th key (:func:`resolve`), else counting passes that narrow
an interval until it can be gathered (:func:`cut_between`), or a ``k``-th key held by more
units than a pass may gather, resolved by counting the tied units of every source
(:func:`tie_cut`). Sharded, the candidates stay on their ranks: counting collectives narrow
them until a few are left, which are then gathered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import tuning
from tensorplay.ao.pruning.selection.buffers import Worker
from tensorplay.ao.pruning.selection.floats import largest, next_down, next_up
from tensorplay.ao.pruning.selection.passes import Band
from tensorplay.ao.pruning.selection.plan import Chunk, Selection, piece_slices
from tensorplay.ao.pruning.selection.ranks import lowest_key, nth_equal
from tensorplay.ao.pruning.selection.refine import bounds_after, narrow, split_points
from tensorplay.ao.pruning.selection.sample import guess_band
from tensorplay.ao.pruning.selection.scans import Scan
from tensorplay.ao.pruning.selection.sharding import Collectives
from tensorplay.ao.pruning.selection.threads import run_chunks

__all__ = [
    "Cut",
    "bases",
    "cut_between",
    "find_cut",
    "local_stops",
    "lowest",
    "orders",
    "resolve",
    "tie_cut",
]


@dataclass(frozen=True)
class Cut:
    """The ``k``-th unit in the tie-rule order, and what the engine's passes wrote.

    Attributes:
        value: the ``k``-th key.
        order: the ``k``-th unit's global position in the tie-rule order.
        band: the band whose pass wrote the masks, so that only its candidates at or below the
            cut are left to clear; ``None``: the masks are still to be written at the cut.

    Example:
        >>> Cut(0.5, 3)
        Cut(value=0.5, order=3, band=None)
    """

    value: float
    order: int
    band: Band | None = None


def bases(selection: Selection) -> list[int]:
    """Per source, the order of its full tensor's first unit (the units of earlier sources)."""
    out, total = [], 0
    for layout in selection.layouts:
        out.append(total)
        total += layout.numel
    return out


def orders(selection: Selection, band: Band) -> list[Tensor]:
    """Per piece of the band, its candidates' global positions in the tie-rule order."""
    start = bases(selection)
    return [
        positions + (start[i] + selection.layouts[i].offset)
        for i, positions in zip(band.sources, band.positions, strict=True)
    ]


def find_cut(selection: Selection, k: int, n_eligible: int, scan: Scan | None = None) -> Cut:
    """The cut of the ``k`` eligible units of lowest key (``0 < k < n_eligible``), checking on
    the way that every eligible score is finite.

    Args:
        selection: the selection (sharded or not).
        k: how many eligible units to prune.
        n_eligible: the eligible units (over all ranks).
        scan: what the passes write on the way (default: nothing).

    Returns:
        The cut, and the band left to clear if a pass wrote the masks.

    Example:
        >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
        >>> selection = Selection([torch.tensor([0.3, 0.1, 0.3, 0.2])], [None], AbsKeys(), [])
        >>> cut = find_cut(selection, 3, 4)
        >>> cut.value, cut.order
        (0.30000001192092896, 0)
    """
    scan = Scan() if scan is None else scan
    dtype = selection.keys.dtype
    if n_eligible <= selection.cap:
        lo, hi = -math.inf, largest(dtype)
    else:
        lo, hi = guess_band(selection, k, n_eligible)
    if lo == hi:  # the sample says the k-th key is heavily tied: pin it down by counting
        return cut_between(selection, k, 0.0, math.inf, scan, check=True)
    band = scan.band(selection, k, lo, hi)
    if not band.overflow and band.below < k <= band.below + band.size:
        value, order = resolve(selection, band, k - band.below, lo, next_up(hi, dtype))
        return Cut(value, order, band if band.written else None)
    low, high = bounds_after(band, k, lo, hi, dtype)
    # Units the band pass cleared for good are no longer eligible: the rest is chosen among
    # the units left.
    return cut_between(selection, k - band.cleared, low, high, scan)


def cut_between(
    selection: Selection,
    k: int,
    low: float,
    high: float,
    scan: Scan | None = None,
    *,
    check: bool = False,
) -> Cut:
    """The cut of the ``k`` eligible units of lowest key, known to lie in ``[low, high)``.

    Counting passes narrow the interval (:func:`~.refine.narrow`), then one pass gathers it,
    or a tie pass finds the position in a heavily tied key.

    Args:
        selection: the selection.
        k: how many eligible units to prune.
        low: a key with fewer than ``k`` eligible keys below it.
        high: a key with at least ``k`` eligible keys below it.
        scan: what the gathering pass writes on the way (default: nothing).
        check: whether the first pass checks that every eligible score is finite.

    Returns:
        The cut, and the band left to clear if the gathering pass wrote the masks.
    """
    scan = Scan() if scan is None else scan
    low, high, below, inside = narrow(selection, k, low, high, check=check)
    if inside > selection.cap:
        return Cut(*tie_cut(selection, k - below, low))
    band = scan.interval(selection, low, next_down(high, selection.keys.dtype))
    value, order = resolve(selection, band, k - below, low, high)
    return Cut(value, order, band if band.written else None)


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
    comm = selection.comm
    dtype = selection.keys.dtype
    if comm.group is None:
        # One process: the pieces are in the tie-rule order, ranked without joining them.
        value, nth = lowest_key(band.values, wanted, dtype)
        piece, index = nth_equal(band.values, value, nth)
        source = band.sources[piece]
        first = bases(selection)[source] + selection.layouts[source].offset
        return value, first + int(band.positions[piece][index])
    device = band.values[0].device if band.values else torch.device("cpu")
    values = torch.cat([v.to(device) for v in band.values]) if band.values else torch.empty(0)
    order = (
        torch.cat([p.to(device) for p in orders(selection, band)])
        if band.positions
        else torch.empty(0, dtype=torch.int64)
    )
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
            for i, a, b in piece_slices(chunk):
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
        for (i, start, _), (_, a, b) in zip(chunk, piece_slices(chunk), strict=True):
            if i != source:
                continue
            at = torch.nonzero(key[a:b] == value).view(-1)
            if nth <= at.numel():
                return start + int(at[nth - 1])
            nth -= at.numel()
    raise RuntimeError("Lost the tied k-th key: please report.")


def local_stops(selection: Selection, order: int) -> list[int]:
    """Per source, the local flat index below which units of the cut's key are pruned."""
    return [
        min(max(order - base - layout.offset + 1, 0), size)
        for base, layout, size in zip(
            bases(selection), selection.layouts, selection.sizes, strict=True
        )
    ]
