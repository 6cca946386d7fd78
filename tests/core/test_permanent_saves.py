"""A model under pruning saves in the permanent form and loads it back; masks come back exactly
from the loaded zeros and the kept zeros."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import Pruner, permanent_state_dict
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.ao.pruning.saving.permanent_saves import kept_zeros, restore_masks, save_permanent
from tests.hf_models import tiny_gpt2, tiny_llama
from tests.model_state import unchanged

MASKINGS = ["reparametrize", "inplace"]


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _pruned(model: nn.Module, masking: str, sparsity: float = 0.6) -> Pruner:
    pruner = Pruner(model, OneShotSchedule(sparsity), masking=masking)  # type: ignore[arg-type]
    pruner.reparametrize()
    pruner.step()
    return pruner


def _masks(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: buffer.clone()
        for name, buffer in model.named_buffers(remove_duplicate=False)
        if name.endswith("_mask")
    }


@pytest.mark.parametrize("masking", MASKINGS)
def test_the_state_dict_is_the_permanent_one_and_the_model_is_unchanged(masking: str) -> None:
    model = _mlp()
    pruner = _pruned(model, masking)
    expected = permanent_state_dict(model)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    save_permanent(pruner)

    state = model.state_dict()
    assert list(state) == list(expected) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for name, value in expected.items():
        assert torch.equal(state[name], value), name
    # The model keeps its masks and values, and its live tensors in the training form.
    assert sorted(model.state_dict(keep_vars=True)) == sorted(before)
    for name, value in model.state_dict(keep_vars=True).items():
        assert torch.equal(value, before[name]), name
    fresh = _mlp(seed=1)
    fresh.load_state_dict(state, strict=True)
    x = torch.randn(5, 6)
    assert torch.equal(fresh(x), model(x))


@pytest.mark.parametrize("masking", MASKINGS)
def test_a_tied_weight_is_one_tensor_in_the_saved_state(masking: str) -> None:
    model = tiny_gpt2()
    save_permanent(_pruned(model, masking))
    state = model.state_dict()
    assert state["lm_head.weight"] is state["transformer.wte.weight"]
    assert not [key for key in state if key.endswith(("_orig", "_mask"))]


@pytest.mark.parametrize("masking", MASKINGS)
def test_a_saved_run_loads_back_with_its_masks_exactly(masking: str) -> None:
    model = tiny_llama()
    pruner = _pruned(model, masking, sparsity=0.5)
    up = model.model.layers[0].mlp.up_proj
    mask = up.weight_mask.reshape(-1) != 0
    values = (up.weight_orig if masking == "reparametrize" else up.weight).reshape(-1)
    zeroed = mask.nonzero().reshape(-1)[:5]
    with torch.no_grad():  # kept weights that are exactly zero (as a zero-initialised one)
        values[zeroed] = 0.0
    save_permanent(pruner)
    kept = kept_zeros(pruner)
    assert sorted(kept) == ["model.layers.0.mlp.up_proj.weight"]
    assert kept["model.layers.0.mlp.up_proj.weight"].tolist() == zeroed.tolist()
    saved = model.state_dict()

    fresh = tiny_llama(seed=1)
    resumed = Pruner(fresh, OneShotSchedule(0.5), masking=masking)  # type: ignore[arg-type]
    resumed.reparametrize()
    saves = save_permanent(resumed)
    assert resumed.pruned_count() == 0 < pruner.pruned_count()  # all kept before the load
    result = fresh.load_state_dict(saved, strict=True)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    assert saves.loaded() == resumed.targets
    restore_masks(resumed, kept, saves.loaded())

    expected = _masks(model)
    assert sorted(_masks(fresh)) == sorted(expected)
    for name, value in expected.items():
        assert torch.equal(_masks(fresh)[name], value), name
    tokens = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        assert torch.equal(fresh(tokens).logits, model(tokens).logits)
    assert resumed.pruned_count() == pruner.pruned_count()
    saves.forget_loads()
    assert saves.loaded() == []


@pytest.mark.parametrize("masking", MASKINGS)
def test_the_permanent_form_loads_its_zeros_as_the_masks(masking: str) -> None:
    model = _mlp()
    pruner = _pruned(model, masking)
    saves = save_permanent(pruner)
    other = _mlp(seed=2)
    _pruned(other, masking, sparsity=0.25)
    save_permanent(Pruner(other, OneShotSchedule(0.0), masking=masking))  # type: ignore[arg-type]
    result = model.load_state_dict(other.state_dict(), strict=True)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    assert saves.loaded() == ["0.weight", "2.weight"]
    for name, mask in _masks(other).items():
        assert torch.equal(_masks(model)[name], mask), name
    assert pruner.pruned_count() == round(0.25 * pruner.total_count())
    x = torch.randn(4, 6)
    assert torch.equal(model(x), other(x))


def test_a_tied_holder_left_out_of_the_file_is_missing_under_its_plain_name() -> None:
    model = tiny_gpt2()
    save_permanent(_pruned(model, "reparametrize"))
    state = model.state_dict()
    del state["lm_head.weight"]  # as save_pretrained writes a tied weight: once
    result = model.load_state_dict(state, strict=False)
    assert (result.missing_keys, result.unexpected_keys) == (["lm_head.weight"], [])


def test_a_lean_weight_trained_back_cannot_be_saved() -> None:
    model = _mlp()
    save_permanent(_pruned(model, "inplace"))
    with torch.no_grad():
        model[0].weight.add_(1.0)  # revives every pruned weight
    pruned = int((~model[0].weight_mask).sum())
    expected = rf"\(Linear, 'weight'\) \('0.weight'\).* {pruned} are not"
    with pytest.raises(ValueError, match=expected):
        model.state_dict()


def test_hooking_twice_hooks_each_module_once() -> None:
    model = _mlp()
    pruner = _pruned(model, "reparametrize")
    save_permanent(pruner)
    save_permanent(pruner)
    assert len(model[0]._state_dict_hooks) == 1
    assert len(model[0]._load_state_dict_pre_hooks) == 1
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_kept_zeros_that_name_no_target_are_refused() -> None:
    pruner = _pruned(_mlp(), "reparametrize")
    check = unchanged(pruner.model)
    with pytest.raises(ValueError, match=r"name targets of the pruner, but got \['fc.weight'\]"):
        restore_masks(pruner, {"fc.weight": torch.tensor([0])})
    with pytest.raises(ValueError, match=r"index its 48 units, but got 0..48"):
        restore_masks(pruner, {"0.weight": torch.tensor([0, 48])})
    check()
