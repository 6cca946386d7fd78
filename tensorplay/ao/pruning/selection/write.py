"""Writing a cut into the masks: every mask in one pass, or the few candidates a pass left.

After :func:`~.cut.find_cut`, :func:`apply_cut` finishes the caller's masks: if the engine's
band pass already wrote them (:mod:`~.scans`), only that band's candidates at or below the cut
are cleared; otherwise one pass writes every mask at the cut (:func:`write_cut`), zeroing the
tensors to zero chunk by chunk while in cache.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection.buffers import Worker
from tensorplay.ao.pruning.selection.cut import Cut, local_stops
from tensorplay.ao.pruning.selection.plan import Chunk, Selection, piece_slices
from tensorplay.ao.pruning.selection.stream import clear_candidates
from tensorplay.ao.pruning.selection.threads import run_chunks

__all__ = ["apply_cut", "count_cut", "write_cut"]


def apply_cut(
    selection: Selection,
    cut: Cut,
    outs: list[Tensor],
    zero: list[Tensor | None] | None = None,
    *,
    factors: bool = False,
) -> None:
    """Finish the masks ``outs`` at ``cut``: clear the units at or below it.

    Args:
        selection: the selection the cut was found on.
        cut: the cut, with the band left to clear if a pass wrote the masks.
        outs: the flat masks: the bool keep masks themselves (in place), or, with ``factors``,
            keep factors of separate eligibility masks.
        zero: per source, a flat tensor multiplied by its new keep mask, or ``None``.
        factors: whether ``outs`` are keep factors (units not eligible are kept, ``1``).

    Example:
        >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
        >>> keep = [torch.ones(3, dtype=torch.bool)]
        >>> selection = Selection([torch.tensor([0.3, 0.1, 0.2])], keep, AbsKeys(), [])
        >>> apply_cut(selection, Cut(0.20000000298023224, 2), keep)
        >>> keep[0].tolist()
        [True, False, False]
    """
    targets: list[Tensor | None] = [None] * len(outs) if zero is None else zero
    if cut.band is not None:
        stops = local_stops(selection, cut.order)
        clear_candidates(cut.band, (cut.value, stops), outs, targets)
        return
    values = [cut.value] * len(outs)
    write_cut(selection, values, local_stops(selection, cut.order), outs, targets, factors=factors)


def write_cut(
    selection: Selection,
    values: list[float],
    stops: list[int],
    outs: list[Tensor],
    zero: list[Tensor | None] | None = None,
    *,
    factors: bool = False,
) -> None:
    """Clear in ``outs`` (the flat keep masks: bool, or float and eligible where ``1``) the
    eligible units of each source ``i`` with a key below ``values[i]``, or equal to it at a
    local flat index below ``stops[i]``.

    Args:
        selection: the selection; its eligibility is ``outs`` themselves (or every unit, where
            a source's eligibility is ``None``).
        values: per source, the cut's key (``-inf``: nothing pruned).
        stops: per source, where the pruned ties end.
        outs: the flat keep masks, updated in place (see :meth:`~.buffers.Worker.clear`).
        zero: per source, a flat tensor multiplied by its new keep mask in the same pass, or
            ``None``.
        factors: whether ``outs`` are keep factors of the selection's eligibility (written in
            full, ``1`` for units not eligible) rather than the eligibility itself.
    """

    def work(worker: Worker, chunks: list[Chunk]) -> None:
        for chunk in chunks:
            # Keep factors: units not eligible have the key inf, so they are kept.
            key = worker.chunk_keys(chunk) if factors else worker.raw_keys(chunk)
            keep = worker.flags(key.device)[: key.numel()]
            for (i, start, _), (_, a, b) in zip(chunk, piece_slices(chunk), strict=True):
                value = values[i]
                if value == -math.inf:
                    keep[a:b].fill_(1)
                    continue
                torch.ge(key[a:b], value, out=keep[a:b])
                tied = min(max(stops[i] - start, 0), b - a)
                if tied:
                    torch.gt(key[a : a + tied], value, out=keep[a : a + tied])
            if factors:
                worker.write(chunk, keep, outs)
            else:
                eligible = None
                if any(selection.eligible[i] is not None for i, _, _ in chunk):
                    scratch = worker.scratch(key.device)[: key.numel()]
                    eligible = worker.eligible_flags(chunk, scratch)
                    keep.mul_(eligible)
                worker.clear(chunk, keep, eligible, outs)
            if zero is not None:
                worker.zero(chunk, keep, zero)

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
            for (i, start, _), (_, a, b) in zip(chunk, piece_slices(chunk), strict=True):
                tied = min(max(stops[i] - start, 0), b - a)
                found = torch.count_nonzero(key[a:b] < values[i])
                if tied:
                    found = found + torch.count_nonzero(key[a : a + tied] == values[i])
                counts[i] = counts[i] + found.to("cpu")
        return counts

    local = [sum(int(part[i]) for part in run_chunks(selection, work)) for i in range(n)]
    return selection.comm.sum(local)
