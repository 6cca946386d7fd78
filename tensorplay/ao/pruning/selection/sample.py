"""The band guess: a seeded sample of keys gives two keys whose ranks very likely bracket ``k``.

A private :class:`torch.Generator` draws the sample, so the global RNG is untouched. For uniform
random keys the band follows from the quantile directly.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import tuning
from tensorplay.ao.pruning.selection.floats import largest
from tensorplay.ao.pruning.selection.plan import Selection

__all__ = ["guess_band", "sample_keys"]


def guess_band(selection: Selection, k: int, n_eligible: int) -> tuple[float, float]:
    """Two keys ``lo <= hi`` whose ranks among the eligible units very likely bracket ``k``.

    Args:
        selection: the selection.
        k: how many eligible units are pruned.
        n_eligible: the number of eligible units.

    Returns:
        ``(lo, hi)``; a wrong guess costs a counting pass, never exactness.
    """
    q = k / n_eligible
    if not selection.keys.reads_scores:  # uniform keys: the quantile is the key
        width = tuning.SIGMAS * math.sqrt(q * (1 - q) / n_eligible) + 2 / math.sqrt(n_eligible)
        return max(q - width, 0.0), min(q + width, 1.0)
    sample = sample_keys(selection)
    size = sample.numel()
    if size < 64:
        return -math.inf, largest(selection.keys.dtype)
    width = tuning.SIGMAS * math.sqrt(max(q * (1 - q), 1 / size) / size) + 2 / size
    lo_rank, hi_rank = math.floor((q - width) * size), math.ceil((q + width) * size)
    # Two order statistics: a linear-time selection each, no sort of the sample.
    lo = float(torch.kthvalue(sample, lo_rank + 1).values) if lo_rank >= 0 else -math.inf
    hi = (
        float(torch.kthvalue(sample, hi_rank + 1).values)
        if hi_rank < size
        else largest(selection.keys.dtype)
    )
    return lo, hi


def sample_keys(selection: Selection) -> Tensor:
    """Keys of eligible units at seeded uniform positions (on the CPU, a few thousand).

    The positions are drawn among the units of the full sources; sharded, each rank reads the
    keys at the positions of its local pieces and the pieces are gathered, so every rank gets
    the sample one process would (in another order).

    Args:
        selection: the selection.

    Returns:
        The sampled keys, of the keys' dtype, on the CPU.
    """
    positions = _sample_positions(selection.units)
    bases = torch.tensor([0, *(layout.numel for layout in selection.layouts)]).cumsum(0)
    parts = []
    for i, layout in enumerate(selection.layouts):
        start = int(bases[i]) + layout.offset
        lo, hi = torch.searchsorted(
            positions, torch.tensor([start, start + selection.sizes[i]])
        ).tolist()
        if hi == lo:
            continue
        scores = selection.scores[i]
        index = (positions[lo:hi] - start).to(scores.device)
        key = selection.keys.sample_keys(scores, index)
        eligible = selection.eligible[i]
        if eligible is not None:
            key = key[eligible.index_select(0, index) == 1]
        parts.append(key.cpu())
    local = torch.cat(parts) if parts else torch.empty(0, dtype=selection.keys.dtype)
    return selection.comm.gather(local)


def _sample_positions(total: int) -> Tensor:
    """Sorted seeded uniform flat positions among ``total`` units, one per stratum."""
    generator = torch.Generator().manual_seed(tuning.SAMPLE_SEED)
    # Big enough that the band (about 9 standard deviations of the sampled quantile, that is
    # 4.5 / sqrt(size) of the units) is well below the most candidates a pass may gather.
    cap = tuning.band_cap(total)
    size = min(tuning.SAMPLE, total, max(1 << 12, math.ceil((12 * total / cap) ** 2)))
    # Stratified: one uniform position in each of `size` equal strata, so sorted without a
    # sort (and a lower variance than independent positions, with no periodic pattern).
    jitter = torch.rand(size, dtype=torch.float64, generator=generator)
    strata = torch.arange(size, dtype=torch.float64).add_(jitter)
    return strata.mul_(total / size).long().clamp_(max=total - 1)
