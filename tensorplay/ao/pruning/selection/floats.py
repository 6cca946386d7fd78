"""Float helpers of the refinement: neighbours and bit patterns of keys in their dtype.

For non-negative floats the bit pattern, read as an integer, is monotone in the value, so a
bisection of bit patterns narrows any interval of keys in a few passes.
"""

from __future__ import annotations

import math

import torch

__all__ = ["from_bits", "largest", "next_down", "next_up", "to_bits"]


def _int_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype of ``dtype``'s width (float32 or float64)."""
    return torch.int32 if dtype == torch.float32 else torch.int64


def to_bits(value: float, dtype: torch.dtype) -> int:
    """The bit pattern of ``value`` in ``dtype``, as an integer.

    Example:
        >>> to_bits(1.0, torch.float32) == 0x3F800000
        True
    """
    return int(torch.tensor([value], dtype=dtype).view(_int_dtype(dtype))[0])


def from_bits(bits: int, dtype: torch.dtype) -> float:
    """The value of ``dtype`` whose bit pattern is ``bits`` (the inverse of :func:`to_bits`).

    Example:
        >>> from_bits(0x3F800000, torch.float32)
        1.0
    """
    return float(torch.tensor([bits], dtype=_int_dtype(dtype)).view(dtype)[0])


def next_up(value: float, dtype: torch.dtype) -> float:
    """The smallest value of ``dtype`` above ``value``.

    Example:
        >>> next_up(1.0, torch.float32) == 1.0 + 2.0**-23
        True
    """
    t = torch.tensor(value, dtype=dtype)
    return float(torch.nextafter(t, torch.tensor(math.inf, dtype=dtype)))


def next_down(value: float, dtype: torch.dtype) -> float:
    """The largest value of ``dtype`` below ``value``.

    Example:
        >>> next_down(1.0, torch.float32) == 1.0 - 2.0**-24
        True
    """
    t = torch.tensor(value, dtype=dtype)
    return float(torch.nextafter(t, torch.tensor(-math.inf, dtype=dtype)))


def largest(dtype: torch.dtype) -> float:
    """The largest finite value of ``dtype``.

    Example:
        >>> largest(torch.float16)
        65504.0
    """
    return float(torch.finfo(dtype).max)
