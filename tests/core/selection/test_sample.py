"""The band guess brackets the ``k``-th key, and sampling leaves the global RNG alone."""

from __future__ import annotations

import pytest
import torch

from tensorplay.ao.pruning.selection import AbsKeys, UniformKeys
from tensorplay.ao.pruning.selection.plan import Selection
from tensorplay.ao.pruning.selection.sample import guess_band, sample_keys


@pytest.mark.parametrize("fraction", [0.01, 0.5, 0.99])
def test_guess_band_brackets_the_kth_key(fraction: float) -> None:
    g = torch.Generator().manual_seed(0)
    scores = [torch.randn(200_000, generator=g), torch.randn(100_000, generator=g)]
    selection = Selection(scores, [None, None], AbsKeys(), [torch.bool] * 2)
    k = round(fraction * selection.total)
    state = torch.get_rng_state()
    lo, hi = guess_band(selection, k, selection.total)
    assert torch.equal(torch.get_rng_state(), state)
    kth = float(torch.cat(scores).abs().kthvalue(k).values)
    assert lo <= kth <= hi


def test_uniform_band_is_around_the_quantile() -> None:
    selection = Selection([torch.zeros(10_000)], [None], UniformKeys(1), [torch.bool])
    lo, hi = guess_band(selection, 2_500, 10_000)
    assert 0.2 < lo < 0.25 < hi < 0.3


def test_sample_keys_only_of_eligible_units() -> None:
    scores = torch.arange(1000.0)
    eligible = (torch.arange(1000) % 2 == 0).float()
    sample = sample_keys(Selection([scores], [eligible], AbsKeys(), [torch.bool]))
    assert sample.numel() > 0
    assert (sample % 2 == 0).all()
