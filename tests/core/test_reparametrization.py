"""``reparametrization.py``: one test of "pruned", the parts, and exact counts."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

from tensorplay.ao.pruning import L1Unstructured, global_unstructured, l1_unstructured, remove
from tensorplay.ao.pruning.parity.reparametrization import (
    count_pruned,
    count_zeros,
    find_hook,
    is_pruned_tensor,
    parameter_of,
    pruned_parts,
    pruned_tensor_names,
)


def _global(layer: nn.Linear) -> object:
    return global_unstructured([(layer, "weight")], L1Unstructured, amount=3)


PRUNERS = [
    pytest.param(lambda m: l1_unstructured(m, "weight", amount=3), False, id="per-tensor"),
    pytest.param(_global, False, id="global"),
    pytest.param(lambda m: torch_prune.l1_unstructured(m, "weight", amount=3), True, id="torch"),
]


@pytest.mark.parametrize(("prune", "by_torch"), PRUNERS)
def test_the_parts_of_a_pruned_tensor(prune: Callable[[nn.Linear], object], by_torch: bool) -> None:
    layer = nn.Linear(3, 2)
    param = layer.weight
    prune(layer)
    parts = pruned_parts(layer, "weight")
    assert parts is not None and parts.is_torch is by_torch
    assert parts.orig is param is parameter_of(layer, "weight")
    assert parts.mask is layer.weight_mask and parts.hook is find_hook(layer, "weight")[1]
    assert is_pruned_tensor(layer, "weight") and not is_pruned_tensor(layer, "bias")
    assert pruned_tensor_names(layer) == ["weight"]
    assert count_pruned(parts) == 3


@pytest.mark.parametrize("removed", [False, True], ids=["never-pruned", "removed"])
def test_a_tensor_without_the_parts_is_not_pruned(removed: bool) -> None:
    layer = nn.Linear(3, 2)
    if removed:
        remove(l1_unstructured(layer, "weight", amount=1), "weight")
    assert pruned_parts(layer, "weight") is None and not is_pruned_tensor(layer, "weight")
    assert parameter_of(layer, "weight") is layer.weight and pruned_tensor_names(layer) == []


def test_a_hook_without_its_buffer_is_named() -> None:
    layer = l1_unstructured(nn.Linear(3, 2), "weight", amount=1)
    del layer._buffers["weight_mask"]
    assert not is_pruned_tensor(layer, "weight")
    with pytest.raises(
        ValueError,
        match=r"\(Linear, 'weight'\), which has a pruning hook, .*"
        r"but weight_mask is missing",
    ):
        pruned_parts(layer, "weight")


@pytest.mark.parametrize(
    ("tensor", "zeros"),
    [
        pytest.param(torch.tensor([0.0, -0.0, 1.0, 0.5]), 2, id="float32-negative-zero"),
        pytest.param(torch.tensor([0.0, 2.0, 0.0], dtype=torch.float16), 2, id="float16"),
        pytest.param(torch.tensor([[0.0, 1.0]], dtype=torch.float64).t(), 1, id="non-contiguous"),
        pytest.param(torch.tensor([True, False, False]), 2, id="bool"),
        pytest.param(torch.tensor([0, 3], dtype=torch.int8), 1, id="int8"),
        pytest.param(torch.empty(0), 0, id="empty"),
        pytest.param(None, 0, id="none"),
    ],
)
def test_count_zeros_is_exact(tensor: Tensor | None, zeros: int) -> None:
    assert count_zeros([tensor, torch.zeros(2)]) == [zeros, 2]


@pytest.mark.parametrize("offset", [0, 1, 5])
@pytest.mark.parametrize("size", [3, 8, 2047, 300_001])
def test_count_zeros_of_bool_masks_counts_every_false(offset: int, size: int) -> None:
    generator = torch.Generator().manual_seed(size + offset)
    whole = torch.rand(size + offset, generator=generator) > 0.3
    mask = whole[offset:]  # contiguous, not aligned to eight bytes
    transposed = whole[: (size // 3) * 3].view(3, -1).t()  # not contiguous
    expected = [int((~mask).sum()), int((~transposed).sum())]
    assert count_zeros([mask, transposed]) == expected
    assert count_zeros([torch.ones(size, dtype=torch.bool)]) == [0]
