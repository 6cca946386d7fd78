"""The exact fallbacks: narrow an interval of keys by counting until it can be gathered.

A bad sample or a band swollen by ties lands here. Each counting pass counts the keys below a
few dozen thresholds at once: first the sampled keys inside the interval and their successors
(so a heavily tied ``k``-th key is pinned down in one pass), then a bisection of the keys' bit
patterns (monotone for non-negative floats), which narrows the interval 32-fold per pass.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import tuning
from tensorplay.ao.pruning.selection.floats import from_bits, next_up, to_bits
from tensorplay.ao.pruning.selection.passes import Band, count_below
from tensorplay.ao.pruning.selection.plan import Selection
from tensorplay.ao.pruning.selection.sample import sample_keys

__all__ = ["bounds_after", "narrow", "split_points"]


def bounds_after(
    band: Band, k: int, lo: float, hi: float, dtype: torch.dtype
) -> tuple[float, float]:
    """Keys ``low < high`` with ``F(low) < k <= F(high)`` (``F(t)``: eligible keys below t).

    Args:
        band: the outcome of a fused pass over ``[lo, hi]`` that did not bracket ``k``.
        k: how many eligible units are pruned.
        lo: the band's lower key.
        hi: the band's upper key.
        dtype: the keys' dtype.

    Returns:
        The interval left to search.

    Example:
        >>> bounds_after(Band(below=10), 5, 2.0, 3.0, torch.float32)
        (0.0, 2.0)
    """
    if band.below >= k:
        return 0.0, lo
    if band.overflow:
        return max(lo, 0.0), math.inf
    return next_up(hi, dtype), math.inf


def narrow(
    selection: Selection, k: int, low: float, high: float, *, check: bool = False
) -> tuple[float, float, int, int]:
    """Narrow ``[low, high)`` by counting passes until it holds at most the cap of eligible
    units, or is one value held by more.

    Sharded, the counts are summed over the ranks (one small collective per pass), so every
    rank narrows alike.

    Args:
        selection: the selection.
        k: how many eligible units are pruned.
        low: a key with fewer than ``k`` eligible keys below it.
        high: a key with at least ``k`` eligible keys below it.
        check: whether the first counting pass checks that every eligible score is finite.

    Returns:
        ``(low, high, below, inside)``: the interval, the eligible units below ``low`` and
        inside the interval. Either
        ``[low, high)`` holds at most the cap (gather it: at most the cap in all, but maybe
        all in one thread's share), or ``high`` is ``low``'s successor: the ``k``-th key is
        ``low``, held by more than the cap.
    """
    dtype = selection.keys.dtype
    sample = sample_keys(selection) if selection.keys.reads_scores else None
    while True:
        thresholds = [low, *split_points(low, high, dtype, sample), high]
        counts = selection.comm.sum(count_below(selection, thresholds, check=check))
        check, sample = False, None
        j = next((j for j in range(len(counts) - 1) if counts[j] < k <= counts[j + 1]), None)
        if j is None:
            raise RuntimeError(f"Lost the k-th key between {low} and {high}: please report.")
        low, high = thresholds[j], thresholds[j + 1]
        if counts[j + 1] - counts[j] <= selection.cap or next_up(low, dtype) == high:
            return low, high, counts[j], counts[j + 1] - counts[j]


def split_points(low: float, high: float, dtype: torch.dtype, sample: Tensor | None) -> list[float]:
    """Thresholds strictly inside ``(low, high)``: sampled keys, else a bit-pattern grid.

    Example:
        >>> points = split_points(0.0, 1.0, torch.float32, None)
        >>> len(points), all(0.0 < p < 1.0 for p in points), points == sorted(points)
        (31, True, True)
    """
    points: set[float] = set()
    if sample is not None:
        inside = sample[(sample > low) & (sample < high)]
        if inside.numel():
            quantiles = torch.linspace(0, 1, tuning.THRESHOLDS_PER_PASS // 2, dtype=torch.float64)
            chosen = torch.quantile(inside.double(), quantiles, interpolation="lower").to(dtype)
            points.update(float(v) for v in chosen)
            points.update(next_up(v, dtype) for v in list(points))
    else:
        a, b = to_bits(max(low, 0.0), dtype), to_bits(high, dtype)
        n = tuning.THRESHOLDS_PER_PASS
        points.update(from_bits(a + (b - a) * j // (n + 1), dtype) for j in range(1, n + 1))
    return sorted(p for p in points if low < p < high)
