"""``prune_one_shot``: load, calibrate, prune, save, against the pruner stepped by hand."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import calibrate, prune_one_shot
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tests.model_state import unchanged


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))


def _batches() -> list[Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(7, 6, generator=generator) for _ in range(3)]


def test_prune_one_shot_equals_the_pruner_calibrated_and_stepped_by_hand():
    model = _model()
    pruner = prune_one_shot(model, _batches(), 0.6)
    assert pruner.permanent and sorted(model[0].state_dict()) == ["bias", "weight"]
    assert not model[0]._forward_hooks  # Wanda's hooks are gone
    by_hand = _model()
    reference = Pruner(by_hand, OneShotSchedule(0.6), importance="wanda", scope="row")
    with torch.no_grad():
        for x in _batches():
            by_hand(x)
    reference.step()
    for i in (0, 2):
        assert torch.equal(model[i].weight, by_hand[i].weight_orig * by_hand[i].weight_mask)
    assert (model[0].weight == 0).sum(dim=1).tolist() == [round(0.6 * 6)] * 10


def test_calibration_restores_the_training_mode_and_runs_without_gradients():
    model = _model().train()
    pruner = Pruner(model, OneShotSchedule(0.5), importance="wanda")
    assert calibrate(pruner, _batches()) == 3
    assert model.training and all(p.grad is None for p in model.parameters())
    assert pruner.importance.batches() == {"0.weight": 3, "2.weight": 3}  # type: ignore[attr-defined]


def test_a_gradient_importance_calibrates_one_step_per_batch():
    model = _model()
    batches = [(x, torch.randn(7, 3)) for x in _batches()]

    def loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        return nn.functional.mse_loss(model(batch[0]), batch[1])

    pruner = prune_one_shot(
        model,
        batches,
        0.5,
        importance="taylor",
        scope="layerwise",
        forward=loss,
        make_permanent=False,
    )
    assert pruner.history[0][2] == 30 + 15
    assert all(p.grad is None for p in model.parameters())


def test_no_calibration_batch_fails_and_leaves_the_model_without_hooks():
    model = _model()
    check = unchanged(model)
    with pytest.raises(RuntimeError, match="run a calibration pass"):
        prune_one_shot(model, [], 0.5)
    check()


def test_a_gradient_importance_needs_a_loss():
    model = _model()
    check = unchanged(model)
    with pytest.raises(TypeError, match="return a scalar loss"):
        prune_one_shot(model, _batches(), 0.5, importance="movement")
    check()
