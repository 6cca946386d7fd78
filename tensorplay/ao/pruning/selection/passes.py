"""The passes over every chunk: the fused pass and counting passes.

Each pass reads every source once, a chunk at a time (see
:func:`~tensorplay.ao.pruning.selection.threads.run_chunks`). The fused pass counts the eligible
units below a band, gathers the candidates inside it and may write the speculative keep masks
on the way; counting passes narrow an interval of keys. What the counts and candidates decide
is :mod:`~tensorplay.ao.pruning.selection.cut`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import tuning
from tensorplay.ao.pruning.selection.buffers import Sums, Worker
from tensorplay.ao.pruning.selection.checks import check_finite_scores
from tensorplay.ao.pruning.selection.plan import Chunk, Selection, chunk_length
from tensorplay.ao.pruning.selection.threads import run_chunks

__all__ = [
    "Band",
    "check_pass",
    "check_sums",
    "count_below",
    "fused_pass",
    "gather_band",
    "nonzero_columns",
    "pieces",
]


@dataclass
class Band:
    """The outcome of one pass over a band ``[lo, hi]``.

    Attributes:
        below: the number of eligible units with a key below ``lo``.
        values: the keys of the candidates (units in ``[lo, hi]``), one tensor per piece.
        sources: the source of each piece.
        positions: the flat positions of each piece's candidates in its source.
        size: the number of candidates.
        overflow: whether there were more candidates than a pass may gather (none kept).
        written: whether the pass wrote the keep masks so that only its candidates at or below
            the cut are left to clear.
        cleared: the eligible units the pass cleared for good (in place, below ``lo``): they
            are no longer eligible.
    """

    below: int
    values: list[Tensor] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    positions: list[Tensor] = field(default_factory=list)
    size: int = 0
    overflow: bool = False
    written: bool = False
    cleared: int = 0

    def merge(self, other: Band) -> None:
        """Append ``other``'s counts and candidates (the next share of the chunks)."""
        self.below += other.below
        self.size += other.size
        self.overflow |= other.overflow
        self.values += other.values
        self.sources += other.sources
        self.positions += other.positions

    def drop(self) -> None:
        """Forget the candidates (after an overflow), keeping the counts."""
        self.values, self.sources, self.positions = [], [], []


def fused_pass(
    selection: Selection,
    lo: float,
    hi: float,
    outs: list[Tensor] | None,
    *,
    check: bool,
    bounded: bool = True,
) -> Band:
    """Write ``key >= lo`` into ``outs``, count eligible keys below ``lo``, gather ``[lo, hi]``.

    Everything per element is a float compare, multiply or sum (vectorised); positions are
    extracted only from the columns (of ``tuning.ROWS`` rows) that hold a candidate.

    Args:
        selection: the selection.
        lo: the band's lower key; units below it are pruned.
        hi: the band's upper key (``hi < lo``: gather nothing).
        outs: the flat keep masks, written in full; ``None``: count and gather only.
        check: whether to check that every eligible score is finite.
        bounded: whether a worker stops gathering past its share of the cap (an overflow);
            ``False`` when the band is known to hold at most the cap, however it is spread.

    Returns:
        The band: the count below ``lo`` and the candidates (or an overflow).
    """
    gather = hi >= lo and hi != -math.inf

    def work(worker: Worker, chunks: list[Chunk]) -> tuple[Band, Sums]:
        band, kept, sums = Band(below=0), Sums(), Sums()
        for chunk in chunks:
            key = worker.chunk_keys(chunk, sums if check else None)
            keep = _write_keep(worker, chunk, key, lo, outs)
            kept.add(keep.sum(dtype=torch.float32))
            if gather and not band.overflow:
                gather_band(worker, chunk, key, keep, hi, band, bounded)
        # Units not eligible have the key inf, so all are kept: what is not kept is below lo.
        band.below = sum(chunk_length(c) for c in chunks) - sum(round(c) for c in kept.items())
        return band, sums

    results = run_chunks(selection, work)
    band = Band(below=0)
    for part, _ in results:
        band.merge(part)
    if band.overflow:
        band.drop()
    if check:
        check_sums(selection, [sums for _, sums in results])
    return band


def _write_keep(
    worker: Worker, chunk: Chunk, key: Tensor, lo: float, outs: list[Tensor] | None
) -> Tensor:
    """Write a chunk's keep mask ``key >= lo`` into ``outs`` (if any); return it."""
    # Comparisons into a buffer of the keys' dtype are vectorised; into bool, uint8 or another
    # float dtype they are not (and make a temporary: see buffers.py): a chunk of one output of
    # the keys' dtype is written in place, any other goes through scratch and a copy.
    i, start, stop = chunk[0]
    direct = outs is not None and len(chunk) == 1 and outs[i].dtype == key.dtype
    keep = worker.scratch(key.device)[: key.numel()]
    if outs is not None and direct:
        keep = outs[i][start:stop]
    torch.ge(key, lo, out=keep)
    if outs is not None and not direct:
        worker.write(chunk, keep, outs)
    return keep


def gather_band(
    worker: Worker,
    chunk: Chunk,
    key: Tensor,
    keep: Tensor,
    hi: float,
    band: Band,
    bounded: bool,
) -> None:
    """Add a chunk's candidates (``keep`` 1 and ``key <= hi``) to ``band``.

    If ``bounded``, a worker past its share of the cap marks the band as overflowing and drops
    its candidates: the caller then narrows the band, or selects among the units left.
    """
    flags = worker.flags(key.device)[: key.numel()]
    torch.le(key, hi, out=flags)
    flags.mul_(keep)
    index = nonzero_columns(flags)
    if not index.numel():
        return
    band.size += index.numel()
    if bounded and band.size > worker.cap:
        band.overflow = True
        band.drop()
        return
    for source, at, positions in pieces(chunk, index):
        band.values.append(key[at])
        band.sources.append(source)
        band.positions.append(positions)


def pieces(chunk: Chunk, index: Tensor) -> list[tuple[int, Tensor, Tensor]]:
    """Split sorted flat ``index``es of a chunk by piece: (source, index, position in source).

    Example:
        >>> pieces([(0, 5, 7), (1, 0, 3)], torch.tensor([1, 3]))
        [(0, tensor([1]), tensor([6])), (1, tensor([3]), tensor([1]))]
    """
    if len(chunk) == 1:
        source, start, _ = chunk[0]
        return [(source, index, index + start)]
    lengths = [stop - start for _, start, stop in chunk]
    ends = torch.tensor(lengths, device=index.device).cumsum(0)
    counts = torch.diff(torch.searchsorted(index, ends), prepend=ends.new_zeros(1)).tolist()
    found = []
    offset = 0
    for (source, start, _), at, length in zip(
        chunk, torch.split(index, counts), lengths, strict=True
    ):
        if at.numel():
            found.append((source, at, at - offset + start))
        offset += length
    return found


def nonzero_columns(flags: Tensor) -> Tensor:
    """Sorted flat indices of the non-zero entries of the flat float ``flags`` (few of them).

    Viewed as ``tuning.ROWS`` rows, a column sum (vectorised, one read) finds the columns
    holding one; only those are scanned. Row-major order of ``(row, column)`` is the flat order.

    Example:
        >>> nonzero_columns(torch.tensor([0.0] * 40 + [1.0, 0.0, 1.0]))
        tensor([40, 42])
    """
    n = flags.numel()
    size = n - n % tuning.ROWS
    width = size // tuning.ROWS
    parts = []
    if width:
        grid = flags[:size].view(tuning.ROWS, width)
        columns = torch.nonzero(grid.sum(0)).view(-1)
        if columns.numel():
            # index_select: several times faster than advanced indexing here.
            rows, at = torch.nonzero(grid.index_select(1, columns)).unbind(1)
            parts.append(rows.mul_(width).add_(columns.index_select(0, at)))
    if size < n:
        parts.append(torch.nonzero(flags[size:]).view(-1) + size)
    if not parts:
        return torch.empty(0, dtype=torch.int64, device=flags.device)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def count_below(selection: Selection, thresholds: list[float], *, check: bool) -> list[int]:
    """For each (sorted) threshold ``t``: the number of eligible units with key ``< t``.

    Args:
        selection: the selection.
        thresholds: the thresholds, sorted.
        check: whether to check that every eligible score is finite.

    Returns:
        One count per threshold.
    """

    def work(worker: Worker, chunks: list[Chunk]) -> tuple[list[Sums], Sums]:
        counts = [Sums() for _ in thresholds]
        sums = Sums()
        for chunk in chunks:
            key = worker.chunk_keys(chunk, sums if check else None)
            flags = worker.flags(key.device)[: key.numel()]
            for t, count in zip(thresholds, counts, strict=True):
                count.add(torch.lt(key, t, out=flags).sum())
        return counts, sums

    results = run_chunks(selection, work)
    if check:
        check_sums(selection, [sums for _, sums in results])
    return [
        sum(round(c) for counts, _ in results for c in counts[j].items())
        for j in range(len(thresholds))
    ]


def check_sums(selection: Selection, sums: list[Sums]) -> None:
    """Raise the exact check's error if a chunk sum is not finite (maybe a harmless overflow).

    Sharded, every rank raises if any does (one collective), so none waits for the others.
    """
    error: ValueError | None = None
    if not all(math.isfinite(total) for part in sums for total in part.items()):
        try:
            check_finite_scores(selection.scores, selection.eligible, selection.labels)
        except ValueError as found:
            error = found
    if selection.comm.group is None:
        if error is not None:
            raise error
        return
    if selection.comm.sum([error is not None])[0]:
        raise error or ValueError(
            "Expected finite importance scores on every rank, but another rank of the process "
            "group has a NaN or infinite one."
        )


def check_pass(selection: Selection) -> None:
    """One counting pass that checks every eligible score is finite (``k`` is 0 or all)."""
    count_below(selection, [], check=True)
