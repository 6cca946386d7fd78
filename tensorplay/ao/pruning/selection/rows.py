"""Per-row selection (``scope="row"``): within each row, prune the units of lowest key.

Each row (an output unit: see :mod:`~tensorplay.ao.pruning.targets.layouts`) is its own comparison
group with its own exact count: after the call every row holds at least ``goal`` pruned units,
the eligible units (``keep`` is ``True``) of lowest key pruned first. A row with ``goal`` or
more pruned already is left as it is. Ties follow the rule of the global selection restricted
to one row: among equal keys the lower index along the row (in the row-major order of the
other axes) is pruned first.

Rows are sorted a block at a time, so the memory beyond the keys of the tensor is a few
megabytes, whatever its size.

Example:
    >>> import torch
    >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
    >>> keep = torch.ones(2, 3, dtype=torch.bool)
    >>> scores = torch.tensor([[3.0, -1.0, 2.0], [1.0, 1.0, 5.0]])
    >>> clear_lowest_per_row(AbsKeys(), scores, keep, axis=0, goal=1)
    >>> keep.int().tolist()
    [[1, 0, 1], [0, 1, 1]]
"""

from __future__ import annotations

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection.checks import check_finite_scores
from tensorplay.ao.pruning.selection.keys import KeySpec

__all__ = ["clear_lowest_per_row"]

#: Units sorted at once: the temporaries of a block are a few MiB.
_BLOCK_UNITS = 1 << 20


def clear_lowest_per_row(
    keys: KeySpec,
    scores: Tensor,
    keep: Tensor,
    axis: int | None,
    goal: int,
    *,
    source: int = 0,
    offset: int = 0,
    label: str = "the tensor",
) -> None:
    """Clear bits of the bool mask ``keep`` so that each row holds ``goal`` pruned units.

    Args:
        keys: How a unit's key follows from its score (``AbsKeys``: the L1 order,
            :class:`~tensorplay.ao.pruning.selection.keys.UniformKeys`: the random one).
        scores: The scores, of ``keep``'s shape (a sharded tensor's local piece).
        keep: The bool mask: ``True`` units are eligible, cleared ones are pruned.
        axis: The axis whose indices are the rows; ``None``: the whole tensor is one row.
        goal: The units each row holds pruned afterwards (at least: none is revived).
        source: The source index, for random keys.
        offset: The global flat index of ``scores``' first unit (a shard), for random keys.
        label: The tensor's name, for messages.

    Raises:
        ValueError: An eligible score that is NaN or infinite, naming ``label``.
    """
    if goal <= 0 or keep.numel() == 0:
        return
    check_finite_scores([scores], [keep], [label])
    flat = torch.empty(scores.numel(), dtype=keys.dtype, device=keep.device)
    flat = keys.chunk_keys(source, offset, scores.detach().reshape(-1).to(keep.device), flat)
    # Pruned units rank first (every key is >= 0), so a row's first `goal` are the ones pruned.
    flat.masked_fill_(~keep.reshape(-1), -1.0)
    moved = flat.view(keep.shape) if axis is None else flat.view(keep.shape).movedim(axis, 0)
    rows = moved.reshape(1, -1) if axis is None else moved.reshape(moved.shape[0], -1)
    kept = keep.reshape(1, -1) if axis is None else keep.movedim(axis, 0).reshape(rows.shape)
    width = rows.shape[1]
    goal = min(goal, width)
    step = max(1, _BLOCK_UNITS // max(width, 1))
    for first in range(0, rows.shape[0], step):
        block = rows[first : first + step]
        order = torch.sort(block, dim=1, stable=True).indices[:, :goal]
        kept[first : first + step].scatter_(1, order, False)
    if axis is None:
        if kept.data_ptr() != keep.data_ptr():
            keep.copy_(kept.view(keep.shape))
        return
    target = keep.movedim(axis, 0)
    if kept.data_ptr() != target.data_ptr() or not target.is_contiguous():
        target.copy_(kept.view(target.shape))
