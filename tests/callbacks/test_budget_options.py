"""The budgets of active parameters and memory in both adapters: a ``LightningCLI`` YAML file
builds them (``target_memory`` as a mapping of its fields), and the Hugging Face callback's
saved arguments rebuild them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorplay.ao.pruning import MemoryBudget
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
