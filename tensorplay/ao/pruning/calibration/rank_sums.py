"""Statistics read on every rank's calibration batches, summed into one.

Under data parallelism each process reads its own batches; a score that sums over tokens must sum
over every rank's tokens too, or the ranks would prune different units.

Example:
    >>> import torch
    >>> summed_over_ranks(torch.tensor([1.0, 2.0]))  # one process: the values themselves
    tensor([1., 2.])
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["summed_over_ranks"]


def summed_over_ranks(values: Tensor) -> Tensor:
    """``values`` summed over the default process group's ranks (``values`` in one process).

    Args:
        values: This rank's statistics, on any device.

    Returns:
        The sum over ranks, on ``values``' device; ``values`` itself is left unchanged.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return values
    reduced = values.clone()
    if dist.get_backend() == "nccl":  # NCCL reduces CUDA tensors only
        reduced = reduced.to(torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(reduced)
    return reduced.to(values.device)
