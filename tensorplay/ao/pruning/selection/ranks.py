"""The ``n``-th lowest key among a band's candidates, without joining them.

A band's candidates come in pieces (one per chunk and source), a percent of the units or so:
joined and handed to ``kthvalue`` they would cost five more copies of themselves at once (the
join, ``kthvalue``'s working copy and its ``int64`` indices), a quarter of a byte per unit of
the model. Instead the ``n``-th key is found by a radix selection of the keys' bit patterns
(monotone for non-negative floats), 16 bits a round, two rounds for ``float32`` keys: each
round counts the keys per digit, a block of consecutive pieces at a time
(``tuning.RANK_BLOCK``), so nothing larger than a block is ever made. The candidates of one
band are in the tie-rule order (source, then flat index), so the ``n``-th of a tied key is
found by counting along them.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import tuning

__all__ = ["lowest_key", "nth_equal"]

_DIGIT = 16


def lowest_key(pieces: list[Tensor], wanted: int, dtype: torch.dtype) -> tuple[float, int]:
    """The ``wanted``-th lowest key of all pieces (from 1), and its rank among its ties.

    Args:
        pieces: the keys, non-negative floats of ``dtype`` (``float32`` or ``float64``), flat.
        wanted: the rank, ``1 <= wanted <=`` the number of keys.
        dtype: the keys' dtype.

    Returns:
        ``(value, nth)``: the key, and ``wanted`` minus the keys below it.

    Example:
        >>> lowest_key([torch.tensor([0.5, 0.1]), torch.tensor([0.5, 0.3])], 3, torch.float32)
        (0.5, 1)
    """
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    width = 32 if dtype == torch.float32 else 64
    prefix = 0
    for shift in range(width - _DIGIT, -1, -_DIGIT):
        counts = torch.zeros(1 << _DIGIT, dtype=torch.int64)
        for block in _blocks(pieces):
            # + 0.0: -0.0 (equal to 0.0, with the sign bit set) becomes 0.0.
            pattern = block.add(0.0).view(bits)
            if shift + _DIGIT < width:  # only the keys of the digits decided so far
                pattern = pattern[pattern.bitwise_right_shift(shift + _DIGIT) == prefix]
            digits = pattern.bitwise_right_shift(shift).bitwise_and_((1 << _DIGIT) - 1)
            counts += torch.bincount(digits, minlength=1 << _DIGIT).cpu()
        below = counts.cumsum(0)
        digit = int(torch.searchsorted(below, wanted))
        wanted -= int(below[digit - 1]) if digit else 0
        prefix = (prefix << _DIGIT) | digit
    value = torch.tensor([prefix], dtype=bits).view(dtype)
    return float(value), wanted


def nth_equal(pieces: list[Tensor], value: float, nth: int) -> tuple[int, int]:
    """Where the ``nth`` key equal to ``value`` lies along the pieces (from 1).

    Args:
        pieces: the keys, flat.
        value: the key.
        nth: its rank among the keys equal to it, at least 1 and at most their number.

    Returns:
        ``(piece, index)``: the piece and the index in it.

    Example:
        >>> nth_equal([torch.tensor([0.5, 0.1]), torch.tensor([0.3, 0.5])], 0.5, 2)
        (1, 1)
    """
    first = 0
    for block, count in _counted_blocks(pieces):
        found = int(torch.count_nonzero(block == value))
        if nth > found:
            nth -= found
            first += count
            continue
        for piece in range(first, first + count):
            at = torch.nonzero(pieces[piece] == value).view(-1)
            if nth <= at.numel():
                return piece, int(at[nth - 1])
            nth -= at.numel()
    raise RuntimeError(f"Lost the tied key {value} among the candidates: please report.")


def _blocks(pieces: list[Tensor]) -> Iterator[Tensor]:
    """Consecutive pieces joined into blocks of about ``tuning.RANK_BLOCK`` keys, on one device
    each."""
    for block, _ in _counted_blocks(pieces):
        yield block


def _counted_blocks(pieces: list[Tensor]) -> Iterator[tuple[Tensor, int]]:
    """Each block and the number of pieces it joins."""
    start, size = 0, 0
    for index, piece in enumerate(pieces):
        ends = index + 1 == len(pieces) or pieces[index + 1].device != piece.device
        size += piece.numel()
        if ends or size >= tuning.RANK_BLOCK:
            part = pieces[start : index + 1]
            yield (part[0] if len(part) == 1 else torch.cat(part)), len(part)
            start, size = index + 1, 0
