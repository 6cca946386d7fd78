"""Scores placed like their parameters: compute on this rank's piece, wrap it like the weight.

An FSDP2 parameter is a ``DTensor``; its scores must be one of the same mesh and placements
(:func:`~tensorplay.ao.pruning.dtensor_targets.check_scores`). Elementwise work that DTensor ops
do not cover (bit casts, a plain vector broadcast against a shard) runs on the local piece and
is wrapped back here.

Example:
    >>> import torch
    >>> weight = torch.ones(2, 2)
    >>> like(torch.zeros(2, 2), weight).shape
    torch.Size([2, 2])
"""

from __future__ import annotations

from torch import Tensor

from tensorplay.ao.pruning.selection import is_dtensor, local_part, shard_layout

__all__ = ["like", "local_rows", "piece"]


def piece(tensor: Tensor) -> Tensor:
    """This rank's values of ``tensor`` (itself unless sharded)."""
    return local_part(tensor)


def like(local: Tensor, param: Tensor) -> Tensor:
    """``local`` (of the shape of ``param``'s piece) placed as ``param`` is."""
    if not is_dtensor(param):
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
    if not is_dtensor(param):
        return slice(0, param.shape[0])
    layout = shard_layout(param, label)
    row = param.numel() // param.shape[0] if param.shape[0] else 1
    first = layout.offset // max(row, 1)
    return slice(first, first + local_part(param).shape[0])
