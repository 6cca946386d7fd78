"""The Trainer callback with ``structure="channel"``: exact unit counts per step in training, and
a run resumed from a checkpoint mid-schedule pruning the units an uninterrupted one prunes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import make_trainer, masks
from tests.hf_models import tiny_llama

SCHEDULE = LinearSchedule(0.5, end_step=6, frequency=2)


def callback(masking: str) -> GradualPruningCallback:
    # Random units depend on the seed, the step and the units pruned before alone: the resumed
    # run's are those of the run never interrupted (its weights are not: the Trainer's resume is
    # not bit-exact on CPU).
    return GradualPruningCallback(
        SCHEDULE, structure="channel", masking=masking, method="random_unstructured", seed=7,  # type: ignore[arg-type]
        verbose=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "masking", [pytest.param("reparametrize", marks=pytest.mark.slow), "inplace"]
)
def test_a_resumed_run_prunes_the_channels_an_uninterrupted_run_prunes(
    tmp_path: Path, masking: str
) -> None:
    whole = callback(masking)
    make_trainer(tiny_llama(seed=0).train(), tmp_path / "whole", [whole], max_steps=6).train()
    total = whole.pruner.total_count()
    assert total == 3 * 48
    assert [(step, count) for step, _, count in whole.pruner.history] == [
        (2, round(SCHEDULE(2) * total)),
        (4, round(SCHEDULE(4) * total) - round(SCHEDULE(2) * total)),
        (6, round(0.5 * total) - round(SCHEDULE(4) * total)),
    ]

    first = callback(masking)
    make_trainer(
        tiny_llama(seed=0).train(), tmp_path / "split", [first], max_steps=3,
        save_strategy="steps", save_steps=3,
    ).train()  # fmt: skip
    second = callback(masking)
    model = tiny_llama(seed=1).train()
    trainer = make_trainer(model, tmp_path / "split", [second], max_steps=6)
    trainer.train(resume_from_checkpoint=str(tmp_path / "split" / "checkpoint-3"))
    assert second.pruner.history == whole.pruner.history
    ours, theirs = masks(model), masks(whole.pruner.model)
    assert sorted(ours) == sorted(theirs) and len(ours) == 9  # gate, up, down of 3 layers
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)
