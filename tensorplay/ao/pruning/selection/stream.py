"""The in-place band passes: count below the sampled band, then clear, zero and gather.

1. :func:`count_under` counts the eligible units with a key below the band's ``lo`` (and
   checks every eligible score is finite); it writes nothing.
2. If fewer than ``k`` are below ``lo``, every one of them is among the ``k`` lowest, so
   :func:`write_band` clears them all in the keep masks and, chunk by chunk while the chunk is
   in cache, zeroes them in the tensors to zero (the weights), and gathers the candidates in
   ``[lo, hi]`` (value and position).
3. Once the cut among the candidates is decided (:mod:`~.cut`), :func:`clear_candidates`
   clears the few at or below it.

So a call reads the scores twice and writes the masks and the tensors to zero once.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection.buffers import Sums, Worker
from tensorplay.ao.pruning.selection.passes import Band, check_sums, gather_band
from tensorplay.ao.pruning.selection.plan import Chunk, Selection
from tensorplay.ao.pruning.selection.threads import run_chunks

__all__ = ["clear_candidates", "count_under", "write_band"]


def _all_eligible(selection: Selection, chunk: Chunk) -> bool:
    """Whether every unit of a chunk is eligible (no mask to read)."""
    return all(selection.eligible[i] is None for i, _, _ in chunk)


def count_under(selection: Selection, lo: float, *, check: bool) -> int:
    """This rank's eligible units with a key below ``lo`` (one pass that writes nothing).

    Args:
        selection: the selection.
        lo: the key.
        check: whether to check that every eligible score is finite.

    Returns:
        The local count (sum it over the ranks).

    Example:
        >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
        >>> selection = Selection([torch.tensor([-1.0, 0.5, 3.0])], [None], AbsKeys(), [])
        >>> count_under(selection, 2.0, check=True)
        2
    """

    def work(worker: Worker, chunks: list[Chunk]) -> tuple[Sums, Sums]:
        below, sums = Sums(), Sums()
        for chunk in chunks:
            key = worker.raw_keys(chunk, sums if check else None)
            flags = worker.flags(key.device)[: key.numel()]
            torch.lt(key, lo, out=flags)
            if not _all_eligible(selection, chunk):
                flags.mul_(worker.eligible_flags(chunk, worker.scratch(key.device)[: key.numel()]))
            below.add(flags.sum())
        return below, sums

    results = run_chunks(selection, work)
    if check:
        check_sums(selection, [sums for _, sums in results])
    return sum(round(total) for below, _ in results for total in below.items())


def write_band(
    selection: Selection,
    lo: float,
    hi: float,
    outs: list[Tensor],
    zero: list[Tensor | None],
) -> Band:
    """Clear in the keep masks ``outs`` the eligible units with a key below ``lo``, multiply
    the tensors ``zero`` by the new masks, and gather the eligible units in ``[lo, hi]``.

    Args:
        selection: the selection.
        lo: units below it are cleared.
        hi: the band's upper key.
        outs: per source, its flat mask (bool, or float: eligible where ``1``), updated in
            place.
        zero: per source, a flat tensor multiplied by its new keep mask, or ``None``.

    Returns:
        The candidates (``below`` is not counted), or an overflow past the cap.
    """

    def work(worker: Worker, chunks: list[Chunk]) -> Band:
        band = Band(below=0)
        for chunk in chunks:
            key = worker.raw_keys(chunk)
            n = key.numel()
            keep = worker.scratch(key.device)[:n]
            torch.ge(key, lo, out=keep)
            eligible = None
            if not _all_eligible(selection, chunk):
                eligible = worker.eligible_flags(chunk, worker.flags(key.device)[:n])
                keep.mul_(eligible)
            worker.clear(chunk, keep, eligible, outs)  # before the gather reuses the flags
            if not band.overflow:
                gather_band(worker, chunk, key, keep, hi, band, bounded=True)
            worker.zero(chunk, keep, zero)
        return band

    band = Band(below=0)
    for part in run_chunks(selection, work):
        band.merge(part)
    if band.overflow:
        band.drop()
    return band


def clear_candidates(
    band: Band,
    cut: tuple[float, list[int]],
    outs: list[Tensor],
    zero: list[Tensor | None],
) -> int:
    """Clear the candidates at or below the cut in the tie-rule order; zero them in ``zero``.

    The pieces of one source are joined first, so each source costs a few operations.

    Args:
        band: this rank's candidates.
        cut: ``(value, stops)``: candidates of a lower key, or of that key at a local flat
            index below their source's stop, are cleared (``(inf, ...)``: all).
        outs: per source, its flat keep mask.
        zero: per source, a flat tensor to zero at the cleared units, or ``None``.

    Returns:
        The number of candidates cleared on this rank.

    Example:
        >>> band = Band(below=0, values=[torch.tensor([0.2, 0.1]), torch.tensor([0.2])],
        ...             sources=[0, 0], positions=[torch.tensor([1, 4]), torch.tensor([6])])
        >>> keep, weight = torch.ones(8, dtype=torch.bool), torch.ones(8)
        >>> clear_candidates(band, (0.2, [2]), [keep], [weight])
        2
        >>> keep.nonzero().view(-1).tolist(), weight.nonzero().view(-1).tolist()
        ([0, 2, 3, 5, 6, 7], [0, 2, 3, 5, 6, 7])
    """
    value, stops = cut
    cleared = 0
    for source, run in _runs(band.sources):
        positions = _join([band.positions[j] for j in run])
        if value != math.inf:
            values = _join([band.values[j] for j in run]).to(positions.device)
            tied = (values == value) & (positions < stops[source])
            positions = positions[(values < value) | tied]
        if not positions.numel():
            continue
        cleared += positions.numel()
        outs[source].index_fill_(0, positions, False)
        target = zero[source]
        if target is not None:  # times 0, as a multiply by the mask would (NaN stays NaN)
            target.index_copy_(0, positions, target.index_select(0, positions).mul_(0))
    return cleared


def _runs(sources: list[int]) -> list[tuple[int, list[int]]]:
    """Consecutive pieces of one source: ``(source, piece indices)``.

    Example:
        >>> _runs([0, 0, 1, 0])
        [(0, [0, 1]), (1, [2]), (0, [3])]
    """
    runs: list[tuple[int, list[int]]] = []
    for j, source in enumerate(sources):
        if runs and runs[-1][0] == source:
            runs[-1][1].append(j)
        else:
            runs.append((source, [j]))
    return runs


def _join(parts: list[Tensor]) -> Tensor:
    """The parts concatenated (one part: itself)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)
