"""Run a worker on ``world`` CPU processes joined in a gloo process group (the tests' ranks)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def spawn_gloo(worker: Callable[[int, Path], None], world: int, out: Path) -> None:
    """``worker(rank, out)`` on each of ``world`` fresh processes, one torch thread each, inside
    a gloo group on a free local port; returns when all have finished (raises if one failed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(_entry, args=(worker, world, port, out), nprocs=world, start_method="spawn")


def _entry(
    rank: int, worker: Callable[[int, Path], None], world: int, port: int, out: Path
) -> None:
    torch.set_num_threads(1)  # ranks share the machine's cores; the oracles run with 1 too
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}"
    )
    try:
        worker(rank, out)
        dist.barrier()  # gloo: no rank tears down while a peer's last collective is in flight
    finally:
        dist.destroy_process_group()
