"""Sources split across the ranks of a process group: where each local piece sits, and the
few small collectives a sharded selection needs (counts, the band's sample and candidates).

A rank holds of every source one contiguous range of the full tensor's flat (row-major) units:
a :class:`ShardLayout`. That is how FSDP2 (``fully_shard``) shards a parameter: a ``DTensor``
on a 1-D device mesh with the placement ``Shard(0)``, whose local tensor is a block of rows.
The DTensor rules live here, once (:func:`is_dtensor`, :func:`check_placement`); the pruner's
glue (:mod:`tensorplay.ao.pruning.selection.shards`) uses them.
Every collective goes through a :class:`Collectives`, which counts what it sends in a
:class:`SelectionCost`; without a process group it is the identity and costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "Collectives",
    "SelectionCost",
    "ShardLayout",
    "check_placement",
    "first_dtensor",
    "first_sharded",
    "fsdp_wrapped_class",
    "global_counts",
    "is_dtensor",
    "local_part",
    "mesh_group",
    "shard_layout",
]

ProcessGroup = dist.ProcessGroup


@dataclass(frozen=True)
class ShardLayout:
    """Where a rank's local piece of a source sits in the full source.

    Attributes:
        numel: the units of the full (global) tensor.
        offset: the global flat (row-major) index of the local piece's first unit; the local
            piece is the contiguous global range ``[offset, offset + local.numel())``.

    Example:
        >>> ShardLayout(numel=12, offset=8)
        ShardLayout(numel=12, offset=8)
    """

    numel: int
    offset: int


@dataclass
class SelectionCost:
    """What one selection cost: bytes received by this rank's collectives, their number, and
    the passes over the local units.

    Example:
        >>> SelectionCost(bytes_communicated=0, collectives=0, passes=2)
        SelectionCost(bytes_communicated=0, collectives=0, passes=2)
    """

    bytes_communicated: int = 0
    collectives: int = 0
    passes: int = 0


def is_dtensor(tensor: object) -> bool:
    """Whether ``tensor`` is a ``DTensor`` (imported only if ``tensor`` has a device mesh).

    Example:
        >>> is_dtensor(torch.zeros(2))
        False
    """
    if not hasattr(tensor, "device_mesh"):
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def first_sharded(model: torch.nn.Module) -> str | None:
    """The name of ``model``'s first ``DTensor`` parameter (sharded, as under FSDP2), else
    ``None``: what a refusal of sharded models names.

    Example:
        >>> first_sharded(torch.nn.Linear(2, 2)) is None
        True
    """
    return next((name for name, param in model.named_parameters() if is_dtensor(param)), None)


def first_dtensor(model: torch.nn.Module) -> tuple[str, bool] | None:
    """The name of ``model``'s first ``DTensor`` parameter, else of its first ``DTensor``
    buffer, and whether it is a parameter (the model is sharded, as under FSDP2); ``None`` for a
    model of plain tensors. One read of everything a copy of the model must know of its
    sharding.

    Example:
        >>> first_dtensor(torch.nn.BatchNorm1d(2)) is None
        True
    """
    for name, param in model.named_parameters():
        if is_dtensor(param):
            return name, True
    for name, buffer in model.named_buffers():
        if is_dtensor(buffer):
            return name, False
    return None


def fsdp_wrapped_class(module: torch.nn.Module) -> type[torch.nn.Module] | None:
    """The class an FSDP2 module (``fully_shard`` makes ``FSDP<cls>(FSDPModule, cls)``) wraps;
    ``None`` for any other module (FSDP is imported only where it already is).

    Example:
        >>> fsdp_wrapped_class(torch.nn.Linear(2, 2)) is None
        True
    """
    import sys

    if "torch.distributed.fsdp" not in sys.modules:
        return None
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        return None
    return next(
        base
        for base in type(module).__mro__[1:]
        if issubclass(base, torch.nn.Module) and not issubclass(base, FSDPModule)
    )


def check_placement(tensor: Tensor, label: str = "the tensor") -> None:
    """The one placement a sharded selection takes: ``Shard(0)`` on a 1-D device mesh.

    That is FSDP2's (``fully_shard``): each rank holds a contiguous block of rows, uneven or
    empty. Any other placement is refused: a replicated tensor, whose every rank holds all of
    it, would have each unit counted once per rank.

    Args:
        tensor: a ``DTensor``.
        label: its name, for the message.

    Raises:
        ValueError: for another placement or a mesh of more than one dimension.
    """
    from torch.distributed.tensor import Shard

    mesh: Any = tensor.device_mesh  # type: ignore[attr-defined]
    placements = tuple(tensor.placements)  # type: ignore[attr-defined]
    if mesh.ndim != 1 or placements != (Shard(0),):
        raise ValueError(
            f"Expected {label} to be a DTensor placed (Shard(dim=0),) on a 1-D device mesh "
            f"(FSDP2's fully_shard), but got placements {placements} on a {mesh.ndim}-D "
            "mesh: replicated or otherwise placed shards would be counted more than once."
        )


def shard_layout(tensor: Tensor, label: str = "the tensor") -> ShardLayout:
    """The layout of this rank's local piece of ``tensor``.

    Args:
        tensor: a plain tensor (the whole source: ``(numel, 0)``), or a ``DTensor`` placed as
            :func:`check_placement` requires (FSDP2's parameters; uneven and empty shards
            included).
        label: its name, for the message.

    Returns:
        The full tensor's units and the global flat index of the local piece's first unit.

    Raises:
        ValueError: for another placement or a mesh of more than one dimension.

    Example:
        >>> shard_layout(torch.zeros(3, 4))
        ShardLayout(numel=12, offset=0)
    """
    if not is_dtensor(tensor):
        return ShardLayout(tensor.numel(), 0)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    check_placement(tensor, label)
    _, offset = compute_local_shape_and_global_offset(
        tensor.shape,
        tensor.device_mesh,  # type: ignore[attr-defined]
        tuple(tensor.placements),  # type: ignore[attr-defined]
    )
    row = tensor.numel() // tensor.shape[0] if tensor.shape[0] else 0
    return ShardLayout(tensor.numel(), offset[0] * row if offset else 0)


def local_part(tensor: Tensor) -> Tensor:
    """A ``DTensor``'s local tensor; any other tensor itself.

    Example:
        >>> t = torch.ones(2)
        >>> local_part(t) is t
        True
    """
    if is_dtensor(tensor):
        return tensor.to_local()  # type: ignore[attr-defined,no-any-return]
    return tensor


def mesh_group(tensors: Sequence[Tensor]) -> ProcessGroup | None:
    """The process group of the ``DTensor``\\ s' 1-D device mesh (``None`` if there are none).

    Raises:
        ValueError: if the ``DTensor``\\ s lie on different meshes.

    Example:
        >>> mesh_group([torch.ones(2)]) is None
        True
    """
    meshes: list[Any] = []
    for tensor in tensors:
        mesh = getattr(tensor, "device_mesh", None)
        if mesh is not None and all(mesh != seen for seen in meshes):
            meshes.append(mesh)
    if not meshes:
        return None
    if len(meshes) > 1:
        raise ValueError(
            f"Expected every DTensor on one device mesh, but got {len(meshes)} meshes: pass "
            "`group` and `shards` explicitly."
        )
    return meshes[0].get_group()  # type: ignore[no-any-return]


def global_counts(local_counts: Sequence[int], group: ProcessGroup | None) -> list[int]:
    """The sums over the ranks of ``group`` of each rank's ``local_counts``.

    One ``all_reduce`` of a small ``int64`` vector; the identity when ``group`` is ``None``.

    Args:
        local_counts: this rank's counts (every rank passes as many).
        group: the process group, or ``None`` (one process).

    Example:
        >>> global_counts([3, 4], None)
        [3, 4]
    """
    return Collectives(group).sum(local_counts)


class Collectives:
    """The collectives of one sharded selection over ``group``, and their cost.

    Without a group every method is the identity on this rank's values and costs nothing.

    Args:
        group: the process group, or ``None``.

    Example:
        >>> comm = Collectives(None)
        >>> comm.sum([1, 2]), comm.gather(torch.arange(3)), comm.cost.collectives
        ([1, 2], tensor([0, 1, 2]), 0)
    """

    def __init__(self, group: ProcessGroup | None) -> None:
        self.group = group
        self.cost = SelectionCost()
        self.world = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)
        self.device = torch.device("cpu")
        if group is not None and dist.get_backend(group) == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())

    def _count(self, tensor: Tensor, copies: int = 1) -> None:
        """Count one collective that leaves ``copies`` of ``tensor`` on this rank."""
        self.cost.collectives += 1
        self.cost.bytes_communicated += copies * tensor.numel() * tensor.element_size()

    def sum(self, values: Sequence[int]) -> list[int]:
        """Each value summed over the ranks (one ``all_reduce`` of ``int64``)."""
        if self.group is None:
            return [int(v) for v in values]
        tensor = torch.tensor([int(v) for v in values], dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor, group=self.group)
        self._count(tensor)
        return [int(v) for v in tensor.tolist()]

    def maximum(self, value: int) -> int:
        """The largest of the ranks' ``value`` (one ``all_reduce``)."""
        if self.group is None:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        self._count(tensor)
        return int(tensor[0])

    def rows(self, values: Sequence[int]) -> list[list[int]]:
        """Every rank's ``values`` (one ``all_gather`` of a small ``int64`` vector)."""
        if self.group is None:
            return [[int(v) for v in values]]
        tensor = torch.tensor([int(v) for v in values], dtype=torch.int64, device=self.device)
        out = [torch.empty_like(tensor) for _ in range(self.world)]
        dist.all_gather(out, tensor, group=self.group)
        self._count(tensor, self.world)
        return [row.tolist() for row in out]

    def gather(self, tensor: Tensor) -> Tensor:
        """Every rank's ``tensor`` (any first dimension), concatenated in rank order.

        Two collectives: the sizes, then the pieces padded to the largest.
        """
        if self.group is None:
            return tensor
        sizes = [row[0] for row in self.rows([tensor.shape[0]])]
        padded = tensor.new_zeros((max(sizes), *tensor.shape[1:]), device=self.device)
        padded[: tensor.shape[0]] = tensor
        out = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(out, padded, group=self.group)
        self._count(padded, self.world)
        return torch.cat([part[:size] for part, size in zip(out, sizes, strict=True)]).to(
            tensor.device
        )
