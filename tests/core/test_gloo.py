"""The tests' gloo launcher (``tests/core/gloo.py``): how its ranks end, fail and time out."""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.multiprocessing.spawn import ProcessRaisedException

from tests.core.gloo import spawn_gloo


def _finalizing_fails(rank: int, out: Path) -> None:
    """Build a DDP (whose process group outlives it) and make finalizing exit with code 3."""
    nn.parallel.DistributedDataParallel(nn.Linear(4, 4))(torch.ones(2, 4)).sum().backward()
    atexit.register(os._exit, 3)
    (out / f"{rank}.done").touch()


def _rank_one_raises(rank: int, out: Path) -> None:
    if rank == 1:
        raise ValueError("rank one found a bug")
    dist.barrier()


def _rank_one_hangs(rank: int, out: Path) -> None:
    if rank == 1:
        time.sleep(600)
    dist.barrier()


@pytest.mark.distributed
def test_a_finished_rank_ends_without_finalizing_its_interpreter(tmp_path: Path) -> None:
    spawn_gloo(_finalizing_fails, 2, tmp_path)
    assert sorted(path.name for path in tmp_path.glob("*.done")) == ["0.done", "1.done"]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_that_raises_fails_the_launch_with_its_traceback(tmp_path: Path) -> None:
    culprit = r"(?s)-- rank 1 raised:.*ValueError: rank one found a bug"
    with pytest.raises(ProcessRaisedException, match=culprit):
        spawn_gloo(_rank_one_raises, 2, tmp_path)


@pytest.mark.slow
@pytest.mark.distributed
def test_ranks_still_running_after_the_deadline_are_ended(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"2 ranks of _rank_one_hangs still running after 5"):
        spawn_gloo(_rank_one_hangs, 2, tmp_path, deadline=5)
    assert time.monotonic() - start < 60  # not the 600 s that rank one sleeps
