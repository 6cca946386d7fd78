"""GradualPruning prunes exactly on optimizer steps and logs what it did."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, LinearSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.lit_helpers import TOTAL, MaskRecorder, TinyModule, ValidatedTiny, masks_of

# LinearSchedule(0.5, end_step=4) over TOTAL = 192 units: 24 more units per step up to 96.
LINEAR_COUNTS = [0, 24, 48, 72, 96, 96, 96]


def _cubic_counts(final: float, n: int, steps: int) -> list[int]:
    # Zhu & Gupta with s_i = 0, t0 = 0, dt = 1, written out independently of the schedule code.
    return [round(final * (1 - (1 - min(t, n) / n) ** 3) * TOTAL) for t in range(steps + 1)]


@pytest.mark.parametrize(
    ("schedule", "steps", "expected"),
    [
        pytest.param(LinearSchedule(0.5, end_step=4), 6, LINEAR_COUNTS, id="linear"),
        pytest.param(CubicSchedule(0.9, end_step=10), 12, _cubic_counts(0.9, 10, 12), id="cubic"),
    ],
)
def test_exact_pruned_count_after_every_optimizer_step(make_trainer, schedule, steps, expected):
    recorder = MaskRecorder()
    trainer = make_trainer(
        max_steps=steps,
        max_epochs=None,
        callbacks=[GradualPruning(schedule, verbose=False), recorder],
        limit_val_batches=2,
        val_check_interval=3,
        num_sanity_val_steps=2,
        logger=False,
    )
    trainer.fit(ValidatedTiny())  # validation and its sanity check run but never prune

    assert len(recorder.records) == steps + 1
    assert [step for step, _, _ in recorder.records] == list(range(steps + 1))
    assert [count for _, _, count in recorder.records] == expected


def test_gradient_accumulation_prunes_on_optimizer_steps(make_trainer):
    recorder = MaskRecorder()
    callback = GradualPruning(LinearSchedule(0.5, end_step=4), verbose=False)
    trainer = make_trainer(accumulate_grad_batches=2, callbacks=[callback, recorder], logger=False)
    trainer.fit(TinyModule())

    # (global_step, batch_idx, pruned) after on_train_start and each of the 8 batches.
    assert recorder.records == [
        (0, -1, 0),
        (0, 0, 0),
        (1, 1, 24),
        (1, 2, 24),
        (2, 3, 48),
        (2, 4, 48),
        (3, 5, 72),
        (3, 6, 72),
        (4, 7, 96),
    ]
    assert callback.pruner.last_pruned_step == 4


def _read_metrics(log_dir: Path) -> list[dict[str, str]]:
    with open(log_dir / "metrics.csv", newline="") as file:
        return [row for row in csv.DictReader(file) if row.get("pruning/sparsity")]


def test_metrics_in_csv_logger(make_trainer, tmp_path):
    recorder = MaskRecorder()
    callback = GradualPruning(LinearSchedule(0.5, end_step=4), log_per_tensor=True, verbose=False)
    trainer = make_trainer(max_steps=6, callbacks=[callback, recorder])
    trainer.fit(TinyModule())

    rows = _read_metrics(tmp_path / "logs" / "version_0")
    assert len(rows) == 6
    per_tensor = ["pruning/sparsity/net.0.weight", "pruning/sparsity/net.2.weight"]
    assert set(per_tensor) < set(rows[0])
    for step, row in enumerate(rows, start=1):
        assert int(row["step"]) == step - 1  # Lightning writes the step before the increment
        assert float(row["pruning/pruned"]) == LINEAR_COUNTS[step]
        assert float(row["pruning/sparsity"]) == LINEAR_COUNTS[step] / TOTAL
        assert float(row["pruning/target_sparsity"]) == min(step, 4) / 8
        state = recorder.weights[step]
        for column in per_tensor:
            mask = state[column.removeprefix("pruning/sparsity/") + "_mask"]
            expected = int((mask == 0).sum()) / mask.numel()
            assert float(row[column]) == expected


def test_layerwise_scope_prunes_each_tensor_to_the_target(make_trainer):
    callback = GradualPruning(LinearSchedule(0.5, end_step=4), scope="layerwise", verbose=False)
    model = TinyModule()
    make_trainer(max_steps=4, callbacks=[callback], logger=False).fit(model)

    masks = masks_of(model)
    assert sorted(masks) == ["net.0.weight_mask", "net.2.weight_mask"]
    assert int((masks["net.0.weight_mask"] == 0).sum()) == 64
    assert int((masks["net.2.weight_mask"] == 0).sum()) == 32


def test_predict_and_validate_do_not_prune(make_trainer):
    model = ValidatedTiny()
    keys = sorted(model.state_dict())
    callback = GradualPruning(LinearSchedule(0.5, end_step=4), verbose=False)
    trainer = make_trainer(callbacks=[callback], logger=False)

    trainer.validate(model, verbose=False)

    assert sorted(model.state_dict()) == keys
    with pytest.raises(RuntimeError, match="set it up"):
        _ = callback.pruner


def test_one_callback_fits_two_models_one_after_the_other(make_trainer):
    callback = GradualPruning(LinearSchedule(0.5, end_step=4), verbose=False)
    first, second = TinyModule(), TinyModule(seed=1)
    make_trainer(max_steps=2, callbacks=[callback], logger=False).fit(first)
    make_trainer(max_steps=4, callbacks=[callback], logger=False).fit(second)

    assert callback.pruner.model is second
    assert sum(int((m == 0).sum()) for m in masks_of(first).values()) == 48
    assert sum(int((m == 0).sum()) for m in masks_of(second).values()) == 96


class _RngProbe(Callback):
    """Record the global CPU RNG state after every batch."""

    def __init__(self) -> None:
        self.states: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.states.append(torch.get_rng_state())


def test_random_pruning_leaves_the_training_rng_alone(make_trainer):
    before, after = _RngProbe(), _RngProbe()
    callback = GradualPruning(
        LinearSchedule(0.5, end_step=4), method="random_unstructured", verbose=False
    )
    model = TinyModule()
    make_trainer(max_steps=4, callbacks=[before, callback, after], logger=False).fit(model)

    assert sum(int((m == 0).sum()) for m in masks_of(model).values()) == 96  # it drew
    assert len(before.states) == len(after.states) == 4
    for state_before, state_after in zip(before.states, after.states, strict=True):
        assert torch.equal(state_before, state_after)


class _UnpruneByHand(Callback):
    """After optimizer step 5, sets the first layer's mask to ones through ``.data``."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 5:
            pl_module.net[0].weight_mask.data.fill_(1)


def test_counts_are_read_again_on_every_logged_step(make_trainer, tmp_path):
    callback = GradualPruning(LinearSchedule(0.5, end_step=4), verbose=False)
    model = TinyModule()
    trainer = make_trainer(max_steps=9, log_every_n_steps=3, callbacks=[callback, _UnpruneByHand()])
    trainer.fit(model)

    rows = _read_metrics(tmp_path / "logs" / "version_0")
    assert [int(row["step"]) for row in rows] == [2, 5]  # after optimizer steps 3 and 6
    left = int((model.net[2].weight_mask == 0).sum())  # the first layer was unpruned by hand
    assert [float(row["pruning/pruned"]) for row in rows] == [72, left]
    assert callback.pruner.pruned_count() == left
