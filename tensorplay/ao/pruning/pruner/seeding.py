"""Seeded draws of random methods: the same masks on every rank and after a resume.

With a seed, pruning step ``t`` draws from ``seed + t`` in a forked RNG (the CPU's and the
targets' CUDA devices'), so it neither disturbs nor depends on the training RNG.

Example:
    >>> import torch
    >>> with seeded(3, 4, cuda_devices([torch.zeros(1)])):
    ...     first = torch.rand(2)
    >>> with seeded(3, 4, []):
    ...     second = torch.rand(2)
    >>> first.equal(second)
    True
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

__all__ = ["cuda_devices", "seeded"]


def cuda_devices(tensors: Sequence[Tensor]) -> list[int]:
    """The indices of the CUDA devices ``tensors`` live on (none on a CPU)."""
    return sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})


@contextmanager
def seeded(seed: int | None, step: int, devices: Sequence[int]) -> Iterator[None]:
    """Draw from ``seed + step`` in a forked RNG (the CPU's and those of the CUDA ``devices``);
    without a seed, from the global RNG as it is. It holds no tensor: the functional API tells
    other holders of a parameter by its reference count."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=list(devices)):
        torch.manual_seed((seed + step) % 2**64)
        yield
