"""``load_best_model_at_end=True`` with the best checkpoint saved before the schedule's end: the
model and the pruner are that checkpoint's, exactly, and a warning gives both sparsities."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks import PruningRollbackWarning
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import StepRecorder, Tokens, training_args, transformers
from tests.hf_models import tiny_gpt2

SCHEDULE = LinearSchedule(0.6, end_step=6, frequency=2)  # prunes at steps 2, 4 and 6


class FirstIsBest:
    """``compute_metrics`` whose score falls at every evaluation: the first one is the best."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prediction: Any) -> dict[str, float]:
        self.calls += 1
        return {"score": -float(self.calls)}


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_the_best_checkpoint_before_the_end_is_loaded_with_its_masks_and_a_warning(
    masking: str, tmp_path: Path
) -> None:
    pruning = GradualPruningCallback(SCHEDULE, masking=masking, verbose=False)  # type: ignore[arg-type]
    recorder = StepRecorder(pruning)
    args = training_args(
        tmp_path, max_steps=8, eval_strategy="steps", eval_steps=2, save_strategy="steps",
        save_steps=2, load_best_model_at_end=True, metric_for_best_model="score",
        greater_is_better=True, per_device_eval_batch_size=4,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=tiny_gpt2().train(), args=args, train_dataset=Tokens(),
        eval_dataset=Tokens(count=4, seed=1), compute_metrics=FirstIsBest(),
        callbacks=[pruning, recorder],
    )  # fmt: skip
    total = pruning.pruner.total_count()
    with pytest.warns(PruningRollbackWarning) as warned:
        trainer.train()

    assert trainer.state.best_global_step == 2
    rollbacks = [w for w in warned if issubclass(w.category, PruningRollbackWarning)]
    assert len(rollbacks) == 1
    message = str(rollbacks[0].message)
    assert "a checkpoint of step 2 was loaded into the model after the run had reached step 8" in (
        message
    )
    assert "are 20.00% sparse, not the 60.00% the run had pruned them to" in message
    assert "eval_delay=<its last pruning step>" in message
    # The model and the pruner are the best checkpoint's, exactly.
    assert pruning.pruner.last_step == 2
    assert pruning.pruner.pruned_count() == round(SCHEDULE(2) * total) < round(0.6 * total)
    assert [step for step, _, _ in pruning.pruner.history] == [2]
    model = pruning.pruner.model
    now = {
        name: buffer
        for name, buffer in model.named_buffers(remove_duplicate=False)
        if name.endswith("_mask")
    }
    assert sorted(now) == sorted(recorder.masks[2])
    for name, mask in recorder.masks[2].items():
        assert torch.equal(now[name], mask), name


def test_the_best_checkpoint_at_the_end_loads_without_a_warning(tmp_path: Path) -> None:
    pruning = GradualPruningCallback(SCHEDULE, verbose=False)
    args = training_args(
        tmp_path, max_steps=8, eval_strategy="steps", eval_steps=4, save_strategy="steps",
        save_steps=4, load_best_model_at_end=True, eval_delay=6, per_device_eval_batch_size=4,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=tiny_gpt2().train(), args=args, train_dataset=Tokens(),
        eval_dataset=Tokens(count=4, seed=1), callbacks=[pruning],
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        trainer.train()
    assert not [w for w in warned if issubclass(w.category, PruningRollbackWarning)]
    assert trainer.state.best_global_step == 8
    assert pruning.pruner.pruned_count() == round(0.6 * pruning.pruner.total_count())
