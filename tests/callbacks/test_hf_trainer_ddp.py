"""Two CPU processes (gloo, ``torchrun``) under the Trainer's own DDP: identical masks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[2]


# Set by a distributed run earlier in this process (Lightning's DDP tests, say): torchrun and
# Accelerate must see only what torchrun sets for its own workers.
DISTRIBUTED_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")


def _clean_env() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in DISTRIBUTED_ENV
        and not key.startswith(("TORCHELASTIC_", "PL_", "ACCELERATE_", "LOCAL_WORLD", "GROUP_"))
    }
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _two_ranks(worker: str, tmp_path: Path, stem: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``tests/callbacks/<worker>`` on two gloo ranks under torchrun; what each rank saved
    as ``<stem>_rank<r>.pt`` in ``tmp_path``."""
    # --standalone: a rendezvous on a free local port, chosen by torchrun itself.
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(ROOT / "tests/callbacks" / worker), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (
        torch.load(tmp_path / f"{stem}_rank{rank}.pt", weights_only=True) for rank in (0, 1)
    )
    return rank0, rank1


@pytest.mark.slow
@pytest.mark.distributed
def test_masks_are_identical_on_two_ddp_ranks(tmp_path: Path) -> None:
    rank0, rank1 = _two_ranks("hf_ddp_worker.py", tmp_path, "masks")
    assert sorted(rank0["masks"]) == sorted(rank1["masks"])
    assert len(rank0["masks"]) == 8  # 4 Conv1D projections per block, 2 blocks
    for name, mask in rank0["masks"].items():
        assert torch.equal(mask, rank1["masks"][name]), name
    # Each callback pruned exactly 60% of its block: 4 projections of 32 x (96, 32, 128, 32).
    per_block = 32 * 96 + 32 * 32 + 32 * 128 + 128 * 32
    assert rank0["pruned"] == rank1["pruned"] == [round(0.6 * per_block)] * 2
    # The lean block's pruned weights are exactly zero, and DDP kept the ranks' weights equal.
    for name, mask in rank0["masks"].items():
        if ".h.0." in name:
            assert mask.dtype == torch.bool, name
            weight = rank0["weights"][name.removesuffix("_mask")]
            assert torch.equal(weight[~mask], torch.zeros(int((~mask).sum()))), name
    for name, weight in rank0["weights"].items():
        assert torch.equal(weight, rank1["weights"][name]), name


@pytest.mark.slow
@pytest.mark.distributed
def test_both_ranks_shrink_to_the_same_model(tmp_path: Path) -> None:
    rank0, rank1 = _two_ranks("shrink_ddp_worker.py", tmp_path, "shrunk")
    assert rank0["widths"] == rank1["widths"]
    assert sum(rank0["widths"]) == 3 * 48 - round(0.5 * 3 * 48)  # half of all channels went
    assert sorted(rank0["weights"]) == sorted(rank1["weights"])
    for name, weight in rank0["weights"].items():
        assert torch.equal(weight, rank1["weights"][name]), name
