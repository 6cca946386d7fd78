"""What the inputs hold: the number of eligible units, and that their scores are finite."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection.plan import chunk_size
from tensorplay.ao.pruning.selection.threads import map_shares, own_threads

__all__ = ["check_finite_scores", "count_eligible", "count_true", "count_zeros"]

# Eight bytes of ``True``, read as one int64 word.
_ALL_TRUE = int.from_bytes(bytes([1] * 8), "little")
# Words summed per group: a byte lane of the sum then holds at most 255, so no carry crosses.
_WORDS_PER_SUM = 255


def count_eligible(eligible: Sequence[Tensor | None], sizes: Sequence[int]) -> int:
    """The number of units equal to ``1`` in the masks (all units where a mask is ``None``).

    Counted a chunk at a time (no temporary of a whole mask), exactly past ``2**24`` units.

    Args:
        eligible: earlier masks, or ``None``.
        sizes: the number of units of each source.

    Returns:
        The count.

    Example:
        >>> count_eligible([torch.tensor([1.0, 0.0]), None], [2, 3])
        4
    """
    # Bool masks are read eight bytes at a time (count_true): parts of 8 chunks.
    parts = [
        part
        for mask in eligible
        if mask is not None
        for part in torch.split(
            mask.detach().reshape(-1),
            chunk_size(mask.device) * (8 if mask.dtype == torch.bool else 1),
        )
    ]
    whole = sum(size for mask, size in zip(eligible, sizes, strict=True) if mask is None)
    lengths = [part.numel() if part.device.type == "cpu" else 0 for part in parts]
    return whole + sum(map_shares(parts, lengths, _count_ones, own_threads(sum(lengths))))


def _count_ones(parts: list[Tensor]) -> int:
    """The number of units equal to ``1`` in ``parts`` (chunk-sized, flat)."""
    size = max((part.numel() for part in parts if part.dtype != torch.bool), default=0)
    buffers: dict[torch.device, Tensor] = {}
    counts: list[Tensor | int] = []
    for part in parts:
        if part.dtype == torch.bool:  # no float copy of a bool mask: count its set bytes
            counts.append(count_true(part))
            continue
        if part.device not in buffers:
            buffers[part.device] = torch.empty(size, dtype=torch.float32, device=part.device)
        out = buffers[part.device][: part.numel()]
        if part.dtype in (torch.float16, torch.bfloat16):  # compared in float32: no temporary
            part = out.copy_(part)
        counts.append(torch.eq(part, 1, out=out).sum())
    return sum(round(float(count)) for count in counts)


def count_true(mask: Tensor) -> int:
    """The number of ``True`` units of a flat contiguous bool tensor.

    Read eight bytes at a time as int64 words (``count_nonzero`` of a bool tensor is several
    times slower): all ``True`` if every word is eight ``True`` bytes (one ``aminmax``), else
    the words are summed in groups of 255, whose byte lanes then hold their counts exactly.

    Example:
        >>> count_true(torch.tensor([True, False] * 300 + [True] * 7))
        307
    """
    start = (-mask.storage_offset()) % 8
    stop = start + (mask.numel() - start) // 8 * 8
    if stop <= start:
        return int(torch.count_nonzero(mask))
    edges = int(torch.count_nonzero(mask[:start])) + int(torch.count_nonzero(mask[stop:]))
    words = mask[start:stop].view(torch.int64)
    low, high = torch.aminmax(words)
    if int(low) == int(high) == _ALL_TRUE:
        return edges + words.numel() * 8
    grouped = words.numel() - words.numel() % _WORDS_PER_SUM
    lanes = words[:grouped].view(-1, _WORDS_PER_SUM).sum(1)
    rest = int(torch.count_nonzero(words[grouped:].view(torch.bool)))
    return edges + int(lanes.view(torch.uint8).sum()) + rest


def check_finite_scores(
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
        >>> check_finite_scores([torch.tensor([1.0, float("nan")])], [None], ["w"])
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


def count_zeros(tensors: Sequence[Tensor | None]) -> list[int]:
    """The zeros of each tensor (0 for ``None``), exact, with one transfer per device.

    A floating-point tensor is counted through its bits (an integer view: ten times faster than
    ``count_nonzero`` on floats on a CPU); only where some unit is ``-0.0`` (the smallest
    integer of the view) are its float values counted.

    Example:
        >>> import torch
        >>> count_zeros([torch.tensor([0.0, 1.0, -0.0]), None, torch.zeros(3, dtype=torch.int8)])
        [2, 0, 3]
    """
    counts = [0] * len(tensors)
    by_device: dict[torch.device, list[tuple[int, Tensor]]] = {}
    for index, tensor in enumerate(tensors):
        if tensor is None or not tensor.numel():
            continue
        if _is_cpu_bool(tensor):  # a lean mask: eight bytes at a time, no transfer to wait for
            counts[index] = tensor.numel() - count_true(tensor.view(-1))
        else:
            by_device.setdefault(tensor.device, []).append((index, tensor))
    with torch.no_grad():
        for entries in by_device.values():
            views = [_bits(tensor) for _, tensor in entries]
            # A unit of -0.0 is the smallest integer of the view: count those tensors as floats.
            checks = [
                bits.min() == torch.iinfo(bits.dtype).min for bits in views if bits is not None
            ]
            signed = iter(torch.stack(checks).tolist() if checks else [])
            nonzero = torch.stack(
                [
                    torch.count_nonzero(tensor if bits is None or next(signed) else bits)
                    for (_, tensor), bits in zip(entries, views, strict=True)
                ]
            )
            for (index, tensor), kept in zip(entries, nonzero.tolist(), strict=True):
                counts[index] = tensor.numel() - int(kept)
    return counts


_INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _is_cpu_bool(tensor: Tensor) -> bool:
    return tensor.dtype == torch.bool and tensor.device.type == "cpu" and tensor.is_contiguous()


def _bits(tensor: Tensor) -> Tensor | None:
    """A floating-point tensor's bits as integers (a view), or ``None`` for other tensors."""
    as_int = _INT_OF_SIZE.get(tensor.element_size())
    if not tensor.is_floating_point() or as_int is None or not tensor.is_contiguous():
        return None
    return tensor.view(as_int)
