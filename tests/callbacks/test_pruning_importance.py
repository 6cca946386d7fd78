"""GradualPruning with a gradient importance: accumulated from Lightning's final gradients,
once per optimizer step, and configurable from LightningCLI YAML."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.lit_helpers import CLI_TRAINER, TinyModule, lightning_cli, masks_of


class MovementRecorder(Callback):
    """The oracle: ``-sum_t w_t * g_t`` of the two targets, from the gradients the optimizer
    steps with (recorded at each optimizer step, after the pruning callback's hook)."""

    def __init__(self) -> None:
        self.totals: dict[str, Tensor] = {}
        self.steps = 0

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
        for name in ("net.0", "net.2"):
            layer = pl_module.get_submodule(name)
            param = getattr(layer, "weight_orig", layer.weight)
            term = -(param.detach() * param.grad)
            self.totals[name] = self.totals.get(name, torch.zeros_like(term)) + term
        self.steps += 1


def lowest(scores: Tensor, count: int) -> Tensor:
    keep = torch.ones(scores.numel())
    keep[scores.reshape(-1).argsort()[:count]] = 0
    return keep.view(scores.shape)


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_movement_ranks_by_the_gradients_the_optimizer_used(make_trainer, masking):
    # Prune after 6 optimizer steps of 2 accumulated batches each: the scores are 6 terms.
    callback = GradualPruning(
        OneShotSchedule(0.5, step=6), importance="movement", scope="layerwise", masking=masking
    )
    recorder = MovementRecorder()
    trainer = make_trainer(
        callbacks=[callback, recorder],
        max_steps=6,
        max_epochs=2,
        accumulate_grad_batches=2,
        logger=False,
    )
    trainer.fit(TinyModule())
    assert recorder.steps == 6
    assert [(step, pruned) for step, _, pruned in callback.pruner.history] == [(6, 96)]
    assert callback.pruner.importance.steps() == {"net.0.weight": 6, "net.2.weight": 6}
    totals = callback.pruner.importance.totals()
    for name in ("net.0", "net.2"):
        assert torch.allclose(totals[f"{name}.weight"], recorder.totals[name], atol=1e-7)


def test_movement_masks_at_the_pruning_step_are_the_lowest_recorded_scores(make_trainer):
    callback = GradualPruning(
        OneShotSchedule(0.5, step=4), importance="movement", scope="layerwise"
    )
    recorder = MovementRecorder()
    trainer = make_trainer(callbacks=[callback, recorder], max_steps=4, logger=False)
    trainer.fit(TinyModule())
    masks = masks_of(trainer.lightning_module)
    assert torch.equal(masks["net.0.weight_mask"], lowest(recorder.totals["net.0"], 64))
    assert torch.equal(masks["net.2.weight_mask"], lowest(recorder.totals["net.2"], 32))


CONFIG = (
    CLI_TRAINER.format(max_steps=4)
    + """        schedule:
          class_path: tensorplay.ao.pruning.pruner.schedules.OneShotSchedule
          init_args:
            sparsity: 0.5
            step: 4
        importance: movement
        accumulator_dtype: bfloat16
        scope: row
        verbose: false
model:
  seed: 3
seed_everything: 0
"""
)


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_lightning_cli_takes_the_importance_from_yaml(tmp_path):
    cli = lightning_cli(tmp_path, CONFIG)
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, GradualPruning))
    config = callback.config
    assert (config.importance, config.accumulator_dtype, config.scope) == (
        "movement",
        "bfloat16",
        "row",
    )
    cli.trainer.fit(cli.model)
    assert callback.pruner.importance.steps() == {"net.0.weight": 4, "net.2.weight": 4}
    masks = masks_of(cli.model)
    # scope="row": every output row of net.0 (16 x 8) and net.2 (4 x 16) loses half its units.
    assert (masks["net.0.weight_mask"] == 0).sum(dim=1).tolist() == [4] * 16
    assert (masks["net.2.weight_mask"] == 0).sum(dim=1).tolist() == [8] * 4


def _fit(make_trainer, directory, model, importance, ckpt_path=None):
    from lightning.pytorch.callbacks import ModelCheckpoint

    # 8 steps an epoch, pruning every 6 steps until 18: the epoch-1 checkpoint (step 8) is two
    # accumulated steps past a pruning step.
    callback = GradualPruning(
        CubicSchedule(0.8, end_step=18, frequency=6), importance=importance, verbose=False
    )
    checkpoints = ModelCheckpoint(dirpath=directory, save_top_k=-1, every_n_epochs=1)
    trainer = make_trainer(
        max_epochs=3, callbacks=[callback, checkpoints], enable_checkpointing=True, logger=False
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return callback


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
@pytest.mark.parametrize("importance", ["movement", "taylor"])
def test_resume_mid_accumulation_equals_an_uninterrupted_fit(make_trainer, tmp_path, importance):
    model = TinyModule()
    whole = _fit(make_trainer, tmp_path / "a", model, importance)
    final = model.state_dict()
    path = tmp_path / "a" / "epoch=0-step=8.ckpt"
    saved = torch.load(path, weights_only=True)
    (state,) = [v for k, v in saved["callbacks"].items() if k.startswith("GradualPruning")]
    assert state["importance"] == importance and state["importance_state"]["steps"]
    resumed = TinyModule(seed=1)
    callback = _fit(make_trainer, tmp_path / "b", resumed, importance, ckpt_path=path)
    after = resumed.state_dict()
    assert sorted(after) == sorted(final)
    assert all(torch.equal(after[k], v) for k, v in final.items())
    assert callback.pruner.history == whole.pruner.history and len(whole.pruner.history) == 3


def test_wanda_per_row_from_the_training_forwards(make_trainer):
    callback = GradualPruning(OneShotSchedule(0.25, step=4), importance="wanda", scope="row")
    trainer = make_trainer(callbacks=[callback], max_steps=4, logger=False)
    trainer.fit(TinyModule())
    masks = masks_of(trainer.lightning_module)
    assert (masks["net.0.weight_mask"] == 0).sum(dim=1).tolist() == [2] * 16
    assert (masks["net.2.weight_mask"] == 0).sum(dim=1).tolist() == [4] * 4
    assert callback.pruner.importance.batches() == {"net.0.weight": 0, "net.2.weight": 0}  # reset
