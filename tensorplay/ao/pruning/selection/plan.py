"""Chunk planning: the sources of one selection, cut into chunks in the tie-rule order."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import tuning
from tensorplay.ao.pruning.selection.keys import KeySpec
from tensorplay.ao.pruning.selection.sharding import Collectives, ShardLayout

__all__ = ["Chunk", "Selection", "chunk_length", "chunk_size", "piece_slices"]

# A chunk: the (source, start, stop) pieces whose units are processed together, in order.
Chunk = list[tuple[int, int, int]]


def chunk_size(device: torch.device) -> int:
    """Units per chunk on ``device`` (see :mod:`~tensorplay.ao.pruning.selection.tuning`).

    Example:
        >>> chunk_size(torch.device("cpu")) == tuning.CPU_CHUNK
        True
    """
    return tuning.CPU_CHUNK if device.type == "cpu" else tuning.DEVICE_CHUNK


def chunk_length(chunk: Chunk) -> int:
    """The number of units of a chunk.

    Example:
        >>> chunk_length([(0, 0, 10), (1, 0, 20)])
        30
    """
    return sum(stop - start for _, start, stop in chunk)


def piece_slices(chunk: Chunk) -> list[tuple[int, int, int]]:
    """Per piece of a chunk: (source, first, stop) within the chunk's buffers.

    Example:
        >>> piece_slices([(0, 5, 7), (1, 0, 3)])
        [(0, 0, 2), (1, 2, 5)]
    """
    out, offset = [], 0
    for i, start, stop in chunk:
        out.append((i, offset, offset + stop - start))
        offset += stop - start
    return out


class Selection:
    """One selection: the sources (flat scores), their eligibility, the keys and the output dtypes.

    Sharded (``layouts`` and ``comm`` given), the scores are this rank's local pieces; counts
    that decide anything are summed over the ranks, and :attr:`units` counts the full sources.

    Args:
        scores: the sources' scores, any shapes.
        eligible: per source, its earlier mask or ``None``.
        keys: how keys follow from scores.
        out_dtypes: the dtype of each source's keep mask.
        labels: names of the sources for error messages (default: ``source <index>``).
        layouts: where each local piece sits in its full source (default: it is the source).
        comm: the collectives over the ranks (default: one process).

    Example:
        >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
        >>> selection = Selection([torch.ones(3), torch.ones(2, 2)], [None, None], AbsKeys(), [])
        >>> selection.total, selection.labels
        (7, ['source 0', 'source 1'])
    """

    def __init__(
        self,
        scores: Sequence[Tensor],
        eligible: Sequence[Tensor | None],
        keys: KeySpec,
        out_dtypes: Sequence[torch.dtype],
        labels: Sequence[str] | None = None,
        layouts: Sequence[ShardLayout] | None = None,
        comm: Collectives | None = None,
    ) -> None:
        self.labels = list(labels) if labels else [f"source {i}" for i in range(len(scores))]
        self.scores = [s.detach().reshape(-1) for s in scores]
        self.eligible = [None if e is None else e.detach().reshape(-1) for e in eligible]
        self.keys = keys
        self.out_dtypes = list(out_dtypes)
        self.sizes = [s.numel() for s in self.scores]
        self.total = sum(self.sizes)
        self.layouts = list(layouts) if layouts else [ShardLayout(n, 0) for n in self.sizes]
        self.comm = comm if comm is not None else Collectives(None)
        # The units of the full sources, over all ranks: every rank decides alike from them.
        self.units = sum(layout.numel for layout in self.layouts)
        # Threads of its own each pass runs on (0: the calling thread); set by the caller.
        self.threads = 0
        # Passes over the units so far (each pass counts one).
        self.passes = 0

    @property
    def cap(self) -> int:
        """The most candidates one pass may gather (:func:`~.tuning.band_cap` of the units)."""
        return tuning.band_cap(self.units)

    @property
    def cpu_units(self) -> int:
        """The number of units on the CPU."""
        return sum(s.numel() for s in self.scores if s.device.type == "cpu")

    def device(self, chunk: Chunk) -> torch.device:
        """The device of a chunk's sources."""
        return self.scores[chunk[0][0]].device

    def chunks(self) -> list[Chunk]:
        """Every chunk, in the tie-rule order.

        A large source is cut into chunks of the chunk size; consecutive sources smaller than
        that (on one device) share chunks, so many tiny tensors cost about what one tensor of
        their total size costs, not a dozen operations each.

        Example:
            >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
            >>> scores = [torch.ones(3), torch.ones(2)]
            >>> Selection(scores, [None, None], AbsKeys(), []).chunks()
            [[(0, 0, 3), (1, 0, 2)]]
        """
        chunks: list[Chunk] = []
        pack: Chunk = []
        packed = 0
        for i, (scores, size) in enumerate(zip(self.scores, self.sizes, strict=True)):
            step = chunk_size(scores.device)
            if size == 0:
                continue
            fits = pack and size < step and packed + size <= step
            if fits and scores.device == self.scores[pack[0][0]].device:
                pack.append((i, 0, size))
                packed += size
                continue
            if pack:
                chunks.append(pack)
            pack, packed = [], 0
            if size < step:
                pack, packed = [(i, 0, size)], size
                continue
            chunks += [[(i, start, min(start + step, size))] for start in range(0, size, step)]
        if pack:
            chunks.append(pack)
        return chunks
