"""The band guess: a seeded sample of keys gives two keys whose ranks very likely bracket ``k``.

A private :class:`torch.Generator` draws the sample, so the global RNG is untouched. For uniform
random keys the band follows from the quantile directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import tuning
from tensorplay.ao.pruning.selection.floats import largest
from tensorplay.ao.pruning.selection.plan import Selection

__all__ = ["guess_band", "guess_band_uncounted", "sample_keys", "sample_size"]


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
        return _uniform_band(q, n_eligible, 0.0)
    return _sampled_band(sample_keys(selection), q, selection.keys.dtype, 0.0)


def guess_band_uncounted(
    selection: Selection, count: Callable[[int], int]
) -> tuple[float, float] | None:
    """:func:`guess_band` before the eligible units are counted, ``k`` being ``count`` of them.

    Their number is estimated from the sample (the share of the sampled positions that are
    eligible), and the band is widened by that estimate's own error, so that the pass that
    counts them exactly can also count below the band.

    Args:
        selection: the selection.
        count: ``k`` from the number of eligible units (it may raise for a number it refuses).

    Returns:
        ``(lo, hi)``, or ``None`` where the sample cannot tell: too few eligible units sampled,
        or ``k`` of the estimate is refused, none or all of them (count them first).

    Example:
        >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
        >>> scores, eligible = torch.linspace(0, 1, 100_000), torch.ones(100_000)
        >>> eligible[::2] = 0  # every other unit pruned before
        >>> selection = Selection([scores], [eligible], AbsKeys(), [])
        >>> lo, hi = guess_band_uncounted(selection, lambda n: n // 2)
        >>> lo < 0.5 < hi
        True
    """
    drawn = sample_size(selection.units)
    if selection.keys.reads_scores:
        sample = sample_keys(selection)
        sampled = sample.numel()
    else:  # uniform keys: only the eligible share is sampled
        sampled = _sampled_eligible(selection)
    share = sampled / drawn
    if sampled < 64:
        return None
    n_eligible = max(round(share * selection.units), 1)
    try:
        k = count(n_eligible)
    except ValueError:
        return None
    if not 0 < k < n_eligible:
        return None
    q = k / n_eligible
    # The estimate's relative error carries over to the quantile of a fixed k.
    extra = tuning.SIGMAS * q * math.sqrt((1 - share) / (share * drawn))
    if not selection.keys.reads_scores:
        return _uniform_band(q, n_eligible, extra)
    return _sampled_band(sample, q, selection.keys.dtype, extra)


def _uniform_band(q: float, n_eligible: int, extra: float) -> tuple[float, float]:
    """The band of uniform random keys, whose quantile is the key."""
    width = tuning.SIGMAS * math.sqrt(q * (1 - q) / n_eligible) + 2 / math.sqrt(n_eligible)
    return max(q - width - extra, 0.0), min(q + width + extra, 1.0)


def _sampled_band(
    sample: Tensor, q: float, dtype: torch.dtype, extra: float
) -> tuple[float, float]:
    """The band of the sample's quantile ``q``, ``extra`` wider on each side (a share)."""
    size = sample.numel()
    if size < 64:
        return -math.inf, largest(dtype)
    width = tuning.SIGMAS * math.sqrt(max(q * (1 - q), 1 / size) / size) + 2 / size + extra
    lo_rank, hi_rank = math.floor((q - width) * size), math.ceil((q + width) * size)
    # Two order statistics: a linear-time selection each, no sort of the sample.
    lo = float(torch.kthvalue(sample, lo_rank + 1).values) if lo_rank >= 0 else -math.inf
    hi = float(torch.kthvalue(sample, hi_rank + 1).values) if hi_rank < size else largest(dtype)
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
    parts = []
    for i, index in _sampled_positions(selection):
        key = selection.keys.sample_keys(selection.scores[i], index)
        eligible = selection.eligible[i]
        if eligible is not None:
            key = key[eligible.index_select(0, index) == 1]
        parts.append(key.cpu())
    local = torch.cat(parts) if parts else torch.empty(0, dtype=selection.keys.dtype)
    return selection.comm.gather(local)


def _sampled_eligible(selection: Selection) -> int:
    """How many of the sampled positions are eligible (over all ranks; keys not read)."""
    local = 0
    for i, index in _sampled_positions(selection):
        eligible = selection.eligible[i]
        local += index.numel() if eligible is None else int((eligible[index] == 1).sum())
    return selection.comm.sum([local])[0]


def _sampled_positions(selection: Selection) -> list[tuple[int, Tensor]]:
    """Per local piece holding sampled positions: its source and their local flat indices."""
    positions = _sample_positions(selection.units)
    bases = torch.tensor([0, *(layout.numel for layout in selection.layouts)]).cumsum(0)
    found = []
    for i, layout in enumerate(selection.layouts):
        start = int(bases[i]) + layout.offset
        lo, hi = torch.searchsorted(
            positions, torch.tensor([start, start + selection.sizes[i]])
        ).tolist()
        if hi > lo:
            found.append((i, (positions[lo:hi] - start).to(selection.scores[i].device)))
    return found


def sample_size(total: int) -> int:
    """How many positions the sample draws among ``total`` units (eligible or not).

    Big enough that the band (about 9 standard deviations of the sampled quantile, that is
    4.5 / sqrt(size) of the units) is well below the most candidates a pass may gather.

    Example:
        >>> sample_size(100), sample_size(10**9) == tuning.SAMPLE
        (100, True)
    """
    cap = tuning.band_cap(total)
    return min(tuning.SAMPLE, total, max(1 << 12, math.ceil((12 * total / cap) ** 2)))


def _sample_positions(total: int) -> Tensor:
    """Sorted seeded uniform flat positions among ``total`` units, one per stratum."""
    generator = torch.Generator().manual_seed(tuning.SAMPLE_SEED)
    size = sample_size(total)
    # Stratified: one uniform position in each of `size` equal strata, so sorted without a
    # sort (and a lower variance than independent positions, with no periodic pattern).
    jitter = torch.rand(size, dtype=torch.float64, generator=generator)
    strata = torch.arange(size, dtype=torch.float64).add_(jitter)
    return strata.mul_(total / size).long().clamp_(max=total - 1)
