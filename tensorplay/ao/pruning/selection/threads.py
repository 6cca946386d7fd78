"""How a pass spreads its chunks over threads, changing no thread setting of the process.

Chunk-sized ops are too small for torch's intra-op pool: every op ends at a barrier that waits
for all of its threads, and on a busy machine a descheduled thread stalls each op (measured 5
to 10 times slower than one thread per op on a loaded 2-core machine). So a large pass is
split, in order, into contiguous shares that run in threads of its own, each running its torch
ops on itself alone (torch ops release the GIL).

``torch.set_num_threads`` cannot do that: it is process-wide (OpenMP's default, MKL, the
pthreadpool and the count new threads start with), so calling it would reconfigure threads the
library does not own and race with any other thread doing the same. Instead each of the pass's
own threads sets *its own* OpenMP thread count to 1 (``omp_set_num_threads`` changes only the
calling thread's value) and ends with the pass. The caller's thread and every setting of the
process are never touched, so calls from several threads at once are independent. Where torch
does not use OpenMP the pass runs in the calling thread and torch spreads each op itself.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from tensorplay.ao.pruning.selection import tuning
from tensorplay.ao.pruning.selection.buffers import Worker
from tensorplay.ao.pruning.selection.plan import Chunk, Selection, chunk_length

__all__ = [
    "map_shares",
    "own_threads",
    "run_chunks",
    "run_in_own_threads",
    "run_on_own_thread",
    "split_in_order",
]

G = TypeVar("G")
R = TypeVar("R")


def own_threads(cpu_units: int) -> int:
    """How many threads of its own a pass over ``cpu_units`` CPU units runs on.

    ``0`` means the calling thread: where its ops are below torch's grain size anyway, where
    the caller runs torch on one thread, or where the thread count cannot be set per thread.

    Example:
        >>> own_threads(1000)
        0
    """
    threads = torch.get_num_threads()
    if threads == 1 or cpu_units <= tuning.TORCH_GRAIN or _omp_set_num_threads() is None:
        return 0
    per_thread = tuning.CHUNKS_PER_THREAD * tuning.CPU_CHUNK
    return max(1, min(threads, cpu_units // per_thread))


def split_in_order(lengths: Sequence[int], groups: int) -> list[slice]:
    """Cut items of ``lengths`` units into at most ``groups`` contiguous runs of similar size.

    Example:
        >>> split_in_order([4, 4, 4, 0, 4], 2)
        [slice(0, 2, None), slice(2, 5, None)]
    """
    per_group = max(-(-sum(lengths) // max(groups, 1)), 1)
    cuts, done = [0], 0
    for index, length in enumerate(lengths):
        if done >= per_group * len(cuts) and len(cuts) < groups:
            cuts.append(index)
        done += length
    cuts.append(len(lengths))
    return [slice(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def run_in_own_threads(groups: Sequence[G], work: Callable[[G], R]) -> list[R]:
    """``work(group)`` for each group, each in a new thread whose torch ops use it alone.

    Args:
        groups: the shares of the work.
        work: what to do with one share.

    Returns:
        The results, in the order of ``groups``.

    Example:
        >>> run_in_own_threads([1, 2], lambda group: (group, torch.get_num_threads()))
        [(1, 1), (2, 1)]
    """
    with ThreadPoolExecutor(len(groups)) as pool:
        return list(pool.map(functools.partial(_on_this_thread_alone, work), groups))


def map_shares(
    items: Sequence[G], lengths: Sequence[int], work: Callable[[list[G]], R], threads: int
) -> list[R]:
    """``work`` over contiguous shares of ``items``: in the calling thread, or on own threads.

    Args:
        items: the work, in order.
        lengths: the CPU units of each item (``0`` for an accelerator's).
        work: what to do with one share.
        threads: ``0`` (all in the calling thread) or how many threads of its own to use.

    Returns:
        One result per share, in order.

    Example:
        >>> map_shares([1, 2, 3], [1, 1, 1], sum, threads=2)
        [3, 3]
    """
    if threads == 0 or not items:
        return [work(list(items))]
    shares = [list(items[share]) for share in split_in_order(lengths, threads)]
    return run_in_own_threads(shares, work)


def run_chunks(selection: Selection, work: Callable[[Worker, list[Chunk]], R]) -> list[R]:
    """Run ``work`` over every chunk, split in order among ``selection.threads`` threads.

    With at most one thread the pass runs in the current thread (the caller's, or the one
    thread of its own that :func:`run_on_own_thread` started). Otherwise each thread gets a
    contiguous share of the chunks (an accelerator chunk weighs nothing, so it joins the share
    it falls in) and its own :class:`~.buffers.Worker`; the results come back in the tie-rule
    order.

    Example:
        >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
        >>> selection = Selection([torch.ones(3), torch.ones(2)], [None, None], AbsKeys(), [])
        >>> run_chunks(selection, lambda worker, chunks: chunks)
        [[[(0, 0, 3), (1, 0, 2)]]]
    """
    chunks = selection.chunks()
    selection.passes += 1
    if selection.threads <= 1 or not chunks:
        return [work(Worker(selection), chunks)]
    lengths = [chunk_length(c) if selection.device(c).type == "cpu" else 0 for c in chunks]
    workers = len(split_in_order(lengths, selection.threads))
    return map_shares(
        chunks, lengths, lambda share: work(Worker(selection, workers), share), selection.threads
    )


def run_on_own_thread(threads: int, work: Callable[[], R]) -> R:
    """``work()`` in the calling thread if ``threads`` is 0, else on a new thread of its own.

    The whole selection runs there, not only its passes: sampling and the final gather are
    large ops too.

    Example:
        >>> run_on_own_thread(1, torch.get_num_threads)
        1
    """
    if threads == 0:
        return work()
    return run_in_own_threads([work], lambda call: call())[0]


def _on_this_thread_alone(work: Callable[[G], R], group: G) -> R:
    """Set this (new, own) thread's OpenMP thread count to 1, then run ``work(group)``."""
    # torch sets up each new thread's count on its first parallel op (from the process's
    # value); done first here so that it cannot undo the next line.
    torch.get_num_threads()
    set_threads = _omp_set_num_threads()
    if set_threads is not None:
        set_threads(1)
    return work(group)


@functools.cache
def _omp_set_num_threads() -> Callable[[int], None] | None:
    """OpenMP's ``omp_set_num_threads`` (per calling thread) where torch runs on OpenMP."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        function = ctypes.CDLL(None).omp_set_num_threads
    except (AttributeError, OSError, TypeError):
        return None
    function.argtypes, function.restype = [ctypes.c_int], None
    return function  # type: ignore[no-any-return]
