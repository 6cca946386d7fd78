"""Channels with distillation under Lightning's ``ModelParallelStrategy`` (FSDP2), two CPU ranks:
the teacher is copied shard by shard when the first pruning step is due, every later step adds
its KD term to the loss, and the masks equal one process's on the same full weights (as for
pruning alone). A distributed checkpoint keeps the sharded teacher (each rank its shards): a run
resumed from it distils from the same teacher, exactly. The callback's state alone holds only a
marker: resuming from it past the first pruning step is refused, saying what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from tensorplay.callbacks import GradualPruning
from tensorplay.callbacks.core.distilling import SHARDED_TEACHER
from tests.callbacks.fsdp_helpers import (
    ShardedTiny,
    ShardRecorder,
    full_state,
    model_parallel_trainer,
    run_ranks,
)
from tests.callbacks.test_pruning_fsdp_structure import (
    EXAMPLE,
    MASKS,
    PRUNE_STEP,
    SCHEDULE,
    _one_process,
)


class TermRecorder(Callback):
    """The KD term of each optimizer step (``None`` before the teacher), and whether the
    teacher's parameters are sharded and frozen."""

    def __init__(self, pruning: GradualPruning) -> None:
        self.pruning = pruning
        self.terms: list[float | None] = []
        self.sharded_frozen: list[bool] = []
        self.teacher: dict[str, torch.Tensor] = {}  # the teacher's full weights, first seen

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
        distillation = self.pruning._session.distilling.distillation
        term = None if distillation is None else distillation.last_loss
        self.terms.append(None if term is None else float(term))
        if distillation is not None and distillation.teacher is not None:
            params = list(distillation.teacher.parameters())
            sharded = all(type(p).__name__ == "DTensor" for p in params)
            self.sharded_frozen.append(sharded and not any(p.requires_grad for p in params))
            if not self.teacher:
                self.teacher = full_state(distillation.teacher)


def _distilled() -> GradualPruning:
    return GradualPruning(
        SCHEDULE,
        structure="channel",
        masking="inplace",
        example_inputs=EXAMPLE,
        distill_weight=1.0,
        verbose=False,
    )


def _worker(rank: int, world_size: int, out: Path) -> None:
    before, after = ShardRecorder(PRUNE_STEP), ShardRecorder(PRUNE_STEP)
    callback = _distilled()
    terms = TermRecorder(callback)
    trainer = model_parallel_trainer(
        world_size, max_epochs=2, callbacks=[before, callback, after, terms]
    )
    trainer.fit(ShardedTiny())
    checkpoint = out / "distilled.ckpt"  # a distributed checkpoint: a folder
    trainer.save_checkpoint(checkpoint)
    resumed_terms = TermRecorder(_distilled())
    again = model_parallel_trainer(
        world_size, max_epochs=3, callbacks=[resumed_terms.pruning, resumed_terms]
    )
    again.fit(ShardedTiny(), ckpt_path=checkpoint)
    state = callback.state_dict()
    resumed = _distilled()
    resumed.load_state_dict(state)
    try:
        resumed._session.distilling.before_step(callback.pruner, 100, weight=1.0, temperature=2.0)
        refusal = "not refused"
    except RuntimeError as error:
        refusal = str(error)
    torch.save(
        {
            "before": before.state,
            "after": after.state,
            "history": list(callback.pruner.history),
            "terms": terms.terms,
            "sharded_frozen": terms.sharded_frozen,
            "marker": sorted(state["distill_teacher"]),
            "refusal": refusal,
            "teacher": terms.teacher,
            "resumed_teacher": resumed_terms.teacher,
            "resumed_terms": resumed_terms.terms,
        },
        out / f"rank{rank}.pt",
    )


@pytest.mark.slow
@pytest.mark.distributed
def test_channels_distilled_under_fsdp2_equal_one_process(tmp_path):
    run_ranks(_worker, 2, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for state in ranks:
        assert [pruned for _, _, pruned in state["history"]] == [2, 2, 2]  # of 13 channels
        expected = _one_process(state["before"], PRUNE_STEP)
        for name in MASKS:
            assert torch.equal(state["after"][name], expected[name]), name
        terms = state["terms"]  # 8 optimizer steps; the teacher is taken before step 2's pruning
        assert len(terms) == 8 and terms[:2] == [None, None], terms
        assert all(term is not None and term > 0 for term in terms[3:]), terms
        assert state["sharded_frozen"] and all(state["sharded_frozen"])
        assert state["marker"] == [SHARDED_TEACHER]
        assert "kept only in a distributed checkpoint" in state["refusal"]
        # Resumed from the distributed checkpoint: 4 more steps, distilled from the same teacher.
        resumed = state["resumed_terms"]
        assert len(resumed) == 4 and all(term is not None and term > 0 for term in resumed)
        assert sorted(state["resumed_teacher"]) == sorted(state["teacher"])
        for name, weight in state["teacher"].items():
            assert torch.equal(state["resumed_teacher"][name], weight), name
        assert not torch.equal(state["teacher"]["net.0.weight"], state["before"]["net.0.weight"])
