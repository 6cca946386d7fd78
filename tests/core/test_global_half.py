"""Global exact selection of ``bfloat16`` and ``float16`` weights, large enough for the sampled
band (the real tuning constants), in every way to prune: ``global_unstructured`` (first and
second call) and the ``Pruner`` in both masking modes.

Half-precision weights are heavily tied (``bfloat16`` has 256 values per power of two), so every
cut falls inside a tied key: the masks must be those of the stable-sort reference (the tie rule:
source, then flat index), and torch's, whose ``topk`` breaks ties its own way, must prune the
same count below the same key.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

from tensorplay.ao.pruning import L1Unstructured, Pruner, global_unstructured
from tensorplay.ao.pruning.pruner.schedules import CallableSchedule
from tensorplay.ao.pruning.selection import tuning
from tests.core.test_global_unstructured import reference_global

DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]
SHAPES = [(512, 384), (384, 512), (640, 300)]  # 585,216 units: past the smallest band cap


def two_steps(step: int) -> float:
    """The pruners' schedule: 37.5% at step 0, 75% at step 1."""
    return (0.375, 0.75)[min(step, 1)]


def make_model(dtype: torch.dtype, ties: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    layers = [nn.Linear(i, o, bias=False, dtype=dtype) for o, i in SHAPES]
    if ties:  # nine values: the k-th key is held by tens of thousands of units
        with torch.no_grad():
            for layer in layers:
                layer.weight.copy_(torch.randint(-4, 5, layer.weight.shape))
    return nn.Sequential(*layers)


def pairs_of(model: nn.Sequential) -> list[tuple[nn.Module, str]]:
    return [(layer, "weight") for layer in model]


def weights_of(model: nn.Sequential) -> list[Tensor]:
    return [layer.weight.detach().clone() for layer in model]


def bool_masks(model: nn.Sequential) -> list[Tensor]:
    return [layer.weight_mask.bool() for layer in model]


def assert_torch_agrees(theirs: list[Tensor], scores: list[Tensor], expected: list[Tensor]) -> None:
    """torch's masks prune as many units, all at or below the reference's highest pruned key."""
    keys = torch.cat([s.double().abs().reshape(-1) for s in scores])
    want = torch.cat([m.reshape(-1) for m in expected])
    got = torch.cat([m.reshape(-1) for m in theirs]) != 0
    assert int((~got).sum()) == int((~want).sum())
    assert keys[~got].max() == keys[~want].max()


def test_the_sizes_take_the_sampled_band() -> None:
    units = sum(o * i for o, i in SHAPES)
    assert units > tuning.band_cap(units)  # the band is sampled, not the whole selection


@pytest.mark.parametrize("ties", [False, True], ids=["normal", "nine-values"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_global_unstructured_first_and_second_call(dtype: torch.dtype, ties: bool) -> None:
    ours = make_model(dtype, ties)
    theirs = copy.deepcopy(ours)
    scores = weights_of(ours)
    total = sum(s.numel() for s in scores)
    expected = reference_global(scores, [None] * 3, round(0.5 * total))
    global_unstructured(pairs_of(ours), L1Unstructured, amount=0.5)
    torch_prune.global_unstructured(pairs_of(theirs), torch_prune.L1Unstructured, amount=0.5)
    for got, want in zip(bool_masks(ours), expected, strict=True):
        assert torch.equal(got, want)
    assert all(layer.weight_mask.dtype == dtype for layer in ours)
    assert_torch_agrees([layer.weight_mask for layer in theirs], scores, expected)

    # The second call ranks the unpruned units of the masked weights.
    masks = [layer.weight_mask.clone() for layer in ours]
    scores = weights_of(ours)
    k = round(0.3 * sum(int((m == 1).sum()) for m in masks))
    expected = reference_global(scores, masks, k)
    global_unstructured(pairs_of(ours), L1Unstructured, amount=0.3)
    for got, want in zip(bool_masks(ours), expected, strict=True):
        assert torch.equal(got, want)
    for layer in ours:
        assert torch.equal(layer.weight, layer.weight_orig * layer.weight_mask)


@pytest.mark.parametrize("masking", ["inplace", "reparametrize"])
@pytest.mark.parametrize("ties", [False, True], ids=["normal", "nine-values"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_pruner_steps_equal_the_reference(dtype: torch.dtype, ties: bool, masking: str) -> None:
    model = make_model(dtype, ties)
    pruner = Pruner(model, CallableSchedule(two_steps, end_step=1), masking=masking)
    total = sum(o * i for o, i in SHAPES)
    masks: list[Tensor | None] = [None] * 3
    for step in (0, 1):
        # The unpruned values: the weights (lean), ``weight_orig`` once reparametrized.
        scores = [getattr(layer, "weight_orig", layer.weight).detach().clone() for layer in model]
        values = weights_of(model)
        pruned = 0 if masks[0] is None else sum(int((~m).sum()) for m in masks if m is not None)
        expected = reference_global(scores, masks, round(two_steps(step) * total) - pruned)
        pruner.step(step)
        got = bool_masks(model)
        for mask, want in zip(got, expected, strict=True):
            assert torch.equal(mask, want)
        if masking == "inplace":  # the weights zeroed in place where pruned, nothing else
            for layer, value, mask in zip(model, values, got, strict=True):
                assert layer.weight.dtype == dtype
                assert torch.equal(layer.weight.detach(), value * mask)
        masks = list(got)
    assert pruner.pruned_count() == round(0.75 * total)
