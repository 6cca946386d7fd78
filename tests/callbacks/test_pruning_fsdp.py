"""Lightning's ``ModelParallelStrategy`` (FSDP2, sharded in ``configure_model``), two CPU ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.callbacks.fsdp_helpers import ShardedTiny, full_state, model_parallel_trainer, run_ranks


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
