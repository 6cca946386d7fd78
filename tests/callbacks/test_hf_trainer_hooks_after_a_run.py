"""Distillation under the Hugging Face ``Trainer`` acts in its training steps only: after an
exception outside the model's forward (in ``compute_loss``, in the data, in another callback, a
``KeyboardInterrupt``), caught, a plain forward of the model gets the model's own loss, no teacher
runs, and the model's and the optimizer's hooks are those they had before ``trainer.train()``.

The model's own loss is its ``loss_function`` applied to the logits of that very forward: the
same computation, in this process, so it equals ``outputs.loss`` exactly when nothing is added.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import Tokens, training_args, transformers
from tests.callbacks.test_hooks_after_a_run import optimizer_hooks
from tests.hf_models import tiny_gpt2
from tests.model_state import unchanged_hooks

FAIL_AT = 2  # the global step at which the run fails (distilled since step 0)


class FailingLoss(transformers.Trainer):  # type: ignore[misc]
    """Raises ``error`` in ``compute_loss`` at global step :data:`FAIL_AT`, before or after
    the model's forward."""

    def __init__(self, *args: Any, error: BaseException, after_forward: bool, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.error, self.after_forward = error, after_forward

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kw: Any) -> Any:
        failing = self.state.global_step == FAIL_AT
        if failing and not self.after_forward:
            raise self.error
        result = super().compute_loss(model, inputs, return_outputs, **kw)
        if failing:
            raise self.error  # the forward ran and its term was added, never back-propagated
        return result


class FailingCallback(transformers.TrainerCallback):  # type: ignore[misc]
    """Raises in ``on_step_end`` of global step :data:`FAIL_AT` (the step's own number before
    the Trainer counts it), before the pruning callback's turn: the step is never closed."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == FAIL_AT + 1:
            raise RuntimeError("boom in a callback")


class FailingData(Tokens):
    """Raises when asked for its item number ``fail_at`` (counted from 1, whatever the index:
    the Trainer shuffles), between two training steps."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at, self.asked = fail_at, 0

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        self.asked += 1
        if self.asked == self.fail_at:
            raise RuntimeError("boom in the data")
        return super().__getitem__(index)


def the_plain_forward_is_the_models_own(model: nn.Module, pruning: GradualPruningCallback) -> None:
    """A training forward with labels, as a plain loop runs it: its ``loss`` is the model's own
    (no KD term added), the teacher does not run, and a backward works."""
    distillation = pruning._session.distilling.distillation
    assert distillation is not None and distillation.teacher is not None
    calls: list[int] = []
    distillation.teacher.register_forward_hook(lambda *_: calls.append(1))
    ids = Tokens(count=4, seed=1).ids
    output = model.train()(input_ids=ids, labels=ids)
    own = model.loss_function(logits=output.logits, labels=ids, vocab_size=model.config.vocab_size)
    torch.testing.assert_close(output.loss, own, rtol=0, atol=0)  # the same computation
    assert calls == []
    output.loss.backward()


def distilled(trainer: Any) -> list[float]:
    """The ``pruning/distill_loss`` logged at each training step."""
    return [e["pruning/distill_loss"] for e in trainer.state.log_history if "loss" in e]


CASES = [
    pytest.param(RuntimeError("boom"), False, "inplace", id="compute-loss-before-the-forward"),
    pytest.param(RuntimeError("boom"), True, "reparametrize", id="compute-loss-after-the-forward"),
    pytest.param(KeyboardInterrupt(), False, "inplace", id="keyboard-interrupt"),
]


@pytest.mark.parametrize(("error", "after_forward", "masking"), CASES)
def test_an_exception_in_compute_loss_leaves_a_plain_model(
    tmp_path: Path, error: BaseException, after_forward: bool, masking: str
) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(
        OneShotSchedule(0.5),
        distill_weight=1.0,
        masking=masking,
        verbose=False,  # type: ignore[arg-type]
    )
    trainer = FailingLoss(
        model=model,
        args=training_args(tmp_path, max_steps=4),
        train_dataset=Tokens(),
        callbacks=[pruning],
        error=error,
        after_forward=after_forward,
    )
    check = unchanged_hooks(model)  # the masks are made with the Trainer: their hooks are in
    with pytest.raises(type(error)):
        trainer.train()
    assert len(distilled(trainer)) == FAIL_AT and min(distilled(trainer)) > 0
    the_plain_forward_is_the_models_own(model, pruning)
    check()
    assert optimizer_hooks(trainer.optimizer) == 0


def test_an_exception_in_another_callback_leaves_a_plain_model(tmp_path: Path) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(OneShotSchedule(0.5), distill_weight=1.0, verbose=False)
    trainer = transformers.Trainer(
        model=model,
        args=training_args(tmp_path, max_steps=4),
        train_dataset=Tokens(),
        callbacks=[FailingCallback(), pruning],
    )
    check = unchanged_hooks(model)
    with pytest.raises(RuntimeError, match="boom in a callback"):
        trainer.train()
    assert len(distilled(trainer)) == FAIL_AT and min(distilled(trainer)) > 0
    the_plain_forward_is_the_models_own(model, pruning)
    check()


def test_an_exception_in_the_data_leaves_a_plain_model(tmp_path: Path) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(
        OneShotSchedule(0.5), distill_weight=1.0, masking="inplace", verbose=False
    )
    batch = 4
    trainer = transformers.Trainer(
        model=model,
        args=training_args(tmp_path, max_steps=4, per_device_train_batch_size=batch),
        # The Trainer's loader (Accelerate's) fetches one batch ahead: the first item of batch
        # FAIL_AT + 1 is asked for as the batch of step FAIL_AT is handed out, before that step.
        train_dataset=FailingData(fail_at=(FAIL_AT + 1) * batch + 1),
        callbacks=[pruning],
    )
    check = unchanged_hooks(model)
    with pytest.raises(RuntimeError, match="boom in the data"):
        trainer.train()
    assert len(distilled(trainer)) == FAIL_AT and min(distilled(trainer)) > 0
    the_plain_forward_is_the_models_own(model, pruning)
    check()
    assert optimizer_hooks(trainer.optimizer) == 0
