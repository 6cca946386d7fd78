"""Run a worker on ``world`` CPU processes joined in a gloo process group (the tests' ranks).

The ranks meet through a file (``file://`` rendezvous, a ``FileStore``), not a TCP port picked
in advance: a port found free here may be taken by another process before rank 0 listens on
it (``EADDRINUSE``), or handed to another test's group. Gloo's own connections bind ports the
system chooses as it opens them.

A rank ends in three steps: a barrier (no rank tears down while a peer's last collective is in
flight), :func:`~torch.distributed.destroy_process_group`, then ``os._exit(0)``: its process
stops without finalizing the interpreter. Once a ``DistributedDataParallel`` has been built
(torch 2.13, CPU), references to its process group outlive it, so ``destroy_process_group``
cannot free the gloo backend: its threads (two ``pt_gloo_runloop``, one ``gloo_tcp_loop``) are
still running when the rank returns. A C++ thread that takes the GIL while the interpreter is
finalizing is ended by Python with ``pthread_exit``, whose unwinding through a ``noexcept``
destructor calls ``std::terminate``: "terminate called without an active exception", SIGABRT.
How late those threads run is a race that a loaded machine loses now and then; a rank that never
finalizes cannot lose it. A rank that raises still reports its traceback to the parent.

Slow ranks are waited for generously, a lost one is not waited for forever: a collective gives up
after :data:`COLLECTIVE_TIMEOUT` (gloo's default, 30 minutes, would outlast CI), and the parent
ends the ranks and raises after :data:`DEADLINE`.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessContext, ProcessException, ProcessRaisedException

# Far above what any test's ranks need between two collectives, even on a loaded machine.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
# Far above any test's whole run on a loaded machine (the longest takes about a minute alone).
DEADLINE = 15 * 60.0


def spawn_gloo(
    worker: Callable[[int, Path], None], world: int, out: Path, deadline: float = DEADLINE
) -> None:
    """``worker(rank, out)`` on each of ``world`` fresh processes, one torch thread each, inside
    a gloo group met through a file in ``out``; returns when all have finished (raises as
    :func:`wait_ranks` does)."""
    init = file_rendezvous(out)
    context = mp.start_processes(
        _entry, args=(worker, world, init, out), nprocs=world, start_method="spawn", join=False
    )
    wait_ranks(context, getattr(worker, "__qualname__", repr(worker)), deadline)


def file_rendezvous(folder: Path) -> str:
    """A fresh ``file://`` ``init_method`` in ``folder``, for one process group's ranks."""
    return f"file://{Path(folder).resolve() / f'rendezvous-{uuid.uuid4().hex}'}"


def wait_ranks(context: ProcessContext | None, name: str, deadline: float = DEADLINE) -> None:
    """Wait for the ranks ``mp.start_processes(..., join=False)`` started (running ``name``).

    Raises :class:`~torch.multiprocessing.ProcessRaisedException` with every failed rank's
    traceback if one failed, :class:`TimeoutError` (the ranks killed) if they have not all
    finished after ``deadline`` seconds.
    """
    assert context is not None  # what start_processes returns with join=False
    end = time.monotonic() + deadline
    try:
        while not context.join(timeout=max(0.0, end - time.monotonic())):
            if time.monotonic() >= end:
                _kill(context.processes)
                world = len(context.processes)
                raise TimeoutError(f"{world} ranks of {name} still running after {deadline} s")
    except ProcessException as failed:
        # The first rank seen failing is often a peer of the culprit ("Connection closed by
        # peer"): report every rank.
        report = _every_failure(context)
        raise ProcessRaisedException(report, failed.error_index, failed.error_pid) from None


def end_rank() -> None:
    """End a rank whose work is done and whose process group is destroyed, without finalizing
    the interpreter (where gloo threads still alive can abort it, see the module's note)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _entry(
    rank: int, worker: Callable[[int, Path], None], world: int, init: str, out: Path
) -> None:
    torch.set_num_threads(1)  # ranks share the machine's cores; the oracles run with 1 too
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, init_method=init, timeout=COLLECTIVE_TIMEOUT
    )
    try:
        worker(rank, out)
        dist.barrier()  # gloo: no rank tears down while a peer's last collective is in flight
    finally:
        dist.destroy_process_group()
    end_rank()


def _every_failure(context: ProcessContext) -> str:
    """Each failed rank's traceback, or how it ended where it left none."""
    lines = []
    for rank, (process, errors) in enumerate(
        zip(context.processes, context.error_files, strict=True)
    ):
        if os.access(errors, os.R_OK):
            with open(errors, "rb") as file:
                lines.append(f"\n-- rank {rank} raised:\n{pickle.load(file)}")
        elif process.exitcode is not None and process.exitcode < 0:
            lines.append(f"\n-- rank {rank} ended by {signal.Signals(-process.exitcode).name}")
        elif process.exitcode != 0:
            lines.append(f"\n-- rank {rank} ended with exit code {process.exitcode}")
    return "".join(lines)


def _kill(processes: list[Any]) -> None:
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join()
