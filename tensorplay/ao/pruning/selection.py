"""Choosing the ``k`` lowest-scored units across many tensors, exactly, without concatenating.

The units of several tensors ("sources") compete for one budget: the ``k`` units with the lowest
*key* are pruned, among the units still *eligible* (those whose earlier mask is ``1``).

Tie rule:
    Units are ordered by ``(key, source index, flat index)``: among equal keys, a unit of an
    earlier source is pruned first, and within one source the lower flat (row-major) index.
    The rule does not depend on the device, the dtype layout or the chunk size.

How (the streaming algorithm, no vector of all scores is ever built):

1. **Guess a band.** A seeded sample of keys (a private :class:`torch.Generator`, so the global
   RNG is untouched) gives two keys ``lo <= hi`` whose ranks bracket ``k`` with overwhelming
   probability. For uniform random keys the band follows from the quantile directly.
2. **One fused pass.** Each source is read once, in chunks small enough to stay in cache
   (sources smaller than a chunk share one, so a thousand tiny tensors cost about what one
   tensor of their total size does), spread over the CPU threads in order. Every chunk writes
   its speculative *keep* mask (``key >= lo``) straight into the output, counts the eligible
   units below ``lo`` and gathers the few candidates in ``[lo, hi]`` (value and position).
3. **Resolve exactly.** If ``count(below lo) < k <= count(below lo) + candidates``, the
   ``k - count(below lo)`` lowest candidates (tie rule) are the rest of the answer; their few
   positions are cleared in the keep masks. Done: one read of every score.
4. **Fallbacks, still exact.** A bad sample or a band swollen by ties falls back to counting
   passes over thresholds (the sampled quantiles, then a bisection of the keys' bit patterns,
   which for non-negative floats is monotone and converges in a few passes) until the band is
   small enough to gather, or narrows to one value. Then the tie at that value is resolved by
   position while the masks are written (the running count of tied units decides).

Memory: the keep masks (which the caller needs anyway), three buffers of one chunk per device
and thread (keys, flags, scratch), and the candidates (a small fraction of the units). Counts
are kept on the device and read once per pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import Tensor

__all__ = [
    "AbsKeys",
    "single_torch_thread",
    "KeySpec",
    "UniformKeys",
    "keep_masks",
    "keep_masks_reference",
]

_INF = math.inf
_R = TypeVar("_R")
# Units per chunk: the three chunk buffers of both threads (12 MB) stay in the CPU's last-level
# cache, and each torch call's fixed cost (a few microseconds) is spread over enough units;
# 2**17 to 2**20 measured, 2**19 fastest on 2 cores. On an accelerator larger chunks amortise
# kernel launches and the few host synchronisations.
_CPU_CHUNK = 1 << 19
_DEVICE_CHUNK = 1 << 24
# Sample size of the band guess: the band is 9 standard deviations of a quantile estimated
# from this many keys wide (about 0.9% of the units at k = n/2); the true quantile falls
# outside with probability ~1e-5, which costs a counting pass, never exactness.
_SAMPLE = 1 << 18
_SIGMAS = 4.5
# Most candidates gathered at once (value + position: 12 bytes each) as a fraction of the units.
_MAX_BAND_FRACTION = 1 / 48
_MIN_BAND = 1 << 19
_THRESHOLDS_PER_PASS = 31
_BLOCK = 16
_SAMPLE_SEED = 0x7E5


class KeySpec:
    """How the key of every unit is computed from its score (a chunk at a time).

    Subclasses define :meth:`chunk_keys` (elementwise from the scores, or generated) and
    :meth:`guess_band` (two keys whose ranks likely bracket a quantile). Keys must be
    non-negative, not NaN.
    """

    dtype: torch.dtype = torch.float32
    reads_scores: bool = True

    def chunk_keys(self, source: int, start: int, scores: Tensor, out: Tensor) -> Tensor:
        """Write the keys of ``scores`` (a chunk of ``source`` starting at ``start``) to ``out``.

        Args:
            source: index of the source.
            start: flat index of the chunk's first unit in the source.
            scores: the chunk of scores, flat.
            out: a buffer of ``scores.numel()`` units of :attr:`dtype` on ``scores``' device.

        Returns:
            The keys (``out`` itself, or a view of it).
        """
        raise NotImplementedError

    def sample_keys(self, scores: Tensor, index: Tensor) -> Tensor:
        """Keys of the units at the flat ``index`` of one source's flat ``scores``.

        Args:
            scores: the flat scores of one source.
            index: flat indices on ``scores``' device.

        Returns:
            The keys, of :attr:`dtype`.
        """
        raise NotImplementedError


class AbsKeys(KeySpec):
    """Keys ``|score|`` (the :class:`~tensorplay.ao.pruning.L1Unstructured` order).

    Args:
        dtype: the floating dtype all keys are compared in; choose one that holds every score
            exactly (``float32`` for fp16/bf16/fp32 scores).

    Example:
        >>> AbsKeys().chunk_keys(0, 0, torch.tensor([-2.0, 1.0]), torch.empty(2))
        tensor([2., 1.])
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype

    def chunk_keys(self, source: int, start: int, scores: Tensor, out: Tensor) -> Tensor:
        """Write ``|scores|`` in :attr:`dtype` to ``out`` (see :meth:`KeySpec.chunk_keys`)."""
        if scores.dtype == out.dtype:
            return torch.abs(scores, out=out)
        return torch.abs(out.copy_(scores), out=out)

    def sample_keys(self, scores: Tensor, index: Tensor) -> Tensor:
        """``|scores[index]|`` in :attr:`dtype` (see :meth:`KeySpec.sample_keys`)."""
        return scores[index].to(self.dtype).abs()


class UniformKeys(KeySpec):
    """Keys drawn uniformly from ``[0, 1)`` (the :class:`RandomUnstructured` order).

    Each chunk draws from its own generator seeded from ``seed``, the source and the chunk, so
    every pass over a chunk sees the same keys and the global RNG is never touched.

    Args:
        seed: the base seed (``global_unstructured`` draws it once from the global RNG, so
            ``torch.manual_seed`` makes the result reproducible).

    Example:
        >>> keys = UniformKeys(seed=1)
        >>> a = keys.chunk_keys(0, 0, torch.zeros(3), torch.empty(3))
        >>> bool(torch.equal(a, keys.chunk_keys(0, 0, torch.zeros(3), torch.empty(3))))
        True
    """

    reads_scores = False

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def chunk_keys(self, source: int, start: int, scores: Tensor, out: Tensor) -> Tensor:
        """Draw the chunk's keys into ``out`` (see :meth:`KeySpec.chunk_keys`)."""
        generator = torch.Generator(device=out.device)
        generator.manual_seed(hash((self.seed, source, start)) & ((1 << 63) - 1))
        return torch.rand(out.shape, generator=generator, out=out)


# A chunk: the (source, start, stop) pieces whose units are processed together, in order.
Chunk = list[tuple[int, int, int]]


@dataclass
class _Band:
    """The outcome of one fused pass over a band ``[lo, hi]``."""

    below: int
    values: list[Tensor] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    positions: list[Tensor] = field(default_factory=list)
    size: int = 0
    overflow: bool = False


class _Selection:
    """One selection: the sources, their eligibility and the keys."""

    def __init__(
        self,
        scores: Sequence[Tensor],
        eligible: Sequence[Tensor | None],
        keys: KeySpec,
        out_dtypes: Sequence[torch.dtype],
        labels: Sequence[str] | None = None,
    ) -> None:
        self.labels = list(labels) if labels else [f"source {i}" for i in range(len(scores))]
        self.scores = [s.detach().reshape(-1) for s in scores]
        self.eligible = [None if e is None else e.detach().reshape(-1) for e in eligible]
        self.keys = keys
        self.out_dtypes = list(out_dtypes)
        self.sizes = [s.numel() for s in self.scores]
        self.total = sum(self.sizes)
        self.threads = 1

    def chunks(self) -> list[Chunk]:
        """Every chunk, in the tie-rule order.

        A large source is cut into chunks of the chunk size; consecutive sources smaller than
        that (on one device) share chunks, so many tiny tensors cost about what one tensor of
        their total size costs, not a dozen operations each.
        """
        chunks: list[Chunk] = []
        pack: Chunk = []
        packed = 0
        for i, (scores, size) in enumerate(zip(self.scores, self.sizes, strict=True)):
            step = _chunk_size(scores.device)
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

    def device(self, chunk: Chunk) -> torch.device:
        """The device of a chunk's sources."""
        return self.scores[chunk[0][0]].device

    def run(self, work: Callable[[_Worker, list[Chunk]], _R]) -> list[_R]:
        """Run ``work`` over all chunks, split in order among the CPU threads.

        Each thread gets a contiguous share of the CPU chunks (accelerator chunks all go to
        the first); results come back in the tie-rule order.
        """
        chunks = self.chunks()
        groups: list[list[Chunk]] = [[] for _ in range(self.threads)]
        on_cpu = [chunk for chunk in chunks if self.device(chunk).type == "cpu"]
        per_thread = -(-sum(_length(chunk) for chunk in on_cpu) // self.threads)
        done = 0
        for chunk in chunks:
            if self.device(chunk).type == "cpu":
                groups[min(done // max(per_thread, 1), self.threads - 1)].append(chunk)
                done += _length(chunk)
            else:
                groups[0].append(chunk)
        groups = [group for group in groups if group]
        if len(groups) <= 1:
            return [work(_Worker(self), group) for group in groups]
        with ThreadPoolExecutor(len(groups)) as pool:
            return list(pool.map(lambda group: work(_Worker(self), group), groups))


def _chunk_size(device: torch.device) -> int:
    return _CPU_CHUNK if device.type == "cpu" else _DEVICE_CHUNK


def _length(chunk: Chunk) -> int:
    return sum(stop - start for _, start, stop in chunk)


class _Worker:
    """One thread's buffers of one chunk per device: keys, flags and scratch (key dtype)."""

    def __init__(self, selection: _Selection) -> None:
        self.selection = selection
        self._buffers: dict[torch.device, tuple[Tensor, Tensor, Tensor]] = {}

    def buffers(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        if device not in self._buffers:
            size = min(_chunk_size(device), self.selection.total)
            dtype = self.selection.keys.dtype
            self._buffers[device] = (
                torch.empty(size, dtype=dtype, device=device),
                torch.empty(size, dtype=dtype, device=device),
                torch.empty(size, dtype=dtype, device=device),
            )
        return self._buffers[device]

    def flags(self, device: torch.device) -> Tensor:
        return self.buffers(device)[1]

    def scratch(self, device: torch.device) -> Tensor:
        """A buffer free between :meth:`chunk_keys` calls."""
        return self.buffers(device)[2]

    def chunk_keys(self, chunk: Chunk, sums: _Sums | None = None) -> Tensor:
        """The keys of a chunk, ``inf`` for units not eligible; ``sums`` collects a finite check."""
        selection = self.selection
        key_buffer, _, scratch = self.buffers(selection.device(chunk))
        key = key_buffer[: _length(chunk)]
        offset = 0
        for i, start, stop in chunk:
            part = key[offset : offset + stop - start]
            scores = selection.scores[i][start:stop]
            written = selection.keys.chunk_keys(i, start, scores, part)
            if written.data_ptr() != part.data_ptr():
                part.copy_(written)
            if sums is not None and not selection.keys.reads_scores:
                sums.add(scores.sum(dtype=torch.float32))
            offset += stop - start
        if sums is not None and selection.keys.reads_scores:
            # Summed before the ineligible units become inf: a NaN or inf score (or an
            # overflow, which the exact check then clears) makes the sum non-finite.
            sums.add(key.sum())
        if all(selection.eligible[i] is None for i, _, _ in chunk):
            return key
        # key + (1 / (mask == 1) - 1): + 0 where eligible, + inf elsewhere; a few float ops,
        # several times faster than masked_fill with a bool mask. A NaN score (of a pruned
        # unit: eligible ones fail the finite check) must not survive the sum.
        penalty = scratch[: key.numel()]
        offset = 0
        for i, start, stop in chunk:
            eligible = selection.eligible[i]
            part = penalty[offset : offset + stop - start]
            if eligible is None:
                part.fill_(1)
            else:
                torch.eq(eligible[start:stop], 1, out=part)
            offset += stop - start
        torch.nan_to_num(key, nan=0.0, posinf=_INF, neginf=-_INF, out=key)
        key.add_(torch.reciprocal(penalty, out=penalty).sub_(1))
        return key

    def write(self, chunk: Chunk, values: Tensor, outs: list[Tensor]) -> None:
        """Copy a chunk's ``values`` into the pieces of ``outs`` they belong to."""
        offset = 0
        for i, start, stop in chunk:
            outs[i][start:stop].copy_(values[offset : offset + stop - start])
            offset += stop - start


class _Sums:
    """Per-device running sums, read once at the end (one host synchronisation per device)."""

    def __init__(self) -> None:
        self.totals: dict[torch.device, Tensor] = {}

    def add(self, value: Tensor) -> None:
        # Chunk sums are exact in float32 (a chunk has at most 2**24 units); their running
        # total is kept in float64, exact to 2**53.
        value = value.to(torch.float64)
        device = value.device
        self.totals[device] = self.totals[device] + value if device in self.totals else value

    def items(self) -> list[float]:
        return [float(total) for total in self.totals.values()]


def keep_masks(
    scores: Sequence[Tensor],
    eligible: Sequence[Tensor | None],
    k: int,
    keys: KeySpec,
    out_dtypes: Sequence[torch.dtype],
    *,
    labels: Sequence[str] | None = None,
    n_eligible: int | None = None,
) -> list[Tensor]:
    """Keep masks that prune the ``k`` eligible units of lowest key across all sources.

    Exact and deterministic (tie rule in the module docstring); streams over the sources, never
    concatenates them; works on any device and past ``2**31`` units.

    Args:
        scores: the sources' scores, any shapes, dtypes and devices.
        eligible: per source, its earlier mask (units equal to ``1`` are eligible) or ``None``
            (all eligible); same shape as the scores.
        k: how many eligible units to prune, ``0 <= k <= eligible units``.
        keys: how keys follow from scores (:class:`AbsKeys`, :class:`UniformKeys`).
        out_dtypes: the dtype of each returned mask.
        labels: names of the sources for error messages (default: ``source <index>``).
        n_eligible: the number of eligible units, if the caller has counted them already.

    Returns:
        Per source, a mask of the scores' shape and device: ``0`` for the ``k`` selected units,
        ``1`` everywhere else (units not eligible included).

    Raises:
        ValueError: if an eligible key is NaN or infinite (the message names the source index),
            or ``k`` is out of range.

    Example:
        >>> masks = keep_masks(
        ...     [torch.tensor([0.5, -0.1, 2.0]), torch.tensor([[0.1, 3.0]])],
        ...     [None, None],
        ...     k=2,
        ...     keys=AbsKeys(),
        ...     out_dtypes=[torch.float32, torch.bool],
        ... )
        >>> masks[0], masks[1]
        (tensor([1., 0., 1.]), tensor([[False,  True]]))
    """
    selection = _Selection(scores, eligible, keys, out_dtypes, labels)
    if n_eligible is None:
        n_eligible = count_eligible(selection.eligible, selection.sizes)
    if not 0 <= k <= n_eligible:
        raise ValueError(
            f"Expected `k` to be between 0 and the {n_eligible} eligible units, but got {k}."
        )
    outs = [
        torch.empty(s.shape, dtype=dtype, device=s.device)
        for s, dtype in zip(scores, selection.out_dtypes, strict=True)
    ]
    with _chunk_threads(selection):
        _select_into(selection, k, n_eligible, [out.view(-1) for out in outs])
    return outs


@contextmanager
def single_torch_thread() -> Iterator[None]:
    """Run torch's CPU ops on one intra-op thread for the duration (then restore the count).

    Chunk-sized ops are too small for torch's intra-op pool: its wake-ups cost more than the
    work, and far more on a busy machine. The chunks are spread over Python threads instead.

    Example:
        >>> with single_torch_thread():
        ...     torch.get_num_threads()
        1
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def _chunk_threads(selection: _Selection) -> Iterator[None]:
    """Spread the CPU chunks over Python threads, each running torch ops on one thread.

    A chunk is too small for torch's intra-op pool (its wake-ups cost more than the work, and
    far more on a busy machine), so the pool is set to one thread for the duration and the
    chunks are shared among as many Python threads instead (torch ops release the GIL).
    """
    selection.threads = max(1, min(torch.get_num_threads(), selection.total // (4 * _CPU_CHUNK)))
    with single_torch_thread():
        yield


def _select_into(selection: _Selection, k: int, n_eligible: int, flat: list[Tensor]) -> None:
    """Write the keep masks of :func:`keep_masks` into the flat views ``flat``."""
    keys = selection.keys
    cap = max(_MIN_BAND, int(selection.total * _MAX_BAND_FRACTION))
    if k in (0, n_eligible):  # nothing or everything eligible: no band to resolve
        _fused_pass(selection, -_INF if k == 0 else _INF, -_INF, flat, cap, check=True)
        return
    if n_eligible <= cap:
        lo, hi = -_INF, _largest(keys.dtype)
    else:
        lo, hi = _guess_band(selection, k, n_eligible)
    if lo == hi:  # the sample says the k-th key is heavily tied: pin it down by counting
        band = _refine(selection, k, 0.0, _INF, flat, cap, check=True)
    else:
        band = _fused_pass(selection, lo, hi, flat, cap, check=True)
        if band.overflow or not band.below < k <= band.below + band.size:
            low, high = _bounds_after(band, k, lo, hi, keys.dtype)
            band = _refine(selection, k, low, high, flat, cap)
    _clear_selected(band, k, flat)


def count_eligible(eligible: Sequence[Tensor | None], sizes: Sequence[int]) -> int:
    """The number of units equal to ``1`` in the masks (all units where a mask is ``None``).

    Args:
        eligible: earlier masks, or ``None``.
        sizes: the number of units of each source.

    Returns:
        The count.

    Example:
        >>> count_eligible([torch.tensor([1.0, 0.0]), None], [2, 3])
        4
    """
    with single_torch_thread():
        return _count_eligible(eligible, sizes)


def _count_eligible(eligible: Sequence[Tensor | None], sizes: Sequence[int]) -> int:
    total = 0
    for e, size in zip(eligible, sizes, strict=True):
        if e is None:
            total += size
            continue
        flat = e.detach().reshape(-1)
        step = _chunk_size(flat.device)
        buffer = torch.empty(min(step, size), dtype=torch.float32, device=flat.device)
        counts = [
            torch.eq(part, 1, out=buffer[: part.numel()]).sum() for part in torch.split(flat, step)
        ]
        total += sum(round(float(c)) for c in counts)
    return total


def keep_masks_reference(
    keys: Sequence[Tensor], eligible: Sequence[Tensor | None], k: int
) -> list[Tensor]:
    """The plain concatenate-and-sort answer of :func:`keep_masks` (bool masks), for testing.

    Args:
        keys: the keys of every source (already computed, any shapes).
        eligible: per source, its earlier mask or ``None``.
        k: how many eligible units to prune.

    Returns:
        Per source, a bool mask, ``False`` for the ``k`` selected units.

    Example:
        >>> keep_masks_reference([torch.tensor([1.0, 0.0, 0.0])], [None], 1)
        [tensor([ True, False,  True])]
    """
    flat = torch.cat([key.detach().reshape(-1).double().cpu() for key in keys])
    allowed = torch.cat(
        [
            torch.ones(key.numel(), dtype=torch.bool)
            if e is None
            else (e.detach().reshape(-1).cpu() == 1)
            for key, e in zip(keys, eligible, strict=True)
        ]
    )
    order = torch.sort(flat.masked_fill(~allowed, _INF), stable=True).indices
    keep = torch.ones(flat.numel(), dtype=torch.bool)
    keep[order[:k]] = False
    return [
        part.view(key.shape).to(key.device)
        for part, key in zip(torch.split(keep, [key.numel() for key in keys]), keys, strict=True)
    ]


def _largest(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def _guess_band(selection: _Selection, k: int, n_eligible: int) -> tuple[float, float]:
    """Two keys whose ranks among the eligible units very likely bracket ``k``."""
    q = k / n_eligible
    if not selection.keys.reads_scores:  # uniform keys: the quantile is the key
        width = _SIGMAS * math.sqrt(q * (1 - q) / n_eligible) + 2 / math.sqrt(n_eligible)
        return max(q - width, 0.0), min(q + width, 1.0)
    sample = _sample_keys(selection)
    size = sample.numel()
    if size < 64:
        return -_INF, _largest(selection.keys.dtype)
    width = _SIGMAS * math.sqrt(max(q * (1 - q), 1 / size) / size) + 2 / size
    lo_rank, hi_rank = math.floor((q - width) * size), math.ceil((q + width) * size)
    # Two order statistics: a linear-time selection each, no sort of the sample.
    lo = float(torch.kthvalue(sample, lo_rank + 1).values) if lo_rank >= 0 else -_INF
    hi = (
        float(torch.kthvalue(sample, hi_rank + 1).values)
        if hi_rank < size
        else _largest(selection.keys.dtype)
    )
    return lo, hi


def _sample_keys(selection: _Selection) -> Tensor:
    """Keys of eligible units at seeded uniform positions (on the CPU, a few thousand)."""
    generator = torch.Generator().manual_seed(_SAMPLE_SEED)
    # Big enough that the band (about 9 standard deviations of the sampled quantile, that is
    # 4.5 / sqrt(size) of the units) is well below the most candidates a pass may gather.
    cap = max(_MIN_BAND, int(selection.total * _MAX_BAND_FRACTION))
    size = min(_SAMPLE, selection.total, max(1 << 12, math.ceil((12 * selection.total / cap) ** 2)))
    # Sorted uniform positions without a sort: normalised cumulative exponential spacings are
    # distributed as the order statistics of uniforms.
    spacings = torch.empty(size + 1, dtype=torch.float64).exponential_(generator=generator)
    cumulative = spacings.cumsum(0)
    positions = (cumulative[:-1] * (selection.total / float(cumulative[-1]))).long()
    positions.clamp_(max=selection.total - 1)
    offsets = torch.tensor([0, *selection.sizes]).cumsum(0)
    which = torch.searchsorted(offsets, positions, right=True) - 1
    counts = torch.bincount(which, minlength=len(selection.sizes)).tolist()
    parts = []
    for i, part in enumerate(torch.split(positions, counts)):
        if part.numel() == 0:
            continue
        scores = selection.scores[i]
        index = (part - offsets[i]).to(scores.device)
        key = selection.keys.sample_keys(scores, index)
        eligible = selection.eligible[i]
        if eligible is not None:
            key = key[eligible[index] == 1]
        parts.append(key.cpu())
    return torch.cat(parts) if parts else torch.empty(0, dtype=selection.keys.dtype)


def _fused_pass(
    selection: _Selection, lo: float, hi: float, outs: list[Tensor], cap: int, *, check: bool
) -> _Band:
    """Write ``key >= lo`` into ``outs``, count eligible keys below ``lo``, gather ``[lo, hi]``.

    Everything per element is a float compare, multiply or sum (vectorised); positions are
    extracted only from the blocks of ``_BLOCK`` units that hold a candidate.
    """
    gather = hi >= lo and hi != -_INF
    share = max(cap // selection.threads, 1)

    def work(worker: _Worker, chunks: list[Chunk]) -> tuple[_Band, _Sums, _Sums]:
        band = _Band(below=0)
        kept = _Sums()
        sums = _Sums()
        for chunk in chunks:
            key = worker.chunk_keys(chunk, sums if check else None)
            # Comparisons into a float buffer are vectorised; into bool or uint8 they are not:
            # a chunk of one float output is written in place, any other goes through scratch.
            i, start, stop = chunk[0]
            direct = len(chunk) == 1 and outs[i].is_floating_point()
            keep = outs[i][start:stop] if direct else worker.scratch(key.device)[: key.numel()]
            torch.ge(key, lo, out=keep)
            kept.add(keep.sum(dtype=torch.float32))
            if not direct:
                worker.write(chunk, keep, outs)
            if not gather or band.overflow:
                continue
            flags = worker.flags(key.device)[: key.numel()]
            torch.le(key, hi, out=flags)
            flags.mul_(keep)
            index = _nonzero_blocks(flags)
            if index.numel():
                band.size += index.numel()
                if band.size > share:  # too many to gather: the caller narrows the band first
                    band.overflow = True
                    band.values, band.sources, band.positions = [], [], []
                    continue
                for source, at, positions in _pieces(chunk, index):
                    band.values.append(key[at])
                    band.sources.append(source)
                    band.positions.append(positions)
        return band, kept, sums

    results = selection.run(work)
    band = _Band(below=selection.total)
    for part, kept, _ in results:
        # Units not eligible have the key inf, so all are kept: what is not kept is below lo.
        band.below -= sum(round(c) for c in kept.items())
        band.size += part.size
        band.overflow |= part.overflow
        band.values += part.values
        band.sources += part.sources
        band.positions += part.positions
    if band.overflow:
        band.values, band.sources, band.positions = [], [], []
    totals = [total for _, _, sums in results for total in sums.items()]
    if check and not all(math.isfinite(total) for total in totals):
        _raise_if_not_finite(selection)
    return band


def _pieces(chunk: Chunk, index: Tensor) -> list[tuple[int, Tensor, Tensor]]:
    """Split sorted flat ``index``es of a chunk by piece: (source, index, position in source)."""
    if len(chunk) == 1:
        source, start, _ = chunk[0]
        return [(source, index, index + start)]
    lengths = [stop - start for _, start, stop in chunk]
    ends = torch.tensor(lengths, device=index.device).cumsum(0)
    counts = torch.diff(torch.searchsorted(index, ends), prepend=ends.new_zeros(1)).tolist()
    pieces = []
    offset = 0
    for (source, start, _), at, length in zip(
        chunk, torch.split(index, counts), lengths, strict=True
    ):
        if at.numel():
            pieces.append((source, at, at - offset + start))
        offset += length
    return pieces


def _nonzero_blocks(flags: Tensor) -> Tensor:
    """Flat indices of the non-zero entries of ``flags``, scanning only the non-zero blocks."""
    size = flags.numel() - flags.numel() % _BLOCK
    blocks = torch.nonzero(flags[:size].view(-1, _BLOCK).sum(1)).view(-1)
    inner = torch.nonzero(flags[:size].view(-1, _BLOCK)[blocks]).t()
    index = blocks[inner[0]] * _BLOCK + inner[1]
    if size < flags.numel():
        index = torch.cat([index, torch.nonzero(flags[size:]).view(-1) + size])
    return index


def _raise_if_not_finite(selection: _Selection) -> None:
    """The exact check behind a non-finite sum (which may also be a harmless overflow)."""
    _check_finite_scores(selection.scores, selection.eligible, selection.labels)


def _check_finite_scores(
    scores: Sequence[Tensor], eligible: Sequence[Tensor | None], labels: Sequence[str]
) -> None:
    """Raise if an eligible unit (earlier mask ``1``, or no mask) has a NaN or infinite score.

    Args:
        scores: the scores of each source.
        eligible: per source, its earlier mask or ``None``, of the scores' shape.
        labels: the names of the sources, for the message.

    Raises:
        ValueError: naming the first such source, the value and its flat index.

    Example:
        >>> _check_finite_scores([torch.tensor([1.0, float("nan")])], [None], ["w"])
        Traceback (most recent call last):
        ...
        ValueError: Expected finite importance scores, but w has nan at flat index 1.
    """
    for source, mask, label in zip(scores, eligible, labels, strict=True):
        flat = source.detach().reshape(-1)
        bad = ~torch.isfinite(flat)
        if mask is not None:
            bad &= mask.detach().reshape(-1).to(flat.device) == 1
        where = torch.nonzero(bad).view(-1)
        if where.numel():
            raise ValueError(
                f"Expected finite importance scores, but {label} has "
                f"{float(flat[where[0]])} at flat index {int(where[0])}."
            )


def _bounds_after(
    band: _Band, k: int, lo: float, hi: float, dtype: torch.dtype
) -> tuple[float, float]:
    """Keys ``low < high`` with ``F(low) < k <= F(high)`` (``F(t)``: eligible keys below t)."""
    if band.below >= k:
        return 0.0, lo
    if band.overflow:
        return max(lo, 0.0), _INF
    return _next_up(hi, dtype), _INF


def _refine(
    selection: _Selection,
    k: int,
    low: float,
    high: float,
    outs: list[Tensor],
    cap: int,
    *,
    check: bool = False,
) -> _Band:
    """Narrow ``[low, high)`` by counting passes until it can be gathered or is one value.

    Each pass counts the keys below a few dozen thresholds inside the interval at once: first
    the sampled keys there and their successors (so a heavily tied k-th key is pinned down in
    one pass), then a bisection of the bit patterns (monotone for non-negative floats), which
    narrows the interval 32-fold per pass.
    """
    dtype = selection.keys.dtype
    sample = _sample_keys(selection) if selection.keys.reads_scores else None
    while True:
        thresholds = [low, *_split_points(low, high, dtype, sample), high]
        counts = _count_below(selection, thresholds, check=check)
        check = sample = None  # type: ignore[assignment]
        j = next((j for j in range(len(counts) - 1) if counts[j] < k <= counts[j + 1]), None)
        if j is None:
            raise RuntimeError(f"Lost the k-th key between {low} and {high}: please report.")
        low, high = thresholds[j], thresholds[j + 1]
        if counts[j + 1] - counts[j] <= cap:
            return _fused_pass(selection, low, _next_down(high, dtype), outs, cap, check=False)
        if _next_up(low, dtype) == high:
            return _tied_pass(selection, k, low, counts[j], outs)


def _split_points(
    low: float, high: float, dtype: torch.dtype, sample: Tensor | None
) -> list[float]:
    """Thresholds strictly inside ``(low, high)``: sampled keys, else a bit-pattern grid."""
    points: set[float] = set()
    if sample is not None:
        inside = sample[(sample > low) & (sample < high)]
        if inside.numel():
            quantiles = torch.linspace(0, 1, _THRESHOLDS_PER_PASS // 2, dtype=torch.float64)
            chosen = torch.quantile(inside.double(), quantiles, interpolation="lower").to(dtype)
            points.update(float(v) for v in chosen)
            points.update(_next_up(v, dtype) for v in list(points))
    else:
        a, b = _bits(max(low, 0.0), dtype), _bits(high, dtype)
        n = _THRESHOLDS_PER_PASS
        points.update(_from_bits(a + (b - a) * j // (n + 1), dtype) for j in range(1, n + 1))
    return sorted(p for p in points if low < p < high)


def _count_below(selection: _Selection, thresholds: list[float], *, check: bool) -> list[int]:
    """For each (sorted) threshold ``t``: the number of eligible units with key ``< t``."""

    def work(worker: _Worker, chunks: list[Chunk]) -> tuple[list[_Sums], _Sums]:
        counts = [_Sums() for _ in thresholds]
        sums = _Sums()
        for chunk in chunks:
            key = worker.chunk_keys(chunk, sums if check else None)
            flags = worker.flags(key.device)[: key.numel()]
            for t, count in zip(thresholds, counts, strict=True):
                count.add(torch.lt(key, t, out=flags).sum())
        return counts, sums

    results = selection.run(work)
    totals = [total for _, sums in results for total in sums.items()]
    if check and not all(math.isfinite(total) for total in totals):
        _raise_if_not_finite(selection)
    return [
        sum(round(c) for counts, _ in results for c in counts[j].items())
        for j in range(len(thresholds))
    ]


def _tied_pass(
    selection: _Selection, k: int, value: float, below: int, outs: list[Tensor]
) -> _Band:
    """Write the masks when the k-th key is ``value``, held by too many units to gather.

    Units below ``value`` are pruned, units above kept, and of the units equal to it the first
    ``k - below`` in the tie-rule order are pruned: a running count decides chunk by chunk.
    """
    ties = k - below
    worker = _Worker(selection)
    for chunk in selection.chunks():
        key = worker.chunk_keys(chunk)
        keep = worker.scratch(key.device)[: key.numel()]
        torch.gt(key, value, out=keep)
        equal = torch.nonzero(key == value).view(-1)
        if equal.numel() > max(ties, 0):
            keep[equal[max(ties, 0) :]] = 1
        ties -= equal.numel()
        worker.write(chunk, keep, outs)
    return _Band(below=k)


def _clear_selected(band: _Band, k: int, outs: list[Tensor]) -> None:
    """Clear the ``k - band.below`` lowest candidates (tie rule) in the keep masks."""
    wanted = k - band.below
    if wanted <= 0:
        return
    device = band.values[0].device
    values = torch.cat([v.to(device) for v in band.values])
    threshold = torch.kthvalue(values, wanted).values
    pruned = values < threshold
    equal = values == threshold
    ties = wanted - int(torch.count_nonzero(pruned))
    if ties == int(torch.count_nonzero(equal)):
        pruned |= equal
    else:  # only some of the tied candidates go: the earliest in the tie-rule order
        pruned |= equal & (torch.cumsum(equal, 0) <= ties)
    for part, i, positions in zip(
        torch.split(pruned, [v.numel() for v in band.values]),
        band.sources,
        band.positions,
        strict=True,
    ):
        chosen = positions[part.to(positions.device)]
        if chosen.numel():
            outs[i][chosen] = 0


def _bits(value: float, dtype: torch.dtype) -> int:
    int_dtype = torch.int32 if dtype == torch.float32 else torch.int64
    return int(torch.tensor([value], dtype=dtype).view(int_dtype)[0])


def _from_bits(bits: int, dtype: torch.dtype) -> float:
    int_dtype = torch.int32 if dtype == torch.float32 else torch.int64
    return float(torch.tensor([bits], dtype=int_dtype).view(dtype)[0])


def _next_up(value: float, dtype: torch.dtype) -> float:
    t = torch.tensor(value, dtype=dtype)
    return float(torch.nextafter(t, torch.tensor(_INF, dtype=dtype)))


def _next_down(value: float, dtype: torch.dtype) -> float:
    t = torch.tensor(value, dtype=dtype)
    return float(torch.nextafter(t, torch.tensor(-_INF, dtype=dtype)))
