"""``methods.py`` beyond torch parity (which ``test_parity_methods`` covers): the
``CustomFromMask`` hooks that read the module's current mask buffer, and ``remove`` of a tensor
pruned by torch."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref
from collections.abc import Callable

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from tensorplay.ao.pruning import CustomFromMask, L1Unstructured, global_unstructured, remove
from tensorplay.ao.pruning.masking.restore import restore_pruning
from tensorplay.ao.pruning.parity.reparametrization import find_hook
from tests.model_state import unchanged

Convert = Callable[[nn.Module], object]


def _globally_pruned(dtype: torch.dtype = torch.float32) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(256, 256).to(dtype)
    global_unstructured([(layer, "weight")], L1Unstructured, amount=0.5)
    return layer


def _restored(dtype: torch.dtype = torch.float32) -> nn.Linear:
    state = _globally_pruned().state_dict()
    layer = nn.Linear(256, 256)
    restore_pruning(layer, state)
    layer.load_state_dict(state)
    return layer.to(dtype)


@pytest.mark.parametrize("make", [_globally_pruned, _restored], ids=["global", "restored"])
@pytest.mark.parametrize(
    ("convert", "dtype"),
    [
        pytest.param(lambda m: m.half(), torch.float16, id="half"),
        pytest.param(lambda m: m.to(torch.float64), torch.float64, id="to-dtype"),
        pytest.param(lambda m: m.to("cpu", torch.bfloat16), torch.bfloat16, id="to-device-dtype"),
    ],
)
def test_a_converted_module_holds_only_its_current_mask(
    make: Callable[..., nn.Linear], convert: Convert, dtype: torch.dtype
) -> None:
    layer = make()
    old = weakref.ref(layer.weight_mask)
    convert(layer)
    layer(torch.ones(1, 256, dtype=dtype))  # the forward recomputes `weight` from the new parts
    gc.collect()
    assert old() is None  # no hook keeps the float32 mask alive
    hook = find_hook(layer, "weight")[1]
    assert hook.mask is layer.weight_mask and hook.mask.dtype == dtype
    fresh = make(dtype)
    fresh(torch.ones(1, 256, dtype=dtype))
    assert len(pickle.dumps(layer)) == len(pickle.dumps(fresh))  # 395,870 bytes in float16


def test_the_hook_follows_a_replaced_or_edited_buffer() -> None:
    layer = _globally_pruned()
    hook = find_hook(layer, "weight")[1]
    layer.weight_mask = torch.ones(256, 256)  # a new buffer
    assert hook.mask is layer.weight_mask
    layer.weight_mask.data[0, 0] = 0  # an edit through .data
    layer.load_state_dict(_globally_pruned().state_dict())  # copied into the buffer
    assert hook.mask is layer.weight_mask
    layer(torch.ones(1, 256))
    assert torch.equal(layer.weight, layer.weight_orig * layer.weight_mask)


@pytest.mark.parametrize(
    "clone",
    [
        pytest.param(lambda m: pickle.loads(pickle.dumps(m)), id="pickle"),
        pytest.param(copy.deepcopy, id="deepcopy"),
    ],
)
def test_a_copy_reads_its_own_buffer(clone: Callable[[nn.Module], nn.Module]) -> None:
    layer = _globally_pruned()
    copied = clone(layer)
    hook = find_hook(copied, "weight")[1]
    assert isinstance(hook, CustomFromMask) and hook.reads_buffer
    assert hook.mask is copied.weight_mask and hook.mask is not layer.weight_mask
    assert torch.equal(hook.mask, layer.weight_mask)


def test_a_mask_set_by_hand_is_held_as_given() -> None:
    hook = CustomFromMask.of_buffer(_globally_pruned(), "weight")
    mask = torch.zeros(2)
    hook.mask = mask
    assert hook.mask is mask and not hook.reads_buffer


def test_the_mask_of_a_removed_pruning_is_an_error() -> None:
    layer = _globally_pruned()
    hook = find_hook(layer, "weight")[1]
    remove(layer, "weight")
    with pytest.raises(AttributeError, match=r"to hold weight_mask, but it is gone"):
        _ = hook.mask


def test_remove_of_a_tensor_pruned_by_torch_says_so() -> None:
    layer = torch_prune.l1_unstructured(nn.Linear(3, 2), "weight", amount=2)
    check = unchanged(layer)
    with pytest.raises(
        TypeError, match=r"pruned by torch.nn.utils.prune .*prune.remove\(module, 'weight'\)"
    ):
        remove(layer, "weight")
    check()
    assert isinstance(find_hook(layer, "weight")[1], torch_prune.L1Unstructured)
