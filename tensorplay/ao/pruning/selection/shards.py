"""The pruner's targets that are FSDP2 ``DTensor`` shards: their layout, global counts, values.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) every parameter is a ``DTensor`` placed
``Shard(0)`` on a 1-D device mesh: each rank holds a contiguous block of rows (uneven, possibly
none). The lean pruner keeps such a parameter's mask as a bool ``DTensor`` of the same mesh and
placements (:func:`~tensorplay.ao.pruning.masking.lean_masks.mask_like`), masks and zeroes local
values only, and selects over all ranks with the sharded selection
(:func:`~tensorplay.ao.pruning.selection.clear_lowest`), which is bit-identical to one process
on the full tensors. This module checks what that needs, once per pruning step and before
anything changes (:func:`sharding_of`), and gives the global counts (:func:`global_zeros`).

Every function here that communicates is a collective over the mesh's process group: call it
on every rank, in the same order (the pruner's ``step``, ``report``, ``pruned_count`` and
``sparsity`` are such calls under FSDP2).

Example:
    >>> import torch
    >>> sharding_of([torch.zeros(2, 3)], ["(Linear, 'weight')"])
    Sharding(shards=None, group=None)
    >>> global_zeros([torch.tensor([True, False, False])])
    [2]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from tensorplay.ao.pruning.selection import (
    ShardLayout,
    check_placement,
    global_counts,
    local_part,
    shard_layout,
)
from tensorplay.ao.pruning.selection import is_dtensor as is_sharded
from tensorplay.ao.pruning.selection.checks import count_zeros

__all__ = [
    "Sharding",
    "check_scores",
    "global_zeros",
    "is_sharded",
    "local_rows",
    "local_values",
    "placed_like",
    "shared_seed",
    "sharding_of",
    "sum_over_ranks",
]

ProcessGroup = dist.ProcessGroup


@dataclass(frozen=True)
class Sharding:
    """How a pruning step's sources are spread over ranks.

    Attributes:
        shards: per source, where this rank's local piece sits in the full tensor; ``None``
            for plain tensors (every rank, if any, holds them whole).
        group: the process group of the sources' device mesh; ``None`` for plain tensors.

    Example:
        >>> Sharding(None, None).group is None
        True
    """

    shards: list[ShardLayout] | None
    group: ProcessGroup | None


def sharding_of(params: Sequence[Tensor], labels: Sequence[str]) -> Sharding:
    """The sharding of ``params`` (one pruning step's targets), checked.

    Either every parameter is a plain tensor, or every one is a ``DTensor`` placed ``Shard(0)``
    on one 1-D device mesh (FSDP2's ``fully_shard``; uneven and empty shards included).

    Args:
        params: the targets' parameters.
        labels: their names, for the messages.

    Raises:
        ValueError: a mix of plain tensors and ``DTensor``\\ s, a placement other than
            ``Shard(0)`` on a 1-D mesh (``Replicate()`` included: every rank would count the
            same units), or ``DTensor``\\ s on different meshes; naming the tensor.

    Example:
        >>> import torch
        >>> sharding_of([torch.zeros(2), torch.zeros(3)], ["a", "b"]).shards is None
        True
    """
    sharded = [is_sharded(p) for p in params]
    if not any(sharded):
        return Sharding(None, None)
    if not all(sharded):
        plain = labels[sharded.index(False)]
        dtensor = labels[sharded.index(True)]
        raise ValueError(
            f"Expected every target to be a DTensor when {dtensor} is one, but got a plain "
            f"tensor for {plain}: shard every pruned module (fully_shard), or exclude {plain}."
        )
    groups = []
    for param, label in zip(params, labels, strict=True):
        check_placement(param, label)
        mesh: Any = param.device_mesh  # type: ignore[attr-defined]
        groups.append(mesh.get_group())
        if groups[-1] != groups[0]:
            raise ValueError(
                f"Expected every target sharded over one process group, but {label} and "
                f"{labels[0]} lie on device meshes of different groups: prune the tensors of "
                "each group with a pruner of their own."
            )
    return Sharding([shard_layout(p) for p in params], groups[0])


def check_scores(score: Tensor, param: Tensor, label: str) -> None:
    """Scores of a sharded ``param`` must be a ``DTensor`` placed like it.

    Args:
        score: what ``importance_fn`` returned (of ``param``'s global shape, checked before).
        param: the target's parameter, a ``DTensor``.
        label: the target's name, for the message.

    Raises:
        ValueError: ``score`` is a plain tensor, or a ``DTensor`` on another mesh or with other
            placements.

    Example:
        >>> import torch
        >>> check_scores(torch.ones(2), torch.ones(2), "w")  # plain parameters: nothing to check
    """
    if not is_sharded(param):
        return
    mesh: Any = param.device_mesh  # type: ignore[attr-defined]
    placements = tuple(param.placements)  # type: ignore[attr-defined]
    if is_sharded(score):
        got_mesh: Any = score.device_mesh  # type: ignore[attr-defined]
        got = tuple(score.placements)  # type: ignore[attr-defined]
        if got_mesh == mesh and got == placements:
            return
        what = f"a DTensor placed {got} on {got_mesh}"
    else:
        what = "a plain tensor"
    raise ValueError(
        f"Expected `importance_fn` to return a DTensor placed {placements} on {mesh} for the "
        f"sharded {label} (compute it from the DTensor parameter and its gradient), but got "
        f"{what}."
    )


def global_zeros(tensors: Sequence[Tensor | None]) -> list[int]:
    """The zeros of each tensor over all ranks: each ``DTensor``'s local zeros summed over its
    mesh's process group (one ``all_reduce`` of a small vector per group), plain tensors
    counted as they are (0 for ``None``).

    Example:
        >>> import torch
        >>> global_zeros([torch.tensor([0.0, 1.0]), None])
        [1, 0]
    """
    counts = count_zeros([None if t is None else local_part(t) for t in tensors])
    return sum_over_ranks(counts, tensors)


def sum_over_ranks(counts: Sequence[int], tensors: Sequence[Tensor | None]) -> list[int]:
    """Each count summed over the ranks that hold a piece of its tensor: a ``DTensor``'s over
    its mesh's process group (one ``all_reduce`` of a small vector per group), the others as
    they are.

    Example:
        >>> import torch
        >>> sum_over_ranks([3, 1], [torch.zeros(2), None])
        [3, 1]
    """
    counts = list(counts)
    by_group: dict[ProcessGroup, list[int]] = {}  # in first-seen order: the same on every rank
    for index, tensor in enumerate(tensors):
        if tensor is not None and is_sharded(tensor):
            group = tensor.device_mesh.get_group()  # type: ignore[attr-defined]
            by_group.setdefault(group, []).append(index)
    for group, indices in by_group.items():
        totals = global_counts([counts[i] for i in indices], group)
        for index, total in zip(indices, totals, strict=True):
            counts[index] = total
    return counts


def shared_seed(seed: int, group: ProcessGroup | None) -> int:
    """Rank zero's ``seed`` on every rank of ``group`` (one ``broadcast``); itself without a
    group.

    Example:
        >>> shared_seed(7, None)
        7
    """
    if group is None:
        return seed
    value = torch.tensor([seed], dtype=torch.int64)
    if dist.get_backend(group) == "nccl":
        value = value.cuda()
    dist.broadcast(value, src=dist.get_global_rank(group, 0), group=group)
    return int(value.item())


def local_values(value: Tensor, param: Tensor) -> Tensor:
    """The part of ``value`` (of ``param``'s global shape) that ``param``'s local piece holds:
    a ``DTensor``'s local tensor, or for a plain ``value`` and a sharded ``param`` the rows of
    this rank's shard.

    Example:
        >>> import torch
        >>> value = torch.arange(4.0)
        >>> local_values(value, torch.zeros(4)) is value
        True
    """
    if is_sharded(value) or not is_sharded(param):
        return local_part(value)
    piece = local_part(param)
    start = shard_layout(param).offset
    return value.reshape(-1)[start : start + piece.numel()].view(piece.shape)


def placed_like(local: Tensor, param: Tensor) -> Tensor:
    """``local`` (of the shape of ``param``'s local piece) placed as ``param`` is: wrapped in a
    ``DTensor`` of its mesh and placements if ``param`` is sharded, else itself. For
    elementwise work DTensor ops do not cover (bit casts, a plain vector broadcast against a
    shard), done on the local piece.

    Example:
        >>> import torch
        >>> local = torch.zeros(2, 2)
        >>> placed_like(local, torch.ones(2, 2)) is local
        True
    """
    if not is_sharded(param):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local,
        param.device_mesh,  # type: ignore[attr-defined]
        param.placements,  # type: ignore[attr-defined]
        shape=param.shape,
        stride=param.stride(),
    )


def local_rows(param: Tensor, label: str) -> slice:
    """The indices along axis 0 that this rank's piece of ``param`` holds (all unless sharded).

    Example:
        >>> import torch
        >>> local_rows(torch.zeros(3, 2), "w")
        slice(0, 3, None)
    """
    if not is_sharded(param):
        return slice(0, param.shape[0])
    layout = shard_layout(param, label)
    row = param.numel() // param.shape[0] if param.shape[0] else 1
    first = layout.offset // max(row, 1)
    return slice(first, first + local_part(param).shape[0])
