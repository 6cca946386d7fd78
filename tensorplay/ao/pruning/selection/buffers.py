"""One thread's working memory: chunk buffers per device, and running sums kept on the device.

Every op of a pass writes into these buffers, and reads operands of one dtype: an op whose
operands or output differ in dtype (a ``bfloat16`` weight times ``float32`` keep factors, a
``float32`` compare written to ``float16``) makes a temporary of the whole operand on the CPU,
per call. Freed between chunks while the gathered candidates stay alive, those temporaries
fragment the heap, which then grows by about one per chunk (measured: +1.3 bytes per parameter
over one pass of a ``bfloat16`` model, and 10-20 times slower ops). So a value of another dtype
is first copied into a buffer of its own dtype (:meth:`Worker.cast`: a copy converts without a
temporary), then used.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection.plan import Chunk, Selection, chunk_length, chunk_size

__all__ = ["Sums", "Worker"]


class Sums:
    """Per-device running sums, read once at the end (one host synchronisation per device).

    Example:
        >>> sums = Sums()
        >>> sums.add(torch.tensor(2.0))
        >>> sums.add(torch.tensor(3.0))
        >>> sums.items()
        [5.0]
    """

    def __init__(self) -> None:
        self.totals: dict[torch.device, Tensor] = {}

    def add(self, value: Tensor) -> None:
        """Add a 0-d tensor to the running total of its device."""
        # Chunk sums are exact in float32 (a chunk has at most 2**24 units); their running
        # total is kept in float64, exact to 2**53.
        value = value.to(torch.float64)
        device = value.device
        self.totals[device] = self.totals[device] + value if device in self.totals else value

    def items(self) -> list[float]:
        """The totals, one per device (a host synchronisation each)."""
        return [float(total) for total in self.totals.values()]


class Worker:
    """One thread's buffers of one chunk per device: keys, flags and scratch (key dtype).

    Args:
        selection: the selection whose chunks this worker processes.
        workers: how many workers share the pass (each may gather its share of the
            candidates, :attr:`cap`).

    Example:
        >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
        >>> selection = Selection([torch.tensor([-3.0, 1.0])], [torch.tensor([1.0, 0.0])],
        ...                       AbsKeys(), [torch.bool])
        >>> Worker(selection).chunk_keys([(0, 0, 2)])
        tensor([3., inf])
    """

    def __init__(self, selection: Selection, workers: int = 1) -> None:
        self.selection = selection
        self.cap = max(selection.cap // workers, 1)
        self._buffers: dict[torch.device, tuple[Tensor, Tensor, Tensor]] = {}
        self._casts: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def buffers(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """The keys, flags and scratch buffers on ``device`` (made on first use)."""
        if device not in self._buffers:
            size = min(chunk_size(device), self.selection.total)
            dtype = self.selection.keys.dtype
            self._buffers[device] = (
                torch.empty(size, dtype=dtype, device=device),
                torch.empty(size, dtype=dtype, device=device),
                torch.empty(size, dtype=dtype, device=device),
            )
        return self._buffers[device]

    def flags(self, device: torch.device) -> Tensor:
        """A buffer for comparisons, free between passes' uses."""
        return self.buffers(device)[1]

    def scratch(self, device: torch.device) -> Tensor:
        """A buffer free between :meth:`chunk_keys` calls."""
        return self.buffers(device)[2]

    def cast(self, values: Tensor, dtype: torch.dtype) -> Tensor:
        """``values`` (at most a chunk) in ``dtype``: themselves, or copied into a buffer of
        ``dtype`` kept for the next call (free again after the caller's next op).

        Example:
            >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
            >>> worker = Worker(Selection([torch.ones(4)], [None], AbsKeys(), []))
            >>> worker.cast(torch.tensor([1.0, 0.0]), torch.bfloat16)
            tensor([1., 0.], dtype=torch.bfloat16)
        """
        if values.dtype == dtype:
            return values
        place = (values.device, dtype)
        if place not in self._casts:
            size = min(chunk_size(values.device), self.selection.total)
            self._casts[place] = torch.empty(size, dtype=dtype, device=values.device)
        return self._casts[place][: values.numel()].copy_(values)

    def chunk_keys(self, chunk: Chunk, sums: Sums | None = None) -> Tensor:
        """The keys of a chunk, ``inf`` for units not eligible; ``sums`` collects a finite check."""
        key = self.raw_keys(chunk, sums)
        if all(self.selection.eligible[i] is None for i, _, _ in chunk):
            return key
        return self._exclude_ineligible(chunk, key)

    def raw_keys(self, chunk: Chunk, sums: Sums | None = None) -> Tensor:
        """The keys of every unit of a chunk (eligible or not), in the keys buffer."""
        selection = self.selection
        key = self.buffers(selection.device(chunk))[0][: chunk_length(chunk)]
        offset = 0
        for i, start, stop in chunk:
            part = key[offset : offset + stop - start]
            scores = selection.scores[i][start:stop]
            # Keys are a function of the global flat index (random keys), not the local one.
            offset_in_source = selection.layouts[i].offset
            written = selection.keys.chunk_keys(i, offset_in_source + start, scores, part)
            if written.data_ptr() != part.data_ptr():
                part.copy_(written)
            if sums is not None and not selection.keys.reads_scores:
                sums.add(scores.sum(dtype=torch.float32))
            offset += stop - start
        if sums is not None and selection.keys.reads_scores:
            # Summed before the ineligible units become inf: a NaN or inf score (or an
            # overflow, which the exact check then clears) makes the sum non-finite.
            sums.add(key.sum())
        return key

    def _exclude_ineligible(self, chunk: Chunk, key: Tensor) -> Tensor:
        """Add ``inf`` to the keys of units not eligible (in place)."""
        # key + (1 / (mask == 1) - 1): + 0 where eligible, + inf elsewhere; a few float ops,
        # several times faster than masked_fill with a bool mask. A NaN score (of a pruned
        # unit: eligible ones fail the finite check) must not survive the sum.
        penalty = self.eligible_flags(chunk, self.scratch(key.device)[: key.numel()])
        torch.nan_to_num(key, nan=0.0, posinf=math.inf, neginf=-math.inf, out=key)
        return key.add_(torch.reciprocal(penalty, out=penalty).sub_(1))

    def eligible_flags(self, chunk: Chunk, out: Tensor) -> Tensor:
        """Write ``1`` for the chunk's eligible units, ``0`` for the others, into ``out``."""
        offset = 0
        for i, start, stop in chunk:
            eligible = self.selection.eligible[i]
            part = out[offset : offset + stop - start]
            if eligible is None:
                part.fill_(1)
            elif eligible.dtype == torch.bool:
                # Read as bytes: bool to float is not vectorised, uint8 to float is (5x).
                part.copy_(eligible[start:stop].view(torch.uint8))
            else:
                earlier = eligible[start:stop]
                if earlier.dtype != part.dtype == torch.promote_types(earlier.dtype, part.dtype):
                    earlier = part.copy_(earlier)  # exact: compared without a temporary
                torch.eq(earlier, 1, out=part)
            offset += stop - start
        return out

    def write(self, chunk: Chunk, values: Tensor, outs: list[Tensor]) -> None:
        """Copy a chunk's ``values`` into the pieces of ``outs`` they belong to."""
        offset = 0
        for i, start, stop in chunk:
            outs[i][start:stop].copy_(values[offset : offset + stop - start])
            offset += stop - start

    def clear(
        self, chunk: Chunk, keep: Tensor, eligible: Tensor | None, masks: list[Tensor]
    ) -> None:
        """Write a chunk's keep flags into the masks that are also its eligibility (in place).

        A bool mask takes the flags. A float mask (eligible where ``1``) has its eligible units
        that the flags clear set to ``0``, and keeps every other value as it is.

        Args:
            chunk: the chunk.
            keep: its keep flags (``0`` or ``1``; ``0`` where not eligible).
            eligible: its eligibility flags, overwritten; ``None``: every unit is eligible (a
                float mask then holds only ``1``).
            masks: per source, its flat mask.
        """
        offset = 0
        for i, start, stop in chunk:
            mask, flags = masks[i][start:stop], keep[offset : offset + stop - start]
            if mask.dtype == torch.bool or eligible is None:
                mask.copy_(flags)
            else:  # eligible and cleared now: 1 - 1 = 0; any other value minus 0 stays
                cleared = eligible[offset : offset + stop - start].sub_(flags)
                mask.sub_(self.cast(cleared, mask.dtype))
            offset += stop - start

    def zero(self, chunk: Chunk, keep: Tensor, zero: list[Tensor | None]) -> None:
        """Multiply each piece of ``zero`` in the chunk by the chunk's ``keep`` factors (0 or 1),
        in the piece's own dtype (``x * 0`` keeps its sign and NaN stays NaN, as in float32)."""
        offset = 0
        for i, start, stop in chunk:
            target = zero[i]
            if target is not None:
                factors = keep[offset : offset + stop - start]
                target[start:stop].mul_(self.cast(factors, target.dtype))
            offset += stop - start
