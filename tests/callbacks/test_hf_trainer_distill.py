"""Distillation under the Hugging Face Trainer callback: the gradients of task + KD under
gradient accumulation, the teacher, the forwards that count (the training steps'), resume,
logging and the errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import dense_copy, kd_loss
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import (
    TEACHER_FILE,
    GradualPruningCallback,
)
from tests.callbacks.hf_trainer_helpers import (
    StepRecorder,
    Tokens,
    make_trainer,
    masks,
    transformers,
)
from tests.hf_models import tiny_gpt2


class Recorder(transformers.TrainerCallback):  # type: ignore[misc]
    """After the pruning callback: a plain copy of the model when training begins (after
    pruning step 0), the inputs of its training forwards and the first step's gradients."""

    def __init__(self) -> None:
        self.start: nn.Module | None = None
        self.inputs: list[dict[str, Any]] = []
        self.grads: dict[str, Tensor] = {}
        self.masks: dict[str, Tensor] = {}
        self._handle: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any, **kw: Any) -> None:
        self.start = dense_copy(model)
        self.masks = masks(model)
        self._handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, model: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if model.training and torch.is_grad_enabled():
            self.inputs.append(dict(kwargs))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if not self.grads:
            model = kw["model"]
            self.grads = {n: p.grad.clone() for n, p in model.named_parameters()}

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._handle.remove()


def _by_hand(
    recorder: Recorder, teacher: nn.Module, distill: bool, bf16: bool = False
) -> dict[str, Tensor]:
    """Autograd of the task loss as the Trainer has the model compute it (a mean per
    micro-batch averaged over them, or summed over the accumulated batch's tokens divided by
    their count) + the mean over the micro-batches of KD."""
    model = recorder.start
    assert model is not None
    model.train().requires_grad_(True).zero_grad()
    total = torch.zeros(())
    for kwargs in recorder.inputs:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            output = model(input_ids=kwargs["input_ids"], labels=kwargs["labels"])
            kd = kd_loss(output.logits, teacher(input_ids=kwargs["input_ids"]).logits)
            task = output.loss / len(recorder.inputs)  # the Trainer divides by micro-batches
            if "num_items_in_batch" in kwargs:  # the model sums, divided by the tokens of all
                given = {k: kwargs[k] for k in ("input_ids", "labels", "num_items_in_batch")}
                task = model(**given).loss
        total = total + (task + kd / len(recorder.inputs) if distill else task)
    total.backward()
    grads = {}
    for name, param in model.named_parameters():
        mask = recorder.masks.get(f"{name}_mask")
        grads[name] = param.grad.clone() if mask is None else param.grad * mask
    return grads


@pytest.mark.parametrize(
    ("items", "bf16"),
    [
        pytest.param(True, False, id="num-items-in-batch"),
        pytest.param(False, False, id="mean-per-batch"),
        pytest.param(True, True, id="bf16-mixed"),
    ],
)
def test_gradients_are_those_of_task_plus_kd_under_accumulation(
    tmp_path: Path, items: bool, bf16: bool
) -> None:
    model = tiny_gpt2(dropout=0.0).train()
    initial = dense_copy(model).state_dict()
    # Under bf16 a teacher far from the model (another init): its term must stand well above
    # bf16's rounding of the gradient (a bf16 product carries 8 significant bits).
    given = tiny_gpt2(seed=1, dropout=0.0) if bf16 else None
    if given is not None:
        initial = {k: v.clone() for k, v in given.state_dict().items()}
    pruning = GradualPruningCallback(
        OneShotSchedule(0.5), masking="inplace", distill_weight=1.0, teacher=given, verbose=False
    )
    recorder = Recorder()
    trainer = make_trainer(
        model, tmp_path, [pruning, recorder], max_steps=1, gradient_accumulation_steps=2,
        max_grad_norm=0.0, bf16=bf16,
    )  # fmt: skip
    trainer.model_accepts_loss_kwargs = items  # GPT-2 takes them: the Trainer's default path
    trainer.train()

    assert len(recorder.inputs) == 2
    assert all(("num_items_in_batch" in kwargs) == items for kwargs in recorder.inputs)
    distillation = pruning._session.distilling.distillation
    assert distillation is not None and distillation.teacher is not None
    teacher = distillation.teacher
    # The teacher: the model before the first pruning step (as built) or the one given,
    # untouched by training.
    assert sorted(teacher.state_dict()) == sorted(initial)
    for name, value in teacher.state_dict().items():
        assert torch.equal(value, initial[name]), name
    # No hook of the callback's is left on the model.
    assert len(model._forward_hooks) == 0 and not distillation.attached

    expected = _by_hand(recorder, teacher, distill=True, bf16=bf16)
    task_only = _by_hand(recorder, teacher, distill=False, bf16=bf16)
    assert sorted(recorder.grads) == sorted(expected)
    # Under bf16 the Trainer's rounding and this one's differ by about 0.2% of the gradient
    # (bf16 carries 8 significant bits); the term, far larger, must be there at its weight (a
    # term missing, halved or doubled would leave half of it or more).
    if bf16:
        names = sorted(expected)
        got, want = (torch.cat([g[n].flatten() for n in names]) for g in (recorder.grads, expected))
        without = torch.cat([task_only[n].flatten() for n in names])
        off = float((got - want).norm())
        assert off <= 0.01 * float(want.norm())
        assert off <= 0.25 * float((want - without).norm())
    for name, grad in expected.items():
        if not bf16:
            torch.testing.assert_close(recorder.grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    moved = max(float((expected[n] - task_only[n]).abs().max()) for n in expected)
    assert moved > 1e-3  # the KD term is in the gradient measurably
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 1 and logged[0]["pruning/distill_loss"] > 0


class ForwardBetweenSteps(transformers.TrainerCallback):  # type: ignore[misc]
    """After the pruning callback: at each ``on_step_end`` (outside the Trainer's training
    steps), a training forward of the model with labels, its ``loss`` kept with the model's own
    (its ``loss_function`` on that forward's logits: the same computation, in this process)."""

    def __init__(self) -> None:
        self.losses: list[tuple[Tensor, Tensor]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any, **kw: Any) -> None:
        ids = Tokens(count=2, seed=state.global_step).ids
        output = model.train()(input_ids=ids, labels=ids)
        own = model.loss_function(
            logits=output.logits, labels=ids, vocab_size=model.config.vocab_size
        )
        self.losses.append((output.loss.detach(), own.detach()))


def test_a_forward_between_training_steps_adds_nothing_and_is_not_seen(tmp_path: Path) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(OneShotSchedule(0.5), distill_weight=1.0, verbose=False)
    between = ForwardBetweenSteps()
    trainer = make_trainer(
        model, tmp_path, [pruning, between], max_steps=3, gradient_accumulation_steps=2
    )
    trainer.train()  # such a forward's term would never reach a backward: an error
    distillation = pruning._session.distilling.distillation
    assert distillation is not None
    assert distillation.forwards == 3 * 2  # the micro-batches of the training steps alone
    assert len(between.losses) == 3
    for loss, own in between.losses:
        torch.testing.assert_close(loss, own, rtol=0, atol=0)
    logged = [
        entry["pruning/distill_loss"] for entry in trainer.state.log_history if "loss" in entry
    ]
    assert len(logged) == 3 and min(logged) > 0


class OwnBegin(GradualPruningCallback):
    """A subclass with its own ``on_train_begin`` (calling the callback's)."""

    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        super().on_train_begin(*args, **kwargs)


class OwnStepBegin(GradualPruningCallback):
    """A subclass whose ``on_step_begin`` does not call the callback's."""

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        pass


def test_a_subclass_distils_every_step_or_says_why_it_cannot(tmp_path: Path) -> None:
    pruning = OwnBegin(OneShotSchedule(0.5), distill_weight=1.0, verbose=False)
    trainer = make_trainer(tiny_gpt2().train(), tmp_path, [pruning], max_steps=3)
    trainer.train()
    distillation = pruning._session.distilling.distillation
    assert distillation is not None and distillation.forwards == 3
    logged = [
        entry["pruning/distill_loss"] for entry in trainer.state.log_history if "loss" in entry
    ]
    assert len(logged) == 3 and min(logged) > 0

    model = tiny_gpt2().train()
    unopened = OwnStepBegin(OneShotSchedule(0.5), distill_weight=1.0, verbose=False)
    trainer = make_trainer(model, tmp_path / "unopened", [unopened], max_steps=3)
    with pytest.raises(RuntimeError, match=r"must call `super\(\).on_step_begin"):
        trainer.train()
    assert trainer.state.global_step == 1 and len(model._forward_hooks) == 0


def test_a_resumed_run_distils_from_the_same_teacher(tmp_path: Path) -> None:
    schedule = LinearSchedule(0.6, start_step=1, end_step=5, frequency=1)  # the teacher: step 1

    def callback() -> GradualPruningCallback:
        return GradualPruningCallback(schedule, distill_weight=1.0, verbose=False)

    first = callback()
    recorder = StepRecorder(first)
    model = tiny_gpt2(seed=0, dropout=0.0).train()
    trainer = make_trainer(
        model, tmp_path, [first, recorder], max_steps=6, save_strategy="steps", save_steps=3
    )
    trainer.train()
    teacher = first._session.distilling.distillation.teacher.state_dict()  # type: ignore[union-attr]
    assert any(not torch.equal(v, tiny_gpt2(seed=0).state_dict()[k]) for k, v in teacher.items())
    checkpoint = tmp_path / "checkpoint-3"
    assert (checkpoint / TEACHER_FILE).is_file()

    second = callback()
    resumed = StepRecorder(second)
    fresh = tiny_gpt2(seed=1, dropout=0.0).train()  # other weights: all from the checkpoint
    trainer = make_trainer(fresh, tmp_path, [second, resumed], max_steps=6)
    trainer.train(resume_from_checkpoint=str(checkpoint))

    again = second._session.distilling.distillation.teacher.state_dict()  # type: ignore[union-attr]
    assert sorted(again) == sorted(teacher)
    for name, value in teacher.items():
        assert torch.equal(again[name], value), name
    assert second.pruner.history == first.pruner.history
    assert sorted(resumed.masks[6]) == sorted(recorder.masks[6])
    for name, mask in recorder.masks[6].items():
        assert torch.equal(resumed.masks[6][name], mask), name
    final = model.state_dict()
    for name, value in fresh.state_dict().items():
        torch.testing.assert_close(value, final[name], atol=1e-6, rtol=1e-5, msg=name)


def test_resuming_without_the_saved_teacher_fails_naming_the_file(tmp_path: Path) -> None:
    schedule = OneShotSchedule(0.5)
    first = GradualPruningCallback(schedule, distill_weight=1.0, verbose=False)
    trainer = make_trainer(
        tiny_gpt2().train(), tmp_path, [first], max_steps=2, save_strategy="steps", save_steps=2
    )
    trainer.train()
    (tmp_path / "checkpoint-2" / TEACHER_FILE).unlink()
    second = GradualPruningCallback(schedule, distill_weight=1.0, verbose=False)
    trainer = make_trainer(tiny_gpt2().train(), tmp_path, [second], max_steps=4)
    with pytest.raises(
        ValueError, match=rf"teacher saved with the checkpoint of step 2 .*{TEACHER_FILE}"
    ):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


class LogitsLossTrainer(transformers.Trainer):  # type: ignore[misc]
    """A custom ``compute_loss`` that ignores ``outputs.loss``."""

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kw: Any) -> Any:
        logits = model(input_ids=inputs["input_ids"], labels=inputs["labels"]).logits
        return logits.logsumexp(-1).mean()


def test_a_loss_that_drops_the_term_fails_before_the_first_step(tmp_path: Path) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(OneShotSchedule(0.5), distill_weight=1.0, verbose=False)
    recorder = StepRecorder(pruning)
    trainer = LogitsLossTrainer(
        model=model,
        args=make_trainer(model, tmp_path, []).args,
        train_dataset=make_trainer(model, tmp_path, []).train_dataset,
        callbacks=[pruning, recorder],
    )
    with pytest.raises(RuntimeError, match=r"did not: .*custom `compute_loss`.*outputs.loss"):
        trainer.train()
    assert recorder.masks == {}  # no optimizer step was taken


def test_a_compute_loss_func_without_labels_fails_at_the_first_forward(tmp_path: Path) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(OneShotSchedule(0.5), distill_weight=1.0, verbose=False)
    trainer = transformers.Trainer(
        model=model,
        args=make_trainer(model, tmp_path, []).args,
        train_dataset=make_trainer(model, tmp_path, []).train_dataset,
        callbacks=[pruning],
        compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.logits.mean(),
    )
    with pytest.raises(ValueError, match=r"carry its `loss`.*`compute_loss_func`"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_a_teacher_of_another_vocabulary_fails_at_the_first_forward(tmp_path: Path) -> None:
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=101)
    teacher = transformers.GPT2LMHeadModel(config)
    pruning = GradualPruningCallback(
        OneShotSchedule(0.5), distill_weight=1.0, teacher=teacher, verbose=False
    )
    trainer = make_trainer(tiny_gpt2().train(), tmp_path, [pruning], max_steps=2)
    with pytest.raises(ValueError, match=r"teacher's logits .* 101\) for the teacher"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_bad_distillation_arguments_fail_at_construction() -> None:
    with pytest.raises(ValueError, match=r"`distill_weight`.*-0.5"):
        GradualPruningCallback(OneShotSchedule(0.5), distill_weight=-0.5)
    with pytest.raises(ValueError, match=r"`distill_temperature`.*-2"):
        GradualPruningCallback(OneShotSchedule(0.5), distill_temperature=-2)


def test_a_given_teacher_has_no_plain_form_for_restored_callback_states(tmp_path: Path) -> None:
    pruning = GradualPruningCallback(OneShotSchedule(0.5), distill_weight=1.0, teacher=tiny_gpt2())
    with pytest.raises(ValueError, match=r"`teacher` module or `example_inputs` were given"):
        make_trainer(
            tiny_gpt2().train(), tmp_path, [pruning], restore_callback_states_from_checkpoint=True
        )
