"""``scope="row"``: each output row of each target is its own comparison group.

A row is one output unit of a layer (:func:`~tensorplay.ao.pruning.targets.layouts.output_axis`: a
row of an ``nn.Linear`` or a convolution's weight, a *column* of Hugging Face's ``Conv1D``); a
tensor of fewer than two dimensions is one group. At a target sparsity ``s`` every row of ``n``
units holds ``round(s * n)`` pruned units afterwards (at most ``n`` minus what ``min_density``
keeps: :func:`~tensorplay.ao.pruning.parity.amount.row_goal`), the row's eligible units of lowest
key pruned
first (:func:`~tensorplay.ao.pruning.selection.clear_lowest_per_row`): exactly what
``torch.nn.utils.prune.l1_unstructured`` applied to each row on its own with ``amount`` equal to
``round(s * n)`` minus the row's pruned units prunes, with a documented tie rule.

FSDP2 shards (``Shard(0)``) hold whole rows when the output axis is 0 (``nn.Linear``): each rank
prunes its own rows, bit-identical to one process. A sharded target whose rows are split
across ranks (a ``Conv1D`` weight, whose rows are columns) is refused before anything changes.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.masking import masking_mode
    >>> from tensorplay.ao.pruning.parity.methods import L1Unstructured
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(4, 2)
    >>> targets = [Target(("weight",), ((layer, "weight"),))]
    >>> mode = masking_mode("reparametrize")
    >>> prune_rows(mode, targets, [layer.weight.detach()], L1Unstructured, 0.5, 0.0)
    >>> layer.weight_mask.sum(dim=1).tolist()
    [2.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from tensorplay.ao.pruning.masking.mode import MaskingMode
from tensorplay.ao.pruning.parity.amount import row_goal
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.method_selection import STREAMING, streaming_keys
from tensorplay.ao.pruning.selection import (
    check_finite_scores,
    clear_lowest_per_row,
    local_part,
    shard_layout,
)
from tensorplay.ao.pruning.selection.shards import is_sharded, sharding_of
from tensorplay.ao.pruning.targets.layouts import output_axis
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["check_sharded_rows", "prune_rows", "row_size"]


def row_size(shape: Sequence[int], axis: int | None) -> int:
    """The units of one row of a tensor of ``shape`` whose rows run along ``axis``.

    Example:
        >>> row_size((8, 3, 2, 2), 0), row_size((4, 6), 1), row_size((5,), None)
        (12, 4, 5)
    """
    numel = 1
    for size in shape:
        numel *= size
    if axis is None:
        return numel
    return numel // shape[axis] if shape[axis] else 0


def check_sharded_rows(targets: Sequence[Target], axes: Sequence[int | None]) -> None:
    """Refuse sharded targets whose rows FSDP2's ``Shard(0)`` splits across ranks.

    Raises:
        ValueError: Naming the tensor and its output axis.
    """
    for target, axis in zip(targets, axes, strict=True):
        if is_sharded(target.parameter()) and axis != 0:
            where = "is one group" if axis is None else f"has its rows along axis {axis}"
            raise ValueError(
                f"Expected the sharded (DTensor) target {target.label} ({target.name!r}) to "
                f"hold whole rows on each rank for scope='row', but it {where} and FSDP2 "
                "shards axis 0, so its rows are split across ranks: exclude it, or use "
                "scope='layerwise' or 'global'."
            )


def prune_rows(
    mode: MaskingMode,
    targets: Sequence[Target],
    scores: Sequence[Tensor],
    method: type[BasePruningMethod],
    target: float,
    min_density: float,
) -> None:
    """Prune every row of ``targets`` to ``target`` sparsity (the module docstring), ranked by
    ``method``'s streaming keys of ``scores``; ``mode`` holds the masks.

    Raises:
        ValueError: A method without streaming keys, a sharded target with split rows, or a
            NaN or infinite eligible score, before anything changes.
    """
    axes = [output_axis(one) for one in targets]
    check_sharded_rows(targets, axes)
    params = [one.parameter() for one in targets]
    labels = [f"{one.label} ({one.name!r})" for one in targets]
    masks = [mode.mask(*one.pair) for one in targets]
    check_finite_scores(
        [local_part(score) for score in scores],
        [None if mask is None else local_part(mask) for mask in masks],
        labels,
    )
    keys = streaming_keys(method, [s.dtype for s in scores], sharding_of(params, labels).group)
    if keys is None:
        names = " or ".join(streaming.name for streaming in STREAMING.values())
        raise ValueError(f"Expected {names} with scope='row', but got {method.__name__}.")
    goals = [
        row_goal(target, row_size(param.shape, axis), min_density)
        for param, axis in zip(params, axes, strict=True)
    ]
    offsets = [
        shard_layout(param, label).offset for param, label in zip(params, labels, strict=True)
    ]

    def clear(index: int, score: Tensor, keep: Tensor) -> None:
        clear_lowest_per_row(
            keys,
            score,
            keep,
            axes[index],
            goals[index],
            source=index,
            offset=offsets[index],
            label=labels[index],
        )

    mode.prune_each(targets, scores, clear)
