"""The work of a second (iterative) ``global_unstructured`` call, pinned by what it runs.

A first call writes new masks in one fused pass. A second call on reparametrized tensors selects
among the units its masks still keep (``1``) and clears the selected ones in the mask buffers
themselves, as the lean masks are cleared (``clear_lowest``: a pass that counts below the band,
one that clears below it and gathers the band): no keep factor is allocated and no pass
multiplies one into the masks, which made the second call cost more than the first. The band
guess counts only eligible units, so on well-spread weights a second call needs no fallback
pass either.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch
from torch import Tensor, nn

import tensorplay.ao.pruning.parity.global_unstructured as global_pruning
import tensorplay.ao.pruning.selection.masks as selection_masks
from tensorplay.ao.pruning import L1Unstructured, RandomUnstructured, global_unstructured
from tensorplay.ao.pruning.selection import AbsKeys, clear_lowest, cut, scans, tuning


def _layers(seed: int = 0, dtype: torch.dtype = torch.float32) -> list[nn.Linear]:
    torch.manual_seed(seed)
    layers = [nn.Linear(64, 48, bias=False), nn.Linear(48, 80, bias=False), nn.Linear(80, 8)]
    return [layer.to(dtype) for layer in layers]


def _pairs(layers: list[nn.Linear]) -> list[tuple[nn.Module, str]]:
    return [(layer, "weight") for layer in layers]


class _Recorder:
    """Wraps ``keep_masks`` and ``clear_lowest`` as ``global_pruning`` calls them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Tensor]]] = []

    def keep_masks(self, *args: Any, **kwargs: Any) -> list[Tensor]:
        masks = selection_masks.keep_masks(*args, **kwargs)
        self.calls.append(("keep_masks", masks))
        return masks

    def clear_lowest(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(("clear_lowest", list(args[1])))
        return clear_lowest(*args, **kwargs)


@pytest.mark.parametrize("method", [L1Unstructured, RandomUnstructured], ids=["l1", "random"])
def test_second_call_clears_the_mask_buffers_in_place(method: type) -> None:
    layers = _layers()
    recorder = _Recorder()
    with (
        mock.patch.object(global_pruning, "keep_masks", recorder.keep_masks),
        mock.patch.object(global_pruning, "clear_lowest", recorder.clear_lowest),
    ):
        global_unstructured(_pairs(layers), method, amount=0.5)
        buffers = [layer.weight_mask for layer in layers]
        global_unstructured(_pairs(layers), method, amount=0.5)
    assert [name for name, _ in recorder.calls] == ["keep_masks", "clear_lowest"]
    first, second = recorder.calls[0][1], recorder.calls[1][1]
    assert [mask.dtype for mask in first] == [torch.float32] * 3  # the new masks themselves
    assert all(mask is buffer for mask, buffer in zip(second, buffers, strict=True))
    assert all(layer.weight_mask is buffer for layer, buffer in zip(layers, buffers, strict=True))
    total = sum(layer.weight.numel() for layer in layers)
    assert sum(int((layer.weight_mask == 0).sum()) for layer in layers) == total - total // 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_second_call_masks_equal_the_keep_factors_multiplied_in(dtype: torch.dtype) -> None:
    """In place, the masks are exactly what the keep factors of ``keep_masks`` gave."""
    ours, reference = _layers(dtype=dtype), _layers(dtype=dtype)
    global_unstructured(_pairs(ours), L1Unstructured, amount=0.4)
    global_unstructured(_pairs(reference), L1Unstructured, amount=0.4)
    global_unstructured(_pairs(ours), L1Unstructured, amount=0.3)
    masks = [layer.weight_mask for layer in reference]
    scores = [layer.weight.detach() for layer in reference]
    eligible = sum(int((mask == 1).sum()) for mask in masks)
    factors = selection_masks.keep_masks(
        scores, masks, round(0.3 * eligible), AbsKeys(torch.float32), [torch.uint8] * 3
    )
    for layer, mask, factor in zip(ours, masks, factors, strict=True):
        expected = mask * factor
        assert layer.weight_mask.dtype == dtype
        assert torch.equal(layer.weight_mask, expected)
        assert torch.equal(layer.weight, layer.weight_orig * expected)
    assert sum(int((layer.weight_mask == 0).sum()) for layer in ours) == (
        sum(layer.weight.numel() for layer in ours) - eligible + round(0.3 * eligible)
    )


def test_a_call_mixing_pruned_and_new_tensors_gives_the_new_ones_masks_of_their_dtype() -> None:
    ours, reference = _layers(), _layers()
    for layers in (ours, reference):
        global_unstructured(_pairs(layers[:2]), L1Unstructured, amount=0.5)
    global_unstructured(_pairs(ours), L1Unstructured, amount=0.5)
    # The reference: the same selection with an all-ones mask for the tensor pruned now.
    scores = [layer.weight.detach().clone() for layer in reference]
    masks = [reference[0].weight_mask.clone(), reference[1].weight_mask.clone()]
    masks.append(torch.ones_like(reference[2].weight))
    eligible = sum(int((mask == 1).sum()) for mask in masks)
    clear_lowest(scores, masks, round(0.5 * eligible), AbsKeys())
    for layer, mask in zip(ours, masks, strict=True):
        assert layer.weight_mask.dtype == torch.float32
        assert torch.equal(layer.weight_mask, mask)


def test_a_mask_that_is_not_contiguous_is_updated_by_keep_factors() -> None:
    ours, reference = _layers(), _layers()
    for layers in (ours, reference):
        global_unstructured(_pairs(layers), L1Unstructured, amount=0.5)
    buffer = ours[0].weight_mask.t().contiguous().t()  # same values, column-major
    ours[0].weight_mask = buffer
    global_unstructured(_pairs(ours), L1Unstructured, amount=0.5)
    global_unstructured(_pairs(reference), L1Unstructured, amount=0.5)
    assert ours[0].weight_mask is buffer and not buffer.is_contiguous()
    for a, b in zip(ours, reference, strict=True):
        assert torch.equal(a.weight_mask, b.weight_mask)
        assert torch.equal(a.weight, b.weight)


def test_second_call_on_spread_weights_runs_no_fallback_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The band guess of a second call counts only eligible units: its two passes suffice."""
    # Small tuning constants, so 40k units take the sampled band path of a large model.
    monkeypatch.setattr(tuning, "CPU_CHUNK", 1 << 12)
    monkeypatch.setattr(tuning, "MIN_BAND", 1 << 12)
    monkeypatch.setattr(tuning, "SAMPLE", 1 << 14)
    torch.manual_seed(0)
    layers = [nn.Linear(200, 100, bias=False), nn.Linear(100, 200, bias=False)]
    passes = {name: mock.Mock(wraps=getattr(scans, name)) for name in ("fused_pass", "write_band")}
    counts = mock.Mock(wraps=scans.count_under)
    refines = mock.Mock(wraps=cut.cut_between)
    for name, wrapped in passes.items():
        monkeypatch.setattr(scans, name, wrapped)
    monkeypatch.setattr(scans, "count_under", counts)
    monkeypatch.setattr(cut, "cut_between", refines)
    for call in range(3):
        global_unstructured(_pairs(layers), L1Unstructured, amount=0.5)
        # The first call: one fused pass; each later one: a count and a clearing pass.
        assert passes["fused_pass"].call_count == 1
        assert counts.call_count == passes["write_band"].call_count == call
        assert refines.call_count == 0
    total = sum(layer.weight.numel() for layer in layers)
    pruned = sum(int((layer.weight_mask == 0).sum()) for layer in layers)
    assert pruned == total - 5000  # 40000 -> 20000 -> 10000 -> 5000 kept
