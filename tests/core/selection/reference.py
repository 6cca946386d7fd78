"""The selection's test harness: the plain concatenate-and-sort oracle, and small constants.

The oracle :func:`keep_masks_reference` is what :func:`~tensorplay.ao.pruning.selection.keep_masks`
must equal on every input; :func:`small_constants` shrinks the tuning constants (tiny chunks,
samples and bands) so that inputs of a few hundred units go through the sampled band, the
fallbacks, the tie pass and the pass's own threads exactly as 200M do.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from unittest import mock

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import AbsKeys, keep_masks, tuning


def keep_masks_reference(
    keys: Sequence[Tensor], eligible: Sequence[Tensor | None], k: int
) -> list[Tensor]:
    """The plain concatenate-and-sort answer of ``keep_masks`` (bool masks).

    Args:
        keys: the keys of every source (already computed, any shapes).
        eligible: per source, its earlier mask or ``None``.
        k: how many eligible units to prune.

    Returns:
        Per source, a bool mask, ``False`` for the ``k`` selected units.

    Example:
        >>> keep_masks_reference([torch.tensor([1.0, 0.0, 0.0])], [None], 1)
        [tensor([ True, False,  True])]
    """
    flat = torch.cat([key.detach().reshape(-1).double().cpu() for key in keys])
    allowed = torch.cat(
        [
            torch.ones(key.numel(), dtype=torch.bool)
            if e is None
            else (e.detach().reshape(-1).cpu() == 1)
            for key, e in zip(keys, eligible, strict=True)
        ]
    )
    order = torch.sort(flat.masked_fill(~allowed, math.inf), stable=True).indices
    keep = torch.ones(flat.numel(), dtype=torch.bool)
    keep[order[:k]] = False
    return [
        part.view(key.shape).to(key.device)
        for part, key in zip(torch.split(keep, [key.numel() for key in keys]), keys, strict=True)
    ]


@contextmanager
def small_constants(chunk: int = 64, sample: int = 48, band: int = 8) -> Iterator[None]:
    """Make every path of the selection reachable with small inputs (threads included)."""
    with mock.patch.multiple(
        tuning,
        CPU_CHUNK=chunk,
        SAMPLE=sample,
        MIN_BAND=band,
        MAX_BAND_FRACTION=0.0,
        TORCH_GRAIN=16,
        GATHER=4,
        RANK_BLOCK=32,
    ):
        yield


def reference(scores: list[Tensor], eligible: list[Tensor | None], k: int) -> list[Tensor]:
    """The oracle's L1 masks: keys ``|score|``."""
    return keep_masks_reference([s.double().abs() for s in scores], eligible, k)


def fast(scores: list[Tensor], eligible: list[Tensor | None], k: int) -> list[Tensor]:
    """The streaming selection's L1 masks, as bool."""
    dtype = torch.float64 if any(s.dtype == torch.float64 for s in scores) else torch.float32
    out = keep_masks(scores, eligible, k, AbsKeys(dtype), [torch.bool] * len(scores))
    return [mask.bool() for mask in out]


def assert_masks_equal(got: list[Tensor], expected: list[Tensor]) -> None:
    """Same number of masks, and each of the same shape and values."""
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape
        assert torch.equal(a.cpu(), b.cpu())
