"""The budgets of active parameters, memory and latency in both adapters: a ``LightningCLI`` YAML
builds them (``target_memory`` and ``target_latency`` as mappings of their fields), and the Hugging
Face callback's saved arguments rebuild them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorplay.ao.pruning import LatencyBudget, MemoryBudget
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tests.callbacks.lit_helpers import CLI_TRAINER, lightning_cli

BUDGETED = (
    CLI_TRAINER.format(max_steps=4)
    + """        schedule:
          class_path: tensorplay.ao.pruning.pruner.schedules.LinearSchedule
          init_args:
            end_step: 3
        structure: channel
        target_active_params: 0.9
        target_memory:
          bytes: 0.8
          context_length: 16
          dtype: float16
        verbose: false
model:
  seed: 3
seed_everything: 0
"""
)


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_lightning_cli_builds_both_budgets_from_yaml_and_meets_them(tmp_path: Path) -> None:
    from tensorplay.callbacks import GradualPruning

    cli = lightning_cli(tmp_path, BUDGETED)
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, GradualPruning))
    assert callback.config.target_memory == MemoryBudget(0.8, context_length=16, dtype="float16")
    assert callback.config.target_active_params == 0.9
    cli.trainer.fit(cli.model)
    report = callback.pruner.budget_report()
    memory = report["target_memory"]
    params = sum(param.numel() for param in cli.model.parameters())  # no attention: weights
    assert (memory.before, memory.budget) == (params * 2, int(0.8 * params * 2))
    assert report.met and memory.after < memory.before


def test_the_hf_callback_takes_both_budgets_and_rebuilds_them_from_its_saved_arguments() -> None:
    pytest.importorskip("transformers")
    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback

    memory = MemoryBudget(10**6, context_length=128, batch_size=4)
    pruning = GradualPruningCallback(
        LinearSchedule(end_step=4), structure="channel", target_active_params=0.75,
        target_memory=memory, verbose=False,
    )  # fmt: skip
    saved = pruning.state()["args"]
    assert saved["target_memory"] == {
        "bytes": 10**6, "context_length": 128, "batch_size": 4, "dtype": "bfloat16",
    }  # fmt: skip
    rebuilt = GradualPruningCallback(**saved)  # as the Trainer does, from the JSON
    assert (rebuilt.config.target_memory, rebuilt.config.target_active_params) == (memory, 0.75)


LATENCY = (
    CLI_TRAINER.format(max_steps=4)
    + """        schedule:
          class_path: tensorplay.ao.pruning.pruner.schedules.LinearSchedule
          init_args:
            end_step: 3
        structure: channel
        target_latency:
          fraction: 0.97
          input_shape: [8, 8]
          repeats: 3
        verbose: false
model:
  seed: 3
seed_everything: 0
"""
)


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_lightning_cli_builds_a_latency_budget_from_yaml_and_meets_it(tmp_path: Path) -> None:
    from tensorplay.callbacks import GradualPruning

    cli = lightning_cli(tmp_path, LATENCY)
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, GradualPruning))
    assert callback.config.target_latency == LatencyBudget(0.97, input_shape=(8, 8), repeats=3)
    cli.trainer.fit(cli.model)
    line = callback.pruner.budget_report()["target_latency"]
    assert line.budget == pytest.approx(0.97 * line.before, rel=1e-9)
    assert line.met and line.after < line.before


def test_the_hf_callback_rebuilds_a_latency_budget_from_its_saved_arguments() -> None:
    pytest.importorskip("transformers")
    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback

    latency = LatencyBudget(0.8, input_shape=(1, 32), repeats=4)
    pruning = GradualPruningCallback(
        LinearSchedule(end_step=4), structure="channel", target_latency=latency, verbose=False
    )
    saved = pruning.state()["args"]
    assert saved["target_latency"] == {
        "fraction": 0.8, "input_shape": [1, 32], "repeats": 4, "warmup": 2,
    }  # fmt: skip
    rebuilt = GradualPruningCallback(**saved)  # as the Trainer does, from the JSON
    assert rebuilt.config.target_latency == latency


def test_a_latency_budget_timed_on_tensors_leaves_no_arguments_to_rebuild() -> None:
    pytest.importorskip("transformers")
    import torch

    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback

    latency = LatencyBudget(0.8, example_inputs=torch.zeros(1, 32, dtype=torch.long))
    pruning = GradualPruningCallback(
        LinearSchedule(end_step=4), structure="channel", target_latency=latency, verbose=False
    )
    assert pruning.state()["args"] == {}  # tensors have no plain-data form
