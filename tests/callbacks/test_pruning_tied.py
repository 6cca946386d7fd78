"""The callback on a model with tied weights: one shared mask, resume mid-schedule bit for bit,
strict loading into a fresh model, and two DDP ranks."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tensorplay.ao.pruning.pruner.schedules import CubicSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.tied_helpers import (
    TIED_TOTAL,
    PrunableTiedTiny,
    TiedMaskWriter,
    TiedTiny,
    tie_holds,
)

# 8 optimizer steps per epoch; pruning every 2 steps until step 20: epoch 1 ends mid-schedule.
SCHEDULE = CubicSchedule(0.8, end_step=20, frequency=2)


def _assert_same_state(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(actual) == list(expected)
    for name, value in expected.items():
        assert torch.equal(actual[name], value), name


def test_the_callback_masks_both_holders_and_counts_the_tied_weight_once(make_trainer) -> None:
    model = TiedTiny()
    callback = GradualPruning(SCHEDULE, verbose=False)
    make_trainer(max_steps=20, max_epochs=None, callbacks=[callback], logger=False).fit(model)
    assert callback.pruner.targets == ["net.0.weight", "net.2.weight", "net.6.weight"]
    assert callback.pruner.total_count() == TIED_TOTAL
    assert callback.pruner.pruned_count() == round(0.8 * TIED_TOTAL)
    assert tie_holds(model)
    model(torch.randn(1, 8))  # the forward pre-hooks recompute both holders' weights
    masked = model.net[2].weight_orig * model.net[2].weight_mask
    assert torch.equal(model.net[2].weight, masked) and torch.equal(model.net[4].weight, masked)


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
@pytest.mark.parametrize("module_class", [TiedTiny, PrunableTiedTiny], ids=["plain", "mixin"])
def test_resume_mid_schedule_with_tied_weights_equals_an_uninterrupted_run(
    make_trainer, tmp_path, module_class
) -> None:
    checkpoints = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1)
    uninterrupted = TiedTiny()
    trainer = make_trainer(
        max_epochs=3,
        callbacks=[GradualPruning(SCHEDULE, verbose=False), checkpoints],
        enable_checkpointing=True,
        logger=False,
    )
    trainer.fit(uninterrupted)
    final = uninterrupted.state_dict()
    path = tmp_path / "epoch=0-step=8.ckpt"
    saved = torch.load(path, weights_only=True)
    assert {"net.2.weight_orig", "net.4.weight_orig", "net.4.weight_mask"} <= set(
        saved["state_dict"]
    )
    assert any(not torch.equal(saved["state_dict"][k], final[k]) for k in final)  # mid-schedule

    resumed = module_class(seed=1)
    callback = GradualPruning(SCHEDULE, verbose=False)
    make_trainer(max_epochs=3, callbacks=[callback], logger=False).fit(resumed, ckpt_path=path)

    _assert_same_state(resumed.state_dict(), final)
    assert tie_holds(resumed)
    assert callback.pruner.pruned_count() == round(0.8 * TIED_TOTAL)


def test_a_fresh_module_loads_a_tied_pruned_checkpoint_strictly(make_trainer, tmp_path) -> None:
    model = TiedTiny()
    trainer = make_trainer(
        max_steps=15,
        max_epochs=None,
        callbacks=[GradualPruning(SCHEDULE, verbose=False)],
        logger=False,
    )
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "tied.ckpt")

    loaded = PrunableTiedTiny.load_from_checkpoint(tmp_path / "tied.ckpt", strict=True, seed=5)

    _assert_same_state(loaded.state_dict(), model.state_dict())
    assert tie_holds(loaded)
    x = torch.randn(3, 8)
    assert torch.equal(loaded(x), model(x))


@pytest.mark.slow
@pytest.mark.distributed
def test_tied_masks_are_identical_across_two_ddp_ranks(make_trainer, tmp_path) -> None:
    callbacks = [
        TiedMaskWriter(str(tmp_path)),  # first: gives each rank its own global seed
        GradualPruning(
            CubicSchedule(0.75, end_step=4), method="random_unstructured", verbose=False
        ),
    ]
    trainer = make_trainer(
        strategy="ddp_spawn", devices=2, max_steps=4, callbacks=callbacks, logger=False
    )
    trainer.fit(TiedTiny())

    ranks = [torch.load(tmp_path / f"tied_rank{r}.pt", weights_only=True) for r in (0, 1)]
    names = ["net.0.weight_mask", "net.2.weight_mask", "net.4.weight_mask", "net.6.weight_mask"]
    for record in ranks:
        assert sorted(record["masks"]) == names
        assert bool(record["tie_holds"])
        assert torch.equal(
            record["masks"]["net.2.weight_mask"], record["masks"]["net.4.weight_mask"]
        )
    zeros = sum(int((ranks[0]["masks"][name] == 0).sum()) for name in names if "net.4" not in name)
    assert zeros == round(0.75 * TIED_TOTAL)
    for name in names:
        assert torch.equal(ranks[0]["masks"][name], ranks[1]["masks"][name]), name
    assert torch.equal(ranks[0]["weight"], ranks[1]["weight"])
