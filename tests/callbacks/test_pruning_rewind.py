"""Iterative prune-finetune: rewinding, optimizer resets and per-tensor minimum density."""

from __future__ import annotations

import pytest
import torch

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.lit_helpers import TOTAL, MaskRecorder, TinyModule, masks_of

# Prunes 48 units at step 2 and 48 more at step 4 (step 0 prunes none).
SCHEDULE = LinearSchedule(0.5, end_step=4, frequency=2)
TARGETS = ("net.0.weight_orig", "net.2.weight_orig")


def _fit(make_trainer, callback: GradualPruning, steps: int = 4) -> tuple[TinyModule, MaskRecorder]:
    model, recorder = TinyModule(), MaskRecorder()
    trainer = make_trainer(max_steps=steps, callbacks=[callback, recorder], logger=False)
    trainer.fit(model)
    return model, recorder


@pytest.mark.parametrize(("rewind", "rewind_step"), [("init", 0), ("step", 1)])
def test_rewind_resets_unpruned_weights_after_each_pruning_event(make_trainer, rewind, rewind_step):
    callback = GradualPruning(SCHEDULE, rewind=rewind, rewind_step=rewind_step, verbose=False)
    model, recorder = _fit(make_trainer, callback)

    reference = recorder.weights[rewind_step]
    trained = recorder.weights[3]  # one step after the first rewind: trained again
    state = model.state_dict()
    for name in TARGETS:
        assert not torch.equal(trained[name], reference[name]), name
        assert torch.equal(state[name], reference[name]), name
        assert torch.equal(recorder.weights[2][name], reference[name]), name
    assert not torch.equal(state["net.0.bias"], reference["net.0.bias"])  # not a target
    assert [count for _, _, count in recorder.records] == [0, 0, 48, 48, 96]


def test_no_rewind_keeps_training(make_trainer):
    model, recorder = _fit(make_trainer, GradualPruning(SCHEDULE, verbose=False))

    for name in TARGETS:
        assert not torch.equal(model.state_dict()[name], recorder.weights[0][name])


@pytest.mark.parametrize(("reset", "expected"), [(True, [4, 0, 4, 0]), (False, [4, 4, 4, 4])])
def test_reset_optimizer_state_after_pruning_events(make_trainer, reset, expected):
    callback = GradualPruning(SCHEDULE, reset_optimizer_state=reset, verbose=False)
    _, recorder = _fit(make_trainer, callback)

    # SGD momentum buffers of the 4 parameters, after each optimizer step.
    assert recorder.optimizer_states == expected


@pytest.mark.parametrize(
    ("min_density", "expected"),
    [
        pytest.param(0.0, {"net.0.weight_mask": 51, "net.2.weight_mask": 64}, id="whole-layer"),
        pytest.param(0.25, {"net.0.weight_mask": 67, "net.2.weight_mask": 48}, id="keep-a-quarter"),
    ],
)
def test_min_density_keeps_part_of_every_tensor(make_trainer, min_density, expected):
    model = TinyModule()
    with torch.no_grad():
        model.net[2].weight.mul_(1e-3)  # the smallest magnitudes: global L1 takes them first
    callback = GradualPruning(OneShotSchedule(0.6), min_density=min_density, verbose=False)
    make_trainer(max_steps=1, callbacks=[callback], logger=False).fit(model)

    zeros = {name: int((mask == 0).sum()) for name, mask in masks_of(model).items()}
    assert zeros == expected
    assert sum(zeros.values()) == round(0.6 * TOTAL)
