"""Clearing bits of the caller's bool keep masks in place, locally or across ranks.

The cut is :func:`~.cut.find_cut`'s, the band pass clearing on the way the units certainly
pruned (:class:`~.scans.Certain`: the scores are read twice, the masks and the tensors to zero
written once); :func:`~.write.apply_cut` finishes the masks. Memory beyond the masks: chunk
buffers and the band's candidates. With a process group each rank passes its local pieces;
counts are summed, candidates narrowed by counting collectives and the last few gathered, and
each rank writes only its own pieces.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection.capped import SubsetKeys, settle_caps
from tensorplay.ao.pruning.selection.checks import count_eligible
from tensorplay.ao.pruning.selection.cut import find_cut, local_stops
from tensorplay.ao.pruning.selection.keys import KeySpec
from tensorplay.ao.pruning.selection.passes import check_pass
from tensorplay.ao.pruning.selection.plan import Selection, chunk_size
from tensorplay.ao.pruning.selection.scans import Certain
from tensorplay.ao.pruning.selection.sharding import (
    Collectives,
    ProcessGroup,
    SelectionCost,
    ShardLayout,
    local_part,
    mesh_group,
    shard_layout,
)
from tensorplay.ao.pruning.selection.threads import own_threads, run_on_own_thread
from tensorplay.ao.pruning.selection.write import apply_cut, count_cut, write_cut

__all__ = ["clear_lowest", "clear_lowest_capped"]

# Per source: the cut's key, and the local flat index below which its ties are pruned.
SourceCut = tuple[float, int]


def clear_lowest(
    scores: Sequence[Tensor],
    keep: Sequence[Tensor],
    k: int,
    keys: KeySpec,
    *,
    labels: Sequence[str] | None = None,
    shards: Sequence[ShardLayout] | None = None,
    group: ProcessGroup | None = None,
    n_eligible: int | None = None,
    zero: Sequence[Tensor | None] | None = None,
) -> SelectionCost:
    """Set to ``False`` the ``k`` units of lowest key among those whose ``keep`` is ``True``
    (or, in a float mask, to ``0`` among those that are ``1``).

    Across all sources and, with ``group``, across all ranks of the group: each rank passes
    its local pieces (or ``DTensor``\\ s, whose local tensors are used), every rank calls with
    the same sources in the same order, and ``k`` and ``n_eligible`` are global. Tie rule as
    :func:`~.masks.keep_masks`: ``(key, source index, global flat index)``. No output mask is
    allocated; the result is bit-identical to one process selecting on the full tensors.

    Args:
        scores: the sources' scores (local pieces), any shapes, dtypes and devices.
        keep: per source, its keep mask of the scores' shape, contiguous, updated in place:
            bool (``True``: eligible), or floating (a ``torch.nn.utils.prune`` mask: eligible
            where ``1``; the units pruned become ``0``, any other value stays).
        k: how many eligible units to clear, ``0 <= k <= eligible units`` (over all ranks).
        keys: how keys follow from scores (:class:`~.keys.AbsKeys`, :class:`~.keys.UniformKeys`).
        labels: names of the sources for error messages (default: ``source <index>``).
        shards: where each local piece sits in its full source (default: from each score,
            :func:`~.sharding.shard_layout`).
        group: the process group the sources are sharded over; ``None``: the group of the
            ``DTensor`` scores' device mesh, if any, else one process.
        n_eligible: the eligible units over all ranks, if the caller has counted them; if
            that is every unit of the sources, the masks are known to be all ``True`` and are
            not read.
        zero: per source, a tensor of its scores' shape (or ``None``), multiplied in place by
            the source's final keep mask in the same passes (the weights, zeroed where
            pruned: the same values as ``tensor.mul_(mask)`` after the call, without the pass
            over the tensors that costs).

    Returns:
        What the call cost: bytes received by collectives, their number, passes over the units.

    Raises:
        ValueError: if the masks do not fit the scores, an eligible key is NaN or infinite (the
            message names the source; on the other ranks it says another rank has one), or
            ``k`` is out of range. Nothing is changed then.

    Example:
        >>> from tensorplay.ao.pruning.selection import AbsKeys
        >>> scores = [torch.tensor([0.5, -0.1, 2.0]), torch.tensor([[0.1, 3.0]])]
        >>> keep = [torch.tensor([True, True, False]), torch.ones(1, 2, dtype=torch.bool)]
        >>> cost = clear_lowest(scores, keep, 2, AbsKeys())
        >>> keep[0], keep[1], cost.collectives
        (tensor([ True, False, False]), tensor([[False,  True]]), 0)
    """
    selection = _selection(scores, keep, keys, labels, shards, group)
    targets, late = _zero_targets(selection, zero)
    if n_eligible is None:
        n_eligible = _count_eligible(selection)
    if not 0 <= k <= n_eligible:
        raise ValueError(
            f"Expected `k` to be between 0 and the {n_eligible} eligible units, but got {k}."
        )
    selection.threads = own_threads(selection.cpu_units)
    flat = [e for e in selection.eligible if e is not None]
    if n_eligible == selection.units:  # every mask is all True: no need to read them
        selection.eligible = [None] * len(flat)
    run_on_own_thread(selection.threads, lambda: _clear(selection, k, n_eligible, flat, targets))
    _zero_late(late, flat)
    return _cost(selection)


def _clear(
    selection: Selection,
    k: int,
    n_eligible: int,
    flat: list[Tensor],
    zero: list[Tensor | None],
) -> None:
    """Clear the ``k`` lowest eligible units of ``selection`` in its masks ``flat`` and zero
    them in ``zero``: the band pass clears the units certainly pruned (:class:`~.scans.Certain`),
    then the cut's few candidates, or a pass at the cut, finish the masks."""
    if k in (0, n_eligible):  # nothing, or every eligible unit: no cut to find
        check_pass(selection)
        if k:
            for mask in flat:
                _clear_every_eligible(mask)
            selection.passes += 1
        _zero_late([(t, i) for i, t in enumerate(zero) if t is not None], flat)
        return
    cut = find_cut(selection, k, n_eligible, Certain(flat, zero))
    apply_cut(selection, cut, flat, zero)


def _clear_every_eligible(mask: Tensor) -> None:
    """Clear every eligible unit of a flat mask: all of a bool one, the ``1`` of a float one."""
    if mask.dtype == torch.bool:
        mask.fill_(False)
        return
    for piece in torch.split(mask, chunk_size(mask.device)):
        piece.masked_fill_(piece == 1, 0)


def _zero_targets(
    selection: Selection, zero: Sequence[Tensor | None] | None
) -> tuple[list[Tensor | None], list[tuple[Tensor, int]]]:
    """Flat views of the local tensors to zero along the passes, and those that cannot be
    (not contiguous: zeroed by one multiply at the end) with their source index."""
    n = len(selection.sizes)
    if zero is None:
        return [None] * n, []
    if len(zero) != n:
        raise ValueError(
            f"Expected one tensor (or None) to zero per source ({n}), but got {len(zero)}."
        )
    targets: list[Tensor | None] = []
    late: list[tuple[Tensor, int]] = []
    for i, (tensor, score, name) in enumerate(
        zip(zero, selection.scores, selection.labels, strict=True)
    ):
        local = None if tensor is None else local_part(tensor).detach()
        if local is not None and local.numel() != score.numel():
            raise ValueError(
                f"Expected the tensor to zero of {name} to have {score.numel()} local units, "
                f"but got a tensor of shape {tuple(local.shape)}."
            )
        if local is not None and not local.is_contiguous():
            late.append((local, i))
            local = None
        targets.append(None if local is None else local.view(-1))
    return targets, late


def _zero_late(late: list[tuple[Tensor, int]], flat: list[Tensor]) -> None:
    """Multiply each tensor by its source's keep mask (one pass each)."""
    for tensor, i in late:
        tensor.mul_(flat[i].view(tensor.shape))


def clear_lowest_capped(
    scores: Sequence[Tensor],
    keep: Sequence[Tensor],
    k: int,
    keys: KeySpec,
    caps: Sequence[int],
    *,
    labels: Sequence[str] | None = None,
    shards: Sequence[ShardLayout] | None = None,
    group: ProcessGroup | None = None,
    zero: Sequence[Tensor | None] | None = None,
) -> SelectionCost:
    """:func:`clear_lowest` with at most ``caps[i]`` units cleared in source ``i``: the greedy
    result of :func:`~.capped.capped_keep_masks` (lowest key first, skipping sources at their
    cap), found with a few uncapped cuts and written in one pass.

    Args:
        scores: the sources' scores (local pieces).
        keep: per source, its bool keep mask, updated in place.
        k: how many units to clear, at most the sum of the caps.
        keys: how keys follow from scores.
        caps: per source, the most units it may give (at most its eligible units; global).
        labels: names of the sources for error messages.
        shards: where each local piece sits in its full source.
        group: the process group the sources are sharded over (default as
            :func:`clear_lowest`).
        zero: per source, a tensor multiplied in place by its final keep mask in the
            writing pass, or ``None`` (as :func:`clear_lowest`).

    Returns:
        What the call cost.

    Raises:
        ValueError: as :func:`clear_lowest`, or if ``k`` is over the sum of the caps.

    Example:
        >>> from tensorplay.ao.pruning.selection import AbsKeys
        >>> keep = [torch.ones(3, dtype=torch.bool), torch.ones(2, dtype=torch.bool)]
        >>> _ = clear_lowest_capped(
        ...     [torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 0.6])], keep, 3, AbsKeys(),
        ...     caps=[1, 5],
        ... )
        >>> [mask.tolist() for mask in keep]
        [[False, True, True], [False, False]]
    """
    whole = _selection(scores, keep, keys, labels, shards, group)
    if len(caps) != len(whole.sizes):
        raise ValueError(
            f"Expected one cap per source ({len(whole.sizes)}), but got {len(caps)} caps."
        )
    targets, late = _zero_targets(whole, zero)
    whole.threads = own_threads(whole.cpu_units)

    def select(sources: list[int], count: int) -> list[tuple[SourceCut, int]]:
        part = Selection(
            [whole.scores[i] for i in sources],
            [whole.eligible[i] for i in sources],
            SubsetKeys(whole.keys, sources),
            [],
            [whole.labels[i] for i in sources],
            [whole.layouts[i] for i in sources],
            whole.comm,
        )
        part.threads = whole.threads
        available = _count_eligible(part)
        if count >= available:  # the whole subset: its cut is past every key
            cuts = [(math.inf, 0)] * len(sources)
            check_pass(part)
            whole.passes += part.passes
            return [(cut, n) for cut, n in zip(cuts, _per_source_eligible(part), strict=True)]
        cut = find_cut(part, count, available)
        stops = local_stops(part, cut.order)
        given = count_cut(part, [cut.value] * len(sources), stops)
        whole.passes += part.passes
        return [((cut.value, stop), n) for stop, n in zip(stops, given, strict=True)]

    def run() -> None:
        settled = settle_caps(select, k, caps, given=lambda result: result[1])
        cuts = [settled[i][0] if i in settled else (-math.inf, 0) for i in range(len(caps))]
        flat = [e for e in whole.eligible if e is not None]
        write_cut(whole, [c[0] for c in cuts], [c[1] for c in cuts], flat, targets)

    run_on_own_thread(whole.threads, run)
    _zero_late(late, [e for e in whole.eligible if e is not None])
    return _cost(whole)


def _selection(
    scores: Sequence[Tensor],
    keep: Sequence[Tensor],
    keys: KeySpec,
    labels: Sequence[str] | None,
    shards: Sequence[ShardLayout] | None,
    group: ProcessGroup | None,
) -> Selection:
    """The selection over the local pieces, after checking that the masks fit the scores."""
    names = list(labels) if labels else [f"source {i}" for i in range(len(scores))]
    layouts = list(shards) if shards is not None else [shard_layout(s) for s in scores]
    if not len(scores) == len(keep) == len(layouts) == len(names):
        raise ValueError(
            f"Expected as many keep masks, shard layouts and labels as sources ({len(scores)}), "
            f"but got {len(keep)}, {len(layouts)} and {len(names)}."
        )
    pieces = [local_part(s).detach() for s in scores]
    masks = [local_part(m) for m in keep]
    for score, mask, layout, name in zip(pieces, masks, layouts, names, strict=True):
        kind_ok = mask.dtype == torch.bool or mask.is_floating_point()
        if not kind_ok or mask.shape != score.shape or not mask.is_contiguous():
            raise ValueError(
                f"Expected the keep mask of {name} to be a contiguous bool or floating tensor "
                f"of shape {tuple(score.shape)}, but got a {mask.dtype} tensor of shape "
                f"{tuple(mask.shape)} (contiguous: {mask.is_contiguous()})."
            )
        if mask.device != score.device:
            raise ValueError(
                f"Expected the keep mask of {name} on {score.device}, but got {mask.device}."
            )
        if not 0 <= layout.offset <= layout.offset + score.numel() <= layout.numel:
            raise ValueError(
                f"Expected the local piece of {name} ({score.numel()} units) to lie inside its "
                f"full source, but got {layout}."
            )
    if group is None and shards is None:
        group = mesh_group(scores)
    return Selection(pieces, masks, keys, [], names, layouts, Collectives(group))


def _count_eligible(selection: Selection) -> int:
    """The eligible units of a selection over all ranks (one pass over the masks)."""
    selection.passes += 1
    return selection.comm.sum([count_eligible(selection.eligible, selection.sizes)])[0]


def _per_source_eligible(selection: Selection) -> list[int]:
    """Per source, its eligible units over all ranks."""
    local = [
        count_eligible([e], [n]) for e, n in zip(selection.eligible, selection.sizes, strict=True)
    ]
    return selection.comm.sum(local)


def _cost(selection: Selection) -> SelectionCost:
    """The cost of a finished selection: its collectives and passes."""
    cost = selection.comm.cost
    return SelectionCost(cost.bytes_communicated, cost.collectives, selection.passes)
