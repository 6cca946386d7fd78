"""The two-pass selection in place (``stream.py``): every branch of the band path equals
``keep_masks``, and the tensors given as ``zero`` end as ``tensor * final mask``."""

from __future__ import annotations

import math
from collections.abc import Callable
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from tensorplay.ao.pruning.selection import (
    AbsKeys,
    KeySpec,
    UniformKeys,
    capped_keep_masks,
    clear_lowest,
    clear_lowest_capped,
    cut,
    keep_masks,
)
from tensorplay.ao.pruning.selection.checks import count_true
from tensorplay.ao.pruning.selection.passes import nonzero_columns
from tests.core.selection.reference import small_constants
from tests.core.selection.test_inplace import Problem, assert_same, problems


def expected(scores: list[Tensor], keep: list[Tensor], k: int, keys: KeySpec) -> list[Tensor]:
    factors = keep_masks(scores, keep, k, keys, [torch.bool] * len(scores))
    return [m & f for m, f in zip(keep, factors, strict=True)]


def assert_zeroed(got: list[Tensor], weights: list[Tensor], masks: list[Tensor]) -> None:
    """``got`` is each weight times its final mask, bit for bit (NaN where the weight is)."""
    assert len(got) == len(weights) == len(masks)
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    for a, w, m in zip(got, weights, masks, strict=True):
        want = w * m
        assert a.dtype == w.dtype and a.shape == w.shape
        assert torch.equal(a.isnan(), want.isnan())
        numbers = ~want.isnan()
        # The bit patterns: -0.0 where a negative weight was pruned, as the multiply gives.
        assert torch.equal(a[numbers].view(bits[a.dtype]), want[numbers].view(bits[a.dtype]))


@pytest.mark.parametrize("keys", [AbsKeys(), UniformKeys(seed=5)], ids=["l1", "random"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    problem=problems(),
    scores_are_weights=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_zero_is_the_weights_times_the_final_masks(
    keys: KeySpec, problem: Problem, scores_are_weights: bool, dtype: torch.dtype
) -> None:
    """Weights of another dtype than the keys (bf16, fp16) are multiplied in their own dtype:
    the same values, signed zeros and NaN as ``weight * mask``."""
    scores, keep, k, _ = problem
    weights = [s.clone() if scores_are_weights else torch.randn(s.shape) for s in scores]
    weights = [w.to(dtype) for w in weights]
    for w in weights:  # pruned, a NaN or an inf weight becomes NaN, as NaN * 0 and inf * 0 do
        if w.numel() > 2 and not scores_are_weights:
            w.view(-1)[:2] = torch.tensor([math.nan, -math.inf])
    original = [w.clone() for w in weights]
    sources = weights if scores_are_weights else scores  # the scores may be the weights
    want = expected(sources, keep, k, keys)
    masks = [m.clone() for m in keep]
    with small_constants():
        clear_lowest(sources, masks, k, keys, zero=weights)
    assert_same(masks, want)
    assert_zeroed(weights, original, masks)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_capped_zero_is_the_weights_times_the_final_masks(problem: Problem) -> None:
    scores, keep, _, caps = problem
    k = sum(caps) // 2
    weights = [torch.randn(s.shape) for s in scores]
    original = [w.clone() for w in weights]
    with small_constants():
        factors = capped_keep_masks(scores, keep, k, caps, AbsKeys())
        masks = [m.clone() for m in keep]
        clear_lowest_capped(scores, masks, k, AbsKeys(), caps, zero=weights)
    assert_same(masks, [m & f.bool() for m, f in zip(keep, factors, strict=True)])
    assert_zeroed(weights, original, masks)


def _data(seed: int, ties: bool) -> tuple[list[Tensor], list[Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    scores = [torch.randn(300, generator=generator), torch.randn(20, 30, generator=generator)]
    if ties:  # a few dozen distinct keys, each held by many units
        scores = [(s * 8).round() for s in scores]
    keep = [torch.rand(s.shape, generator=generator) < 0.8 for s in scores]
    return scores, keep


def _at(keys: Tensor, index: int) -> float:
    """The sorted ``keys`` at ``index``, clamped to the ends."""
    return float(keys[min(max(index, 0), keys.numel() - 1)])


# A band guess per branch of the band path: (name, guess(sorted eligible keys, k) -> (lo, hi)).
GUESSES: list[tuple[str, Callable[[Tensor, int], tuple[float, float]]]] = [
    ("brackets", lambda keys, k: (_at(keys, k - 40), _at(keys, k + 40))),
    ("lo-too-high", lambda keys, k: (_at(keys, k + 5), _at(keys, k + 60))),
    ("lo-is-the-kth-key", lambda keys, k: (_at(keys, k - 1), _at(keys, k + 60))),
    ("band-too-low", lambda keys, k: (_at(keys, k - 90), _at(keys, k - 20))),
    ("overflow", lambda keys, k: (-math.inf, _at(keys, keys.numel()))),
    ("band-below-all", lambda keys, k: (0.0, _at(keys, 0) / 2)),
]


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("guess", [g for _, g in GUESSES], ids=[name for name, _ in GUESSES])
@pytest.mark.parametrize("k", [1, 100, 250, 399])
def test_every_branch_of_the_band_path_equals_keep_masks(
    guess: Callable[[Tensor, int], tuple[float, float]], ties: bool, k: int
) -> None:
    scores, keep = _data(k, ties)
    keys = torch.cat([s.abs().view(-1)[m.view(-1)] for s, m in zip(scores, keep, strict=True)])
    keys = keys.sort().values
    k = min(k, keys.numel() - 1)
    assert 0 < k < keys.numel()
    lo, hi = guess(keys, k)
    if lo == hi:  # a tied guess: the band is the next distinct key up
        hi = float(keys[keys > lo][0])
    weights = [s.clone() for s in scores]
    masks = [m.clone() for m in keep]
    fixed = mock.patch.object(cut, "guess_band", lambda *args: (lo, hi))
    with small_constants(chunk=64, band=256), fixed:
        clear_lowest(weights, masks, k, AbsKeys(), zero=weights)
    assert_same(masks, expected(scores, keep, k, AbsKeys()))
    assert_zeroed(weights, scores, masks)


def test_all_true_masks_with_n_eligible_equal_a_counted_call() -> None:
    scores, _ = _data(3, ties=True)
    keep = [torch.ones(s.shape, dtype=torch.bool) for s in scores]
    total = sum(s.numel() for s in scores)
    for k in [0, 1, 123, total - 1, total]:
        told = [m.clone() for m in keep]
        with small_constants():
            clear_lowest(scores, told, k, AbsKeys(), n_eligible=total)
            assert_same(told, expected(scores, keep, k, AbsKeys()))


def test_zero_must_fit_the_sources_and_nothing_changes() -> None:
    keep = [torch.ones(3, dtype=torch.bool)]
    weight = torch.ones(3)
    with pytest.raises(ValueError, match="one tensor \\(or None\\) to zero per source \\(1\\)"):
        clear_lowest([torch.ones(3)], keep, 1, AbsKeys(), zero=[weight, weight])
    with pytest.raises(ValueError, match="to have 3 local units, but got a tensor of shape"):
        clear_lowest([torch.ones(3)], keep, 1, AbsKeys(), zero=[torch.ones(4)])
    assert bool(keep[0].all()) and bool(weight.eq(1).all())


def test_a_non_contiguous_tensor_to_zero_is_zeroed_at_the_end() -> None:
    scores = torch.tensor([[0.5, 0.1], [0.3, 0.2]])
    weight = torch.ones(2, 2).t()  # not contiguous
    keep = [torch.ones(2, 2, dtype=torch.bool)]
    clear_lowest([scores], keep, 2, AbsKeys(), zero=[weight])
    assert keep[0].tolist() == [[True, False], [True, False]]
    assert weight.tolist() == [[1.0, 0.0], [1.0, 0.0]]


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 1000, 4099])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.5, 1.0])
def test_nonzero_columns_equals_nonzero(size: int, density: float) -> None:
    flags = (torch.rand(size, generator=torch.Generator().manual_seed(size)) < density).float()
    assert torch.equal(nonzero_columns(flags), torch.nonzero(flags).view(-1))


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 255 * 8, 255 * 8 + 3, 5000])
@pytest.mark.parametrize("offset", [0, 1, 5])
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_count_true_equals_count_nonzero(size: int, offset: int, density: float) -> None:
    generator = torch.Generator().manual_seed(size + offset)
    mask = (torch.rand(size + offset, generator=generator) < density)[offset:]
    assert count_true(mask) == int(torch.count_nonzero(mask))
