"""The pruning metrics reach the Trainer's TensorBoard integration: read the event file back."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import make_trainer
from tests.hf_models import tiny_gpt2

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

SCHEDULE = LinearSchedule(0.5, end_step=4, frequency=1)
METRICS = ("train/pruning/sparsity", "train/pruning/target_sparsity", "train/pruning/pruned")


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    files = sorted(log_dir.rglob("events.out.tfevents.*"))
    assert len(files) == 1, files
    events = event_accumulator.EventAccumulator(str(files[0]))
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def test_metrics_are_in_the_tensorboard_event_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(SCHEDULE, verbose=False)
    trainer = make_trainer(model, tmp_path, [pruning], report_to="tensorboard", logging_steps=2)
    GradualPruningCallback.put_first(trainer)
    names = [type(callback).__name__ for callback in trainer.callback_handler.callbacks]
    assert names.index("GradualPruningCallback") < names.index("TensorBoardCallback")
    trainer.train()

    # The integrations file training logs under "train/" (transformers' rewrite_logs).
    scalars = _scalars(tmp_path / "tb")
    total = pruning.pruner.total_count()
    assert scalars["train/pruning/pruned"] == [(s, round(SCHEDULE(s) * total)) for s in (2, 4, 6)]
    assert [step for step, _ in scalars["train/pruning/sparsity"]] == [2, 4, 6]
    for step, value in scalars["train/pruning/sparsity"]:
        assert value == pytest.approx(round(SCHEDULE(step) * total) / total)  # float32 events
    assert scalars["train/pruning/target_sparsity"] == [
        (s, pytest.approx(SCHEDULE(s))) for s in (2, 4, 6)
    ]
    assert [step for step, _ in scalars["train/loss"]] == [2, 4, 6]  # logged with the loss


def test_without_put_first_the_integration_runs_before_the_metrics_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why put_first exists: the Trainer puts its integrations before the user's callbacks."""
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    pruning = GradualPruningCallback(SCHEDULE, verbose=False)
    trainer = make_trainer(
        tiny_gpt2().train(), tmp_path, [pruning], report_to="tensorboard", logging_steps=2
    )
    trainer.train()
    scalars = _scalars(tmp_path / "tb")
    assert "train/loss" in scalars and not set(METRICS) & set(scalars)
    # log_history has them whatever the order.
    assert all("pruning/pruned" in e for e in trainer.state.log_history if "loss" in e)
