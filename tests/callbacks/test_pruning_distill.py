"""Distillation under the Lightning callback: the gradients of task + KD, the teacher, resume,
logging and the errors."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.strategies import DeepSpeedStrategy, ModelParallelStrategy
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.utils import prune

from tensorplay.ao.pruning import kd_loss
from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule
from tensorplay.callbacks import GradualPruning
from tensorplay.callbacks.core.lifecycle import AdapterOptions
from tensorplay.callbacks.lightning.strategies import check_distilled_strategy, check_strategy
from tests.callbacks.lit_helpers import LIGHTNING_SETS, TinyModule, masks_of
from tests.model_state import unchanged


class GradRecorder(Callback):
    """Put after the pruning callback: the model's state when training starts (after a pruning
    step 0) and the gradients of the first optimizer step."""

    def __init__(self) -> None:
        self.start: dict[str, Tensor] = {}
        self.grads: dict[str, Tensor] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if not self.grads:
            self.grads = {n: p.grad.clone() for n, p in pl_module.named_parameters()}


def _by_hand(
    start: dict[str, Tensor], teacher: nn.Module, batches: list[Any], distill: bool, bf16: bool
) -> dict[str, Tensor]:
    """Autograd of mean over the micro-batches of (cross-entropy + KD), for the masked model
    in ``start``."""
    model = TinyModule()
    for name in ("net.0", "net.2"):
        prune.custom_from_mask(model.get_submodule(name), "weight", start[f"{name}.weight_mask"])
    model.load_state_dict(start)
    total = torch.zeros(())
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
            task = F.cross_entropy(logits, y)
            with torch.no_grad():
                teacher_logits = teacher(x)
        kd = kd_loss(logits, teacher_logits, temperature=2.0, weight=1.0)
        total = total + (task + kd if distill else task) / len(batches)
    total.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_gradients_are_those_of_task_plus_kd_under_accumulation(make_trainer, precision):
    pruning = GradualPruning(OneShotSchedule(0.5), distill_weight=1.0, verbose=False)
    recorder = GradRecorder()
    trainer = make_trainer(
        max_steps=1, accumulate_grad_batches=2, precision=precision, callbacks=[pruning, recorder]
    )
    model = TinyModule()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.fit(model)

    distillation = pruning._session.distilling.distillation
    assert distillation is not None
    teacher = distillation.teacher
    assert teacher is not None
    # The teacher is the model just before the first pruning step (here: as initialised),
    # untouched by training, and no hook is left on the model.
    assert sorted(teacher.state_dict()) == sorted(initial)
    for name, value in teacher.state_dict().items():
        assert torch.equal(value, initial[name]), name
    assert not any(p.requires_grad for p in teacher.parameters())
    assert len(model._forward_hooks) == 0 and not distillation.attached

    batches = list(model.train_dataloader())[:2]
    bf16 = precision == "bf16-mixed"
    expected = _by_hand(recorder.start, teacher, batches, distill=True, bf16=bf16)
    task_only = _by_hand(recorder.start, teacher, batches, distill=False, bf16=bf16)
    assert sorted(recorder.grads) == sorted(expected)
    tolerance = {"atol": 1e-5, "rtol": 1e-3} if bf16 else {"atol": 1e-7, "rtol": 1e-5}
    for name, grad in expected.items():
        torch.testing.assert_close(recorder.grads[name], grad, **tolerance, msg=name)
    # The KD term moved the gradient measurably (the test could fail without it).
    assert (recorder.grads["net.2.weight_orig"] - task_only["net.2.weight_orig"]).abs().max() > 1e-3
    assert float(trainer.callback_metrics["pruning/distill_loss"]) > 0


def test_distillation_starts_at_the_first_pruning_step(make_trainer):
    """Before the first pruning step there is no teacher; from it the model as it was then."""
    seen: dict[int, bool] = {}

    class Watcher(Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            seen[trainer.global_step] = pruning._session.distilling.attached

    pruning = GradualPruning(OneShotSchedule(0.5, step=2), distill_weight=1.0, verbose=False)
    weights: dict[str, Tensor] = {}

    class Keeper(Callback):  # before the pruning callback: the weights just before its step
        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if trainer.global_step == 2:
                for name in ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"):
                    weights[name] = pl_module.get_parameter(name.replace("weight", "weight_orig"))
                    weights[name] = weights[name].detach().clone()

    trainer = make_trainer(max_steps=4, callbacks=[Keeper(), pruning, Watcher()])
    trainer.fit(TinyModule())
    assert seen == {0: False, 1: False, 2: True, 3: True}
    teacher = pruning._session.distilling.distillation.teacher  # type: ignore[union-attr]
    assert sorted(teacher.state_dict()) == sorted(weights)
    for name, value in weights.items():
        assert torch.equal(teacher.state_dict()[name], value), name


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_a_resumed_run_distils_from_the_same_teacher(make_trainer, tmp_path):
    # Pruning steps 1, 3, 5: the teacher is the model after one optimizer step (not its init).
    schedule = CubicSchedule(0.75, start_step=1, end_step=5, frequency=2)

    def callback() -> GradualPruning:
        return GradualPruning(schedule, distill_weight=1.0, distill_temperature=3.0, verbose=False)

    first = callback()
    # 4 steps an epoch: the checkpoint of epoch 0 is mid-schedule.
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "a", save_top_k=-1, every_n_epochs=1)
    uninterrupted = TinyModule(samples=32)
    trainer = make_trainer(max_epochs=2, callbacks=[first, checkpoints], enable_checkpointing=True)
    trainer.fit(uninterrupted)
    teacher = first._session.distilling.distillation.teacher.state_dict()  # type: ignore[union-attr]
    assert any(not torch.equal(v, TinyModule().state_dict()[k]) for k, v in teacher.items())

    path = tmp_path / "a" / "epoch=0-step=4.ckpt"
    saved = torch.load(path, weights_only=True)
    (state,) = [v for k, v in saved["callbacks"].items() if k.startswith("GradualPruning")]
    assert sorted(state["distill_teacher"]) == sorted(teacher)  # saved once per checkpoint

    resumed_callback = callback()
    resumed = TinyModule(seed=1, samples=32)  # another init: all must come from the checkpoint
    trainer = make_trainer(max_epochs=2, callbacks=[resumed_callback], logger=False)
    trainer.fit(resumed, ckpt_path=path)

    again = resumed_callback._session.distilling.distillation.teacher.state_dict()  # type: ignore[union-attr]
    assert sorted(again) == sorted(teacher)
    for name, value in teacher.items():
        assert torch.equal(again[name], value), name
    assert resumed_callback.pruner.history == first.pruner.history
    expected_masks, masks = masks_of(uninterrupted), masks_of(resumed)
    assert sorted(masks) == sorted(expected_masks)
    for name, mask in expected_masks.items():
        assert torch.equal(masks[name], mask), name
    final = uninterrupted.state_dict()
    for name, value in resumed.state_dict().items():
        torch.testing.assert_close(value, final[name], atol=1e-6, rtol=1e-6, msg=name)


class NeverCallsForward(TinyModule):
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)  # not self(x): the callback cannot see it


class ManualTiny(TinyModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


def test_a_training_step_that_never_calls_forward_fails_before_any_step(make_trainer):
    pruning = GradualPruning(OneShotSchedule(0.5), distill_weight=1.0, verbose=False)
    trainer = make_trainer(max_steps=2, callbacks=[pruning])
    with pytest.raises(RuntimeError, match=r"one training forward .* but saw 0.*self\(\.\.\.\)"):
        trainer.fit(NeverCallsForward())
    assert trainer.global_step == 0


def test_a_teacher_of_another_shape_fails_at_the_first_forward(make_trainer):
    model = TinyModule()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    teacher = nn.Linear(8, 3)  # 3 logits for the student's 4
    pruning = GradualPruning(
        OneShotSchedule(0.5, step=1), distill_weight=1.0, teacher=teacher, verbose=False
    )
    trainer = make_trainer(max_steps=2, callbacks=[pruning])
    with pytest.raises(ValueError, match=r"teacher's logits .* \(8, 3\) for the teacher"):
        trainer.fit(model)
    assert trainer.global_step == 0
    for name, value in before.items():  # the weights as the model computes with them
        module, _, tensor = name.rpartition(".")
        assert torch.equal(getattr(model.get_submodule(module), tensor), value), name


def test_manual_optimization_is_refused_at_setup(make_trainer):
    trainer = make_trainer(callbacks=[GradualPruning(OneShotSchedule(0.5), distill_weight=0.5)])
    model = ManualTiny()
    check = unchanged(model, ignoring=LIGHTNING_SETS)
    with pytest.raises(ValueError, match=r"automatic optimization.*distill_weight=0.5"):
        trainer.fit(model)
    check()


def test_model_parallel_is_served_and_deepspeed_refused_when_distilling():
    config = PrunerConfig(OneShotSchedule(0.5), masking="inplace")
    check_strategy(ModelParallelStrategy(), config, AdapterOptions(distill_weight=1.0))
    with pytest.raises(ValueError, match=r"distill_weight=1.0 under `DeepSpeedStrategy`"):
        deepspeed = DeepSpeedStrategy.__new__(DeepSpeedStrategy)  # deepspeed is not installed
        check_distilled_strategy(deepspeed, AdapterOptions(distill_weight=1.0))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        pytest.param({"distill_weight": -1.0}, ValueError, r"`distill_weight`.*-1.0", id="weight"),
        pytest.param({"distill_weight": "1"}, TypeError, r"`distill_weight`.*'1'", id="weight-str"),
        pytest.param(
            {"distill_temperature": 0.0}, ValueError, r"`distill_temperature`.*0.0", id="temp"
        ),
        pytest.param({"teacher": "gpt2"}, TypeError, r"`teacher`.*'gpt2'", id="teacher"),
    ],
)
def test_bad_distillation_arguments_fail_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        GradualPruning(OneShotSchedule(0.5), **kwargs)
    callback = GradualPruning(OneShotSchedule(0.5))
    name, value = next(iter(kwargs.items()))
    with pytest.raises(error, match=match):  # set later, checked the same
        setattr(callback, name, value)
    assert callback.distill_weight == 0.0 and callback.teacher is None


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_resuming_past_the_first_pruning_step_without_a_saved_teacher_fails(make_trainer, tmp_path):
    schedule = CubicSchedule(0.75, start_step=1, end_step=5, frequency=2)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "a", save_top_k=-1, every_n_epochs=1)
    first = GradualPruning(schedule, verbose=False)  # saved without distillation
    trainer = make_trainer(max_epochs=1, callbacks=[first, checkpoints], enable_checkpointing=True)
    trainer.fit(TinyModule(samples=32))
    resumed = GradualPruning(schedule, distill_weight=1.0, verbose=False)
    trainer = make_trainer(max_epochs=2, callbacks=[resumed], logger=False)
    with pytest.raises(RuntimeError, match=r"teacher .*step 3\) in the checkpoint .* holds none"):
        trainer.fit(TinyModule(samples=32), ckpt_path=tmp_path / "a" / "epoch=0-step=4.ckpt")
