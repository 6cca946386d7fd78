"""Rebuilding the reparametrization from a pruned state_dict so strict loading works."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.masking.restore import (
    is_pruned_state_dict,
    pruned_names,
    restore_pruning,
)
from tensorplay.ao.pruning.parity.methods import l1_unstructured, random_unstructured
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tests.model_state import unchanged


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)
    )


def pruned_model() -> nn.Module:
    model = make_model()
    l1_unstructured(model[0], "weight", amount=5)
    l1_unstructured(model[2], "weight", amount=0.5)
    l1_unstructured(model[2], "weight", amount=3)  # a PruningContainer
    random_unstructured(model[4], "bias", amount=1)
    return model


def hooks(model: nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) for m in model.modules())


def test_restore_then_strict_load_reproduces_the_model() -> None:
    saved = pruned_model()
    state = saved.state_dict()
    fresh = make_model(seed=1)
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "0.weight"'):
        fresh.load_state_dict(state, strict=True)
    assert restore_pruning(fresh, state) == ["0.weight", "2.weight", "4.bias"]
    fresh.load_state_dict(state, strict=True)
    assert list(fresh.state_dict()) == list(state)
    for key, value in state.items():
        assert torch.equal(fresh.state_dict()[key], value), key
    inputs = torch.randn(3, 1, 4, 4)
    assert torch.equal(fresh(inputs), saved(inputs))
    assert fresh[2].weight_mask.dtype == saved[2].weight_mask.dtype


def test_restored_mask_is_in_place_before_loading() -> None:
    state = pruned_model().state_dict()
    fresh = make_model(seed=1)
    restore_pruning(fresh, state)
    assert torch.equal(fresh[2].weight_mask, state["2.weight_mask"])
    assert torch.equal(fresh[2].weight, fresh[2].weight_orig * state["2.weight_mask"])


def test_already_pruned_tensors_are_skipped() -> None:
    state = pruned_model().state_dict()
    fresh = make_model(seed=1)
    l1_unstructured(fresh[0], "weight", amount=1)
    assert restore_pruning(fresh, state) == ["2.weight", "4.bias"]
    assert restore_pruning(fresh, state) == []
    fresh.load_state_dict(state, strict=True)
    assert torch.equal(fresh[0].weight_mask, state["0.weight_mask"])
    assert hooks(fresh) == 3


def test_a_restored_model_keeps_pruning_on_schedule() -> None:
    model = make_model()
    schedule = LinearSchedule(0.8, end_step=4)
    pruner = Pruner(model, schedule)
    for _ in range(3):
        pruner.step()
    fresh = make_model(seed=2)
    restore_pruning(fresh, model.state_dict())
    fresh.load_state_dict(model.state_dict(), strict=True)
    resumed = Pruner(fresh, schedule)
    resumed.load_state_dict(pruner.state_dict())
    assert resumed.total_count() == 18 + 32 + 8
    assert resumed.pruned_count() == pruner.pruned_count() == round(0.4 * 58)
    assert resumed.step() == pruner.step()
    assert torch.equal(fresh[2].weight_mask, model[2].weight_mask)
    assert resumed.pruned_count() == round(0.6 * 58)


def test_is_pruned_state_dict_and_pruned_names() -> None:
    assert is_pruned_state_dict(pruned_model().state_dict())
    assert not is_pruned_state_dict(make_model().state_dict())
    assert pruned_names({"a.w_orig": 0, "b.w_mask": 0, "c.w_orig": 0, "c.w_mask": 0}) == ["c.w"]
    assert not is_pruned_state_dict({"a.weight_orig": torch.zeros(1)})


def _with(state: dict[str, Tensor], **changes: Tensor) -> dict[str, Tensor]:
    updated = dict(state)
    updated.update({key.replace("__", "."): value for key, value in changes.items()})
    return updated


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        pytest.param(
            {"9__weight_orig": torch.ones(2), "9__weight_mask": torch.ones(2)},
            r"Expected the key '9.weight_orig' to name a tensor of the model, but the model has "
            r"no module '9'.",
            id="missing-module",
        ),
        pytest.param(
            {"1__weight_orig": torch.ones(2), "1__weight_mask": torch.ones(2)},
            r"Expected the key '1.weight_orig' to name a parameter, but \(Flatten, 'weight'\) is "
            r"not a parameter of module '1'.",
            id="missing-tensor",
        ),
        pytest.param(
            {"2__weight_orig": torch.ones(4, 9)},
            r"Expected '2.weight_orig' to have the shape of \(Linear, 'weight'\), \(4, 8\), but "
            r"got \(4, 9\).",
            id="orig-shape",
        ),
        pytest.param(
            {"2__weight_mask": torch.ones(8, 4)},
            r"Expected '2.weight_mask' to have the shape of \(Linear, 'weight'\), \(4, 8\), but "
            r"got \(8, 4\).",
            id="mask-shape",
        ),
    ],
)
def test_errors_leave_the_model_alone(changes: dict[str, Tensor], match: str) -> None:
    state = _with(pruned_model().state_dict(), **changes)
    fresh = make_model(seed=1)
    check = unchanged(fresh)
    with pytest.raises(ValueError, match=match):
        restore_pruning(fresh, state)
    check()
