"""Run a worker on ``world`` CPU processes joined in a gloo process group (the tests' ranks).

The ranks meet through a file (``file://`` rendezvous, a ``FileStore``), not a TCP port picked
in advance: a port found free here may be taken by another process before rank 0 listens on
it (``EADDRINUSE``), or handed to another test's group. Gloo's own connections bind ports the
system chooses as it opens them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def spawn_gloo(worker: Callable[[int, Path], None], world: int, out: Path) -> None:
    """``worker(rank, out)`` on each of ``world`` fresh processes, one torch thread each, inside
    a gloo group met through a file in ``out``; returns when all have finished (raises if one
    failed)."""
    init = file_rendezvous(out)
    mp.start_processes(_entry, args=(worker, world, init, out), nprocs=world, start_method="spawn")


def file_rendezvous(folder: Path) -> str:
    """A fresh ``file://`` ``init_method`` in ``folder``, for one process group's ranks."""
    return f"file://{Path(folder).resolve() / f'rendezvous-{uuid.uuid4().hex}'}"


def _entry(
    rank: int, worker: Callable[[int, Path], None], world: int, init: str, out: Path
) -> None:
    torch.set_num_threads(1)  # ranks share the machine's cores; the oracles run with 1 too
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=init)
    try:
        worker(rank, out)
        dist.barrier()  # gloo: no rank tears down while a peer's last collective is in flight
    finally:
        dist.destroy_process_group()
