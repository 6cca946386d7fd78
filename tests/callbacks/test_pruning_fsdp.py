"""Lightning's ``ModelParallelStrategy`` (FSDP2, sharded in ``configure_model``), two CPU ranks."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.fsdp_helpers import (
    SHARDED_TOTAL,
    ShardedTiny,
    ShardRecorder,
    full_state,
    model_parallel_trainer,
    run_ranks,
)


def _dense_resume(rank: int, world_size: int, out: Path) -> None:
    uninterrupted = ShardedTiny()
    model_parallel_trainer(world_size, max_epochs=2).fit(uninterrupted)
    final = full_state(uninterrupted)

    first = ShardedTiny()
    trainer = model_parallel_trainer(world_size, max_epochs=1)
    trainer.fit(first)
    trainer.save_checkpoint(out / "mid")  # a folder: one shard file per rank
    mid = full_state(first)

    resumed = ShardedTiny(seed=1)  # another init: everything must come from the checkpoint
    model_parallel_trainer(world_size, max_epochs=2).fit(resumed, ckpt_path=out / "mid")
    state = {"final": final, "mid": mid, "resumed": full_state(resumed)}
    if rank == 0:
        torch.save(state, out / "dense.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_dense_run_resumes_from_a_distributed_checkpoint_bit_for_bit(tmp_path):
    run_ranks(_dense_resume, 2, tmp_path)

    assert sorted(p.name for p in (tmp_path / "mid").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "meta.pt",
    ]
    state = torch.load(tmp_path / "dense.pt", weights_only=True)
    final, mid, resumed = state["final"], state["mid"], state["resumed"]
    names = ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]
    assert sorted(final) == sorted(mid) == sorted(resumed) == names
    assert any(not torch.equal(mid[name], final[name]) for name in names)  # it trained on
    for name in names:
        assert torch.equal(resumed[name], final[name]), name


# 4 optimizer steps per epoch on each of 2 ranks; pruning every 2 steps until step 12; the
# checkpoint after epoch 2 (step 8) is mid-schedule.
SCHEDULE = CubicSchedule(0.75, end_step=12, frequency=2)
PRUNE_STEP = 6
WEIGHTS = ("net.0.weight", "net.2.weight")


def _lean() -> GradualPruning:
    return GradualPruning(SCHEDULE, masking="inplace", log_per_tensor=True, verbose=False)


def _lean_fsdp(rank: int, world_size: int, out: Path) -> None:
    before, after = ShardRecorder(PRUNE_STEP), ShardRecorder(PRUNE_STEP)
    uninterrupted = ShardedTiny()
    callback = _lean()
    logger = CSVLogger(out, name="logs", version=0)
    trainer = model_parallel_trainer(
        world_size, max_epochs=4, callbacks=[before, callback, after], logger=logger
    )
    trainer.fit(uninterrupted)
    trainer.save_checkpoint(out / "final")
    final = full_state(uninterrupted)
    local = {
        name: type(value).__name__
        + str(getattr(value, "placements", ""))
        + str(tuple(getattr(value, "_local_tensor", value).shape))
        for name, value in uninterrupted.state_dict().items()
    }
    pruned = callback.pruner.pruned_count()

    first = ShardedTiny()
    trainer = model_parallel_trainer(world_size, max_epochs=2, callbacks=[_lean()])
    trainer.fit(first)
    trainer.save_checkpoint(out / "mid")
    mid = full_state(first)

    resumed = ShardedTiny(seed=1)  # another init: everything must come from the checkpoint
    model_parallel_trainer(world_size, max_epochs=4, callbacks=[_lean()]).fit(
        resumed, ckpt_path=out / "mid"
    )
    resumed_state = full_state(resumed)

    evaluated = ShardedTiny(seed=1)  # the final sharded checkpoint, for evaluation
    model_parallel_trainer(world_size).validate(evaluated, ckpt_path=out / "final", verbose=False)
    evaluated_state = full_state(evaluated)

    state = {
        "final": final,
        "mid": mid,
        "resumed": resumed_state,
        "evaluated": evaluated_state,
        "before": before.state,
        "after": after.state,
        "pruned": pruned,
        "local": local,
    }
    torch.save(state, out / f"lean_rank{rank}.pt")


def _single_process_masks(weights: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
    """The oracle: a one-process lean Pruner on the same full weights, pruned to the target of
    ``step`` in one shot (pruned weights are zero, the lowest keys, so it prunes them first)."""
    model = ShardedTiny()
    with torch.no_grad():
        for name in WEIGHTS:
            model.get_parameter(name).copy_(weights[name])
    pruner = Pruner(model, OneShotSchedule(SCHEDULE(step)), masking="inplace")
    pruner.step(0)
    return {f"{name}_mask": model.get_buffer(f"{name}_mask").clone() for name in WEIGHTS}


@pytest.mark.slow
@pytest.mark.distributed
def test_lean_pruning_under_fsdp2_is_exact_sharded_and_resumes_bit_for_bit(tmp_path):
    run_ranks(_lean_fsdp, 2, tmp_path)

    ranks = [torch.load(tmp_path / f"lean_rank{r}.pt", weights_only=True) for r in range(2)]
    rank0 = ranks[0]
    expected = round(0.75 * SHARDED_TOTAL)
    assert [state["pruned"] for state in ranks] == [expected, expected]
    # Masks are bool DTensors sharded like their weights: 7 and 6 rows of net.0's 13.
    assert rank0["local"]["net.0.weight_mask"] == "DTensor(Shard(dim=0),)(7, 8)"
    assert ranks[1]["local"]["net.0.weight_mask"] == "DTensor(Shard(dim=0),)(6, 8)"
    assert rank0["local"]["net.0.weight"] == "DTensor(Shard(dim=0),)(7, 8)"

    final = rank0["final"]
    names = [f"net.{i}.{key}" for i in (0, 2) for key in ("bias", "weight", "weight_mask")]
    assert sorted(final) == names
    masks = [final[f"{name}_mask"] for name in WEIGHTS]
    assert [mask.dtype for mask in masks] == [torch.bool, torch.bool]
    assert sum(int((~mask).sum()) for mask in masks) == expected
    for name in WEIGHTS:
        assert int((final[name][~final[f"{name}_mask"]] != 0).sum()) == 0, name

    # At a pruning step, the sharded selection equals a one-process Pruner on the full weights.
    before, after = rank0["before"], rank0["after"]
    assert sorted(before) == sorted(after) == names
    oracle = _single_process_masks(before, PRUNE_STEP)
    assert int(sum((~m).sum() for m in oracle.values())) == round(
        SCHEDULE(PRUNE_STEP) * SHARDED_TOTAL
    )
    assert any(not torch.equal(before[k], after[k]) for k in oracle)  # this step pruned
    for name, mask in oracle.items():
        assert torch.equal(after[name], mask), name

    # Resumed from the distributed checkpoint at step 8: bit-identical to the uninterrupted run.
    mid, resumed = rank0["mid"], rank0["resumed"]
    assert sorted(mid) == sorted(resumed) == names
    assert any(not torch.equal(mid[k], final[k]) for k in names)  # the checkpoint is mid-schedule
    for name in names:
        assert resumed[name].dtype == final[name].dtype, name
        assert torch.equal(resumed[name], final[name]), name

    # The final checkpoint loads for evaluation into a fresh sharded module (no masks: the
    # pruned weights are zero).
    evaluated = rank0["evaluated"]
    assert sorted(evaluated) == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]
    for name in evaluated:
        assert torch.equal(evaluated[name], final[name]), name

    # Logged on rank zero: the schedule's exact global counts after every optimizer step.
    with open(tmp_path / "logs" / "version_0" / "metrics.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get("pruning/pruned")]
    assert [int(row["step"]) for row in rows] == list(range(16))
    counts = [round(SCHEDULE(min(step + 1, 12)) * SHARDED_TOTAL) for step in range(16)]
    assert [int(float(row["pruning/pruned"])) for row in rows] == counts
