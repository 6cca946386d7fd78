"""Channels under Lightning's ``ModelParallelStrategy`` (FSDP2, sharded in ``configure_model``),
two CPU ranks: the callback's pruner masks whole channels across the shards, as one process
would on the same full weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.fsdp_helpers import (
    ShardedTiny,
    ShardRecorder,
    full_state,
    model_parallel_trainer,
    run_ranks,
)

# 4 optimizer steps per epoch on each of 2 ranks; channels pruned at steps 2, 4 and 6.
SCHEDULE = LinearSchedule(0.5, end_step=6, frequency=2)
PRUNE_STEP = 4  # the second pruning step: channels pruned before it are zero
EXAMPLE = torch.zeros(2, 8)
MASKS = ("net.0.weight_mask", "net.0.bias_mask", "net.2.weight_mask")


def _channels() -> GradualPruning:
    return GradualPruning(
        SCHEDULE, structure="channel", masking="inplace", example_inputs=EXAMPLE, verbose=False
    )


def _worker(rank: int, world_size: int, out: Path) -> None:
    before, after = ShardRecorder(PRUNE_STEP), ShardRecorder(PRUNE_STEP)
    model = ShardedTiny()
    callback = _channels()
    trainer = model_parallel_trainer(world_size, max_epochs=2, callbacks=[before, callback, after])
    trainer.fit(model)
    state = {
        "before": before.state,
        "after": after.state,
        "final": full_state(model),
        "history": list(callback.pruner.history),
        "pruned": callback.pruner.pruned_count(),
    }
    torch.save(state, out / f"rank{rank}.pt")


def _one_process(weights: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
    """The oracle: one process's channel pruner on the same full weights, to the target of
    ``step`` in one shot (channels pruned before are zero, so it prunes them first)."""
    model = ShardedTiny()
    with torch.no_grad():
        for name, value in weights.items():
            if not name.endswith("_mask"):
                model.get_parameter(name).copy_(value)
    pruner = Pruner(
        model,
        OneShotSchedule(SCHEDULE(step)),
        structure="channel",
        masking="inplace",
        example_inputs=EXAMPLE,
    )
    pruner.step(0)
    return {name: model.get_buffer(name).clone() for name in MASKS}


@pytest.mark.slow
@pytest.mark.distributed
def test_channels_under_fsdp2_equal_one_process(tmp_path):
    run_ranks(_worker, 2, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for state in ranks:
        assert state["history"] == ranks[0]["history"]
        assert [pruned for _, _, pruned in state["history"]] == [2, 2, 2]  # of 13 channels
        assert state["pruned"] == 6
        expected = _one_process(state["before"], PRUNE_STEP)
        for name in MASKS:
            assert torch.equal(state["after"][name], expected[name]), name
        final = state["final"]
        dropped = ~final["net.0.bias_mask"]
        assert int(dropped.sum()) == 6
        assert torch.equal(final["net.0.weight_mask"], ~dropped[:, None].expand(13, 8))
        assert torch.equal(final["net.2.weight_mask"], ~dropped[None, :].expand(4, 13))
        assert (
            not final["net.0.weight"][dropped].any() and not final["net.2.weight"][:, dropped].any()
        )
