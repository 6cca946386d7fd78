"""Two CPU processes (gloo): every rank holds the same masks, for L1 and random pruning."""

from __future__ import annotations

import pytest
import torch

from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.lit_helpers import RankMaskWriter, RankTeacherWriter, TinyModule


@pytest.mark.slow
@pytest.mark.distributed
def test_masks_are_identical_across_two_ddp_ranks(make_trainer, tmp_path):
    schedule = CubicSchedule(0.75, end_step=4)
    callbacks = [
        RankMaskWriter(str(tmp_path)),  # first: gives each rank its own global seed
        GradualPruning(schedule, parameters=["net.0.weight"], make_permanent=True, verbose=False),
        GradualPruning(
            schedule,
            method="random_unstructured",
            parameters=["net.2.weight"],
            make_permanent=True,
            verbose=False,
        ),
    ]
    trainer = make_trainer(
        strategy="ddp_spawn", devices=2, max_steps=4, callbacks=callbacks, logger=False
    )
    model = TinyModule()
    trainer.fit(model)

    rank0 = torch.load(tmp_path / "masks_rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "masks_rank1.pt", weights_only=True)
    masks = ["net.0.weight_mask", "net.2.weight_mask"]
    assert sorted(rank0["masks"]) == sorted(rank1["masks"]) == masks
    assert int((rank0["masks"]["net.0.weight_mask"] == 0).sum()) == 96
    assert int((rank0["masks"]["net.2.weight_mask"] == 0).sum()) == 48
    for name in masks:
        assert torch.equal(rank0["masks"][name], rank1["masks"][name]), name
    # make_permanent gives ddp_spawn's main process plain weights it can load: the trained ones.
    assert sorted(model.state_dict()) == [
        "net.0.bias",
        "net.0.weight",
        "net.2.bias",
        "net.2.weight",
    ]
    for name in ("net.0", "net.2"):
        assert torch.equal(model.get_submodule(name).weight, rank0["weights"][name]), name


@pytest.mark.slow
@pytest.mark.distributed
def test_each_rank_distils_from_its_own_teacher_and_the_masks_stay_identical(
    make_trainer, tmp_path
):
    # Pruned at step 1: each rank copies its teacher from the model after one DDP step.
    pruning = GradualPruning(OneShotSchedule(0.5, step=1), distill_weight=1.0, verbose=False)
    callbacks = [RankMaskWriter(str(tmp_path)), pruning, RankTeacherWriter(str(tmp_path))]
    trainer = make_trainer(
        strategy="ddp_spawn", devices=2, max_steps=3, callbacks=callbacks, logger=False
    )
    trainer.fit(TinyModule())

    rank0 = torch.load(tmp_path / "teacher_rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "teacher_rank1.pt", weights_only=True)
    initial = TinyModule().state_dict()
    for key in ("masks", "teacher", "weights"):
        assert sorted(rank0[key]) == sorted(rank1[key]) and rank0[key], key
        for name, value in rank0[key].items():
            assert torch.equal(rank1[key][name], value), (key, name)
    assert sum(int((mask == 0).sum()) for mask in rank0["masks"].values()) == 96  # half
    assert sorted(rank0["teacher"]) == sorted(initial)
    assert any(not torch.equal(v, initial[k]) for k, v in rank0["teacher"].items())
