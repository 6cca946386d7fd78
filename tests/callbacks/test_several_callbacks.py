"""Two pruning callbacks in one trainer, on disjoint tensors: each logs its own series
(``pruning/<i>/...``, ``i`` its place among them), and a run resumed from a checkpoint continues
both as an uninterrupted one does."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.lit_helpers import TinyModule, masks_of

# net.0.weight (128 weights) to 50% over 4 steps, net.2.weight (64) to 25%: 16 and 4 per step.
SCHEDULES = (LinearSchedule(0.5, end_step=4), LinearSchedule(0.25, end_step=4))
PER_STEP = (16, 4)


def two_callbacks(method: str = "l1_unstructured") -> list[GradualPruning]:
    # Random units depend on the seed, the step and the units pruned before alone: a resumed
    # run's are those of the run never interrupted (its weights are not: the data restart).
    return [
        GradualPruning(SCHEDULES[0], method, include=["^net\\.0\\."], seed=7, verbose=False),
        GradualPruning(SCHEDULES[1], method, include=["^net\\.2\\."], seed=8, verbose=False),
    ]


def test_two_callbacks_log_two_series(make_trainer, tmp_path: Path) -> None:
    make_trainer(max_steps=6, callbacks=two_callbacks()).fit(TinyModule())

    with open(tmp_path / "logs" / "version_0" / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("pruning/0/pruned")]
    assert "pruning/sparsity" not in rows[0] and "pruning/1/sparsity" in rows[0]
    assert len(rows) == 6
    for step, row in enumerate(rows, start=1):
        for index, per_step in enumerate(PER_STEP):
            assert float(row[f"pruning/{index}/pruned"]) == per_step * min(step, 4)
            assert float(row[f"pruning/{index}/target_sparsity"]) == SCHEDULES[index](step)


def test_two_callbacks_resume_both(make_trainer, tmp_path: Path) -> None:
    whole = two_callbacks("random_unstructured")
    uninterrupted = TinyModule()
    make_trainer(max_steps=6, callbacks=whole, logger=False).fit(uninterrupted)

    saving = ModelCheckpoint(tmp_path, every_n_train_steps=3, save_top_k=-1)
    make_trainer(
        max_steps=3,
        callbacks=[*two_callbacks("random_unstructured"), saving],
        logger=False,
        enable_checkpointing=True,
    ).fit(TinyModule())
    resumed_callbacks = two_callbacks("random_unstructured")
    resumed = TinyModule(seed=1)  # the checkpoint brings the weights
    make_trainer(max_steps=6, callbacks=resumed_callbacks, logger=False).fit(
        resumed, ckpt_path=tmp_path / "epoch=0-step=3.ckpt"
    )

    for ours, theirs, per_step in zip(resumed_callbacks, whole, PER_STEP, strict=True):
        assert ours.pruner.history == theirs.pruner.history
        assert [(step, count) for step, _, count in ours.pruner.history] == [
            (step, per_step) for step in range(1, 5)
        ]
    ours_masks, theirs_masks = masks_of(resumed), masks_of(uninterrupted)
    assert sorted(ours_masks) == sorted(theirs_masks) == ["net.0.weight_mask", "net.2.weight_mask"]
    assert all(torch.equal(ours_masks[name], theirs_masks[name]) for name in theirs_masks)


def test_two_trainer_callbacks_log_two_series(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
    from tests.callbacks.hf_trainer_helpers import make_trainer
    from tests.hf_models import tiny_gpt2

    first = GradualPruningCallback(SCHEDULES[0], include=["^transformer\\.h\\.0\\."])
    second = GradualPruningCallback(SCHEDULES[1], include=["^transformer\\.h\\.1\\."])
    trainer = make_trainer(tiny_gpt2().train(), tmp_path, [first, second], max_steps=4)
    trainer.train()

    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 4 and "pruning/sparsity" not in logged[0]
    for step, entry in enumerate(logged, start=1):
        for index, callback in enumerate((first, second)):
            total = callback.pruner.total_count()
            assert entry[f"pruning/{index}/pruned"] == round(SCHEDULES[index](step) * total)
