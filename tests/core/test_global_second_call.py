"""The work of a second (iterative) ``global_unstructured`` call, pinned by what it runs.

A second call on reparametrized tensors selects among the units its masks still keep and
multiplies a keep factor into each mask in place. Its keep factors are ``bool``: a float compare
is written to ``bool`` vectorised (to ``uint8`` it is not, about 6x slower per unit, which made the
second call slower than the first), and the factor is read back as bytes. The band guess counts
only eligible units, so on well-spread weights a second call needs no fallback pass either.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch
from torch import Tensor, nn

import tensorplay.ao.pruning.global_pruning as global_pruning
import tensorplay.ao.pruning.selection.masks as selection_masks
from tensorplay.ao.pruning import L1Unstructured, RandomUnstructured, global_unstructured
from tensorplay.ao.pruning.selection import AbsKeys, cut, scans, tuning


def _layers(seed: int = 0) -> list[nn.Linear]:
    torch.manual_seed(seed)
    return [nn.Linear(64, 48, bias=False), nn.Linear(48, 80, bias=False), nn.Linear(80, 8)]


def _pairs(layers: list[nn.Linear]) -> list[tuple[nn.Module, str]]:
    return [(layer, "weight") for layer in layers]


class _Recorder:
    """Wraps ``keep_masks`` as ``global_pruning`` calls it; records the output dtypes."""

    def __init__(self) -> None:
        self.out_dtypes: list[list[torch.dtype]] = []
        self.returned: list[list[torch.dtype]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> list[Tensor]:
        self.out_dtypes.append(list(args[4]))
        masks = selection_masks.keep_masks(*args, **kwargs)
        self.returned.append([mask.dtype for mask in masks])
        return masks


@pytest.mark.parametrize("method", [L1Unstructured, RandomUnstructured], ids=["l1", "random"])
def test_second_call_asks_for_bool_keep_factors(method: type) -> None:
    layers = _layers()
    recorder = _Recorder()
    with mock.patch.object(global_pruning, "keep_masks", recorder):
        global_unstructured(_pairs(layers), method, amount=0.5)
        global_unstructured(_pairs(layers), method, amount=0.5)
    assert len(recorder.out_dtypes) == 2
    assert recorder.out_dtypes[0] == [torch.float32] * 3  # first call: the masks themselves
    assert recorder.out_dtypes[1] == [torch.bool] * 3  # second call: keep factors
    assert recorder.returned[1] == [torch.bool] * 3


def test_second_call_masks_equal_uint8_keep_factors() -> None:
    """The bool factors give exactly the masks the former uint8 factors gave."""
    ours, reference = _layers(), _layers()
    global_unstructured(_pairs(ours), L1Unstructured, amount=0.4)
    global_unstructured(_pairs(reference), L1Unstructured, amount=0.4)
    global_unstructured(_pairs(ours), L1Unstructured, amount=0.3)
    masks = [layer.weight_mask for layer in reference]
    scores = [layer.weight.detach() for layer in reference]
    eligible = sum(int((mask == 1).sum()) for mask in masks)
    factors = selection_masks.keep_masks(
        scores,
        masks,
        round(0.3 * eligible),
        AbsKeys(torch.float32),
        [torch.uint8] * 3,
    )
    for layer, mask, factor in zip(ours, masks, factors, strict=True):
        expected = mask * factor
        assert layer.weight_mask.dtype == torch.float32
        assert torch.equal(layer.weight_mask, expected)
        assert torch.equal(layer.weight, layer.weight_orig * expected)
    assert sum(int((layer.weight_mask == 0).sum()) for layer in ours) == (
        sum(layer.weight.numel() for layer in ours) - eligible + round(0.3 * eligible)
    )


def test_second_call_on_spread_weights_runs_no_fallback_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The band guess of a second call counts only eligible units: one fused pass suffices."""
    # Small tuning constants, so 40k units take the sampled band path of a large model.
    monkeypatch.setattr(tuning, "CPU_CHUNK", 1 << 12)
    monkeypatch.setattr(tuning, "MIN_BAND", 1 << 12)
    monkeypatch.setattr(tuning, "SAMPLE", 1 << 14)
    torch.manual_seed(0)
    layers = [nn.Linear(200, 100, bias=False), nn.Linear(100, 200, bias=False)]
    passes = mock.Mock(wraps=scans.fused_pass)
    refines = mock.Mock(wraps=cut.cut_between)
    monkeypatch.setattr(scans, "fused_pass", passes)
    monkeypatch.setattr(cut, "cut_between", refines)
    for call in range(3):
        global_unstructured(_pairs(layers), L1Unstructured, amount=0.5)
        assert (passes.call_count, refines.call_count) == (call + 1, 0)
    total = sum(layer.weight.numel() for layer in layers)
    pruned = sum(int((layer.weight_mask == 0).sum()) for layer in layers)
    assert pruned == total - 5000  # 40000 -> 20000 -> 10000 -> 5000 kept
