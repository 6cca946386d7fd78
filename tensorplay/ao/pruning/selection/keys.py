"""Keys: how the order in which units are pruned follows from their scores.

A :class:`KeySpec` turns a chunk of scores into keys (non-negative, not NaN); the ``k`` eligible
units of lowest key are pruned. :class:`AbsKeys` gives the L1 order, :class:`UniformKeys` the
random one (generated per block of the source, so the global RNG is never touched).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["AbsKeys", "KeySpec", "UniformKeys"]


class KeySpec:
    """How the key of every unit is computed from its score (a chunk at a time).

    Subclasses define :meth:`chunk_keys` (elementwise from the scores, or generated) and
    :meth:`guess_band` (two keys whose ranks likely bracket a quantile). Keys must be
    non-negative, not NaN.

    Example:
        >>> class SquareKeys(KeySpec):
        ...     def chunk_keys(self, source, start, scores, out):
        ...         return torch.mul(scores, scores, out=out)
        >>> SquareKeys().chunk_keys(0, 0, torch.tensor([-2.0, 1.0]), torch.empty(2))
        tensor([4., 1.])
    """

    dtype: torch.dtype = torch.float32
    reads_scores: bool = True

    def chunk_keys(self, source: int, start: int, scores: Tensor, out: Tensor) -> Tensor:
        """Write the keys of ``scores`` (a chunk of ``source`` starting at ``start``) to ``out``.

        Args:
            source: index of the source.
            start: flat index of the chunk's first unit in the source.
            scores: the chunk of scores, flat.
            out: a buffer of ``scores.numel()`` units of :attr:`dtype` on ``scores``' device.

        Returns:
            The keys (``out`` itself, or a view of it).
        """
        raise NotImplementedError

    def sample_keys(self, scores: Tensor, index: Tensor) -> Tensor:
        """Keys of the units at the flat ``index`` of one source's flat ``scores``.

        Args:
            scores: the flat scores of one source.
            index: flat indices on ``scores``' device.

        Returns:
            The keys, of :attr:`dtype`.
        """
        raise NotImplementedError


class AbsKeys(KeySpec):
    """Keys ``|score|`` (the :class:`~tensorplay.ao.pruning.L1Unstructured` order).

    Args:
        dtype: the floating dtype all keys are compared in; choose one that holds every score
            exactly (``float32`` for fp16/bf16/fp32 scores).

    Example:
        >>> AbsKeys().chunk_keys(0, 0, torch.tensor([-2.0, 1.0]), torch.empty(2))
        tensor([2., 1.])
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype

    def chunk_keys(self, source: int, start: int, scores: Tensor, out: Tensor) -> Tensor:
        """Write ``|scores|`` in :attr:`dtype` to ``out`` (see :meth:`KeySpec.chunk_keys`)."""
        if scores.dtype == out.dtype:
            return torch.abs(scores, out=out)
        return torch.abs(out.copy_(scores), out=out)

    def sample_keys(self, scores: Tensor, index: Tensor) -> Tensor:
        """``|scores[index]|`` in :attr:`dtype` (see :meth:`KeySpec.sample_keys`)."""
        # index_select: a few times faster than advanced indexing for a scattered gather.
        return scores.index_select(0, index).to(self.dtype).abs()


class UniformKeys(KeySpec):
    """Keys drawn uniformly from ``[0, 1)`` (the :class:`RandomUnstructured` order).

    A unit's key is a function of ``seed``, its source and its global flat index only: the
    units of a source are cut into fixed blocks of :attr:`BLOCK`, each drawn in full from its
    own generator seeded from ``(seed, source, block)``. A chunk draws the blocks it overlaps
    and keeps its part, so neither the chunk size nor how a source is sharded across ranks
    changes a key, and the global RNG is never touched.

    Args:
        seed: the base seed (``global_unstructured`` draws it once from the global RNG, so
            ``torch.manual_seed`` makes the result reproducible).

    Example:
        >>> keys = UniformKeys(seed=1)
        >>> whole = keys.chunk_keys(0, 0, torch.zeros(6), torch.empty(6))
        >>> tail = keys.chunk_keys(0, 4, torch.zeros(2), torch.empty(2))
        >>> bool(torch.equal(whole[4:], tail))
        True
    """

    reads_scores = False
    #: Units per block: large enough that seeding a generator costs nothing per unit.
    BLOCK = 1 << 16

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def chunk_keys(self, source: int, start: int, scores: Tensor, out: Tensor) -> Tensor:
        """Draw the keys of global units ``[start, start + out.numel())`` into ``out``
        (see :meth:`KeySpec.chunk_keys`)."""
        block = self.BLOCK
        stop = start + out.numel()
        generator = torch.Generator(device=out.device)
        spare: Tensor | None = None
        for first in range(start - start % block, stop, block):
            generator.manual_seed(hash((self.seed, source, first // block)) & ((1 << 63) - 1))
            a, b = max(start, first), min(stop, first + block)
            if a == first and b == first + block:  # the whole block: straight into out
                torch.rand(block, generator=generator, out=out[a - start : b - start])
                continue
            if spare is None:
                spare = torch.empty(block, dtype=out.dtype, device=out.device)
            torch.rand(block, generator=generator, out=spare)
            out[a - start : b - start].copy_(spare[a - first : b - first])
        return out
