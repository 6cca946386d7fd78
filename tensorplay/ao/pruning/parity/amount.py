"""Validating the pruning ``amount`` and turning it into a count of units.

``amount`` is always relative to the units that are **not yet pruned** (the rule of
``torch.nn.utils.prune``): a ``float`` in ``[0, 1]`` is a fraction of them, rounded to the nearest
int (Python's ``round``, ties to even), and a non-negative ``int`` is an absolute count of them.
This module is the one place that does that arithmetic; the rest of the library calls it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

__all__ = [
    "caps_under",
    "compute_nparams_to_prune",
    "global_count",
    "kept_multiple",
    "layerwise_counts",
    "min_kept",
    "row_goal",
    "validate_pruning_amount",
    "validate_pruning_amount_init",
]

PruningAmount = int | float


def validate_pruning_amount_init(amount: object) -> None:
    """Check the type and range of ``amount`` where no tensor is known yet.

    Args:
        amount: the quantity to prune: a float in ``[0, 1]`` (a fraction of the units not yet
            pruned) or a non-negative int (a count of them).

    Raises:
        TypeError: if ``amount`` is neither an int nor a float (``bool`` counts as an int, as in
            torch).
        ValueError: if ``amount`` is a float outside ``[0, 1]`` or a negative int.

    Example:
        >>> validate_pruning_amount_init(0.3)
        >>> validate_pruning_amount_init(-3)
        Traceback (most recent call last):
        ...
        ValueError: Expected `amount` to be a float in [0, 1] or a non-negative int, but got -3.
    """
    if not isinstance(amount, numbers.Real):
        raise TypeError(
            f"Expected `amount` to be an int or a float, but got {amount!r} "
            f"of type {type(amount).__name__}."
        )
    if isinstance(amount, numbers.Integral):
        out_of_range = int(amount) < 0
    else:
        out_of_range = not 0.0 <= float(amount) <= 1.0  # also rejects NaN
    if out_of_range:
        raise ValueError(
            f"Expected `amount` to be a float in [0, 1] or a non-negative int, but got {amount}."
        )


def validate_pruning_amount(amount: PruningAmount, tensor_size: int) -> None:
    """Check that an int ``amount`` does not exceed the units available.

    Args:
        amount: the quantity to prune (a float is always valid here: it is a fraction).
        tensor_size: the number of units that may still be pruned.

    Raises:
        ValueError: if ``amount`` is an int larger than ``tensor_size``.

    Example:
        >>> validate_pruning_amount(3, tensor_size=5)
        >>> validate_pruning_amount(6, tensor_size=5)
        Traceback (most recent call last):
        ...
        ValueError: Expected `amount` to be at most the number of units not yet pruned (5), but ...
    """
    if isinstance(amount, numbers.Integral) and int(amount) > tensor_size:
        raise ValueError(
            "Expected `amount` to be at most the number of units not yet pruned "
            f"({tensor_size}), but got {amount}."
        )


def compute_nparams_to_prune(amount: PruningAmount, tensor_size: int) -> int:
    """Turn ``amount`` into the number of units to prune.

    Args:
        amount: a fraction (float) or a count (int) of the units not yet pruned.
        tensor_size: the number of units not yet pruned.

    Returns:
        ``amount`` itself for an int, ``round(amount * tensor_size)`` for a float.

    Example:
        >>> compute_nparams_to_prune(0.5, 7)
        4
        >>> compute_nparams_to_prune(3, 7)
        3
    """
    if isinstance(amount, numbers.Integral):
        return int(amount)
    return round(float(amount) * tensor_size)


# torch's private names, kept because torch code and tests reach for them.
_validate_pruning_amount_init = validate_pruning_amount_init
_validate_pruning_amount = validate_pruning_amount
_compute_nparams_toprune = compute_nparams_to_prune


def min_kept(numel: int, min_density: float) -> int:
    """The fewest units to keep so that ``kept / numel >= min_density`` holds in float math.

    Example:
        >>> min_kept(10, 0.25), min_kept(3, 0.0)
        (3, 0)
    """
    keep = min(numel, math.ceil(min_density * numel))
    while keep > 0 and (keep - 1) / numel >= min_density:
        keep -= 1
    while keep < numel and keep / numel < min_density:
        keep += 1
    return keep


def caps_under(min_density: float, pruned: Sequence[int], numels: Sequence[int]) -> list[int]:
    """How many more units each tensor may lose under ``min_density``.

    Example:
        >>> caps_under(0.5, [1, 0], [4, 4])
        [1, 2]
    """
    return [
        max(0, numel - min_kept(numel, min_density) - done)
        for numel, done in zip(numels, pruned, strict=True)
    ]


def layerwise_counts(
    target: float, pruned: Sequence[int], numels: Sequence[int], caps: Sequence[int]
) -> list[int]:
    """Per tensor, the units still to prune to reach ``target`` sparsity in it, within its cap.

    Example:
        >>> layerwise_counts(0.5, [1, 0], [4, 10], [9, 3])
        [1, 3]
    """
    return [
        min(compute_nparams_to_prune(target, numel) - done, cap)
        for numel, done, cap in zip(numels, pruned, caps, strict=True)
    ]


def global_count(
    target: float, pruned: Sequence[int], numels: Sequence[int], caps: Sequence[int] | None
) -> int:
    """The units still to prune over all tensors to reach ``target`` sparsity,
    ``round(target * total) - already_pruned``, within the sum of ``caps`` if given.

    Example:
        >>> global_count(0.5, [1, 0], [4, 10], None), global_count(0.5, [1, 0], [4, 10], [1, 2])
        (6, 3)
    """
    count = compute_nparams_to_prune(target, sum(numels)) - sum(pruned)
    return count if caps is None else min(count, sum(caps))


def kept_multiple(wanted: int, kept: int, multiple: int, least: int = 0) -> int:
    """The width a group of ``kept`` units keeps when a selection would leave it ``wanted`` but
    its widths are multiples of ``multiple``: ``wanted`` rounded to the nearest multiple (half
    up), at least ``multiple`` and ``least`` (``min_density``'s floor, raised to a multiple) and
    at most ``kept`` (a pruned unit stays pruned).

    Example:
        >>> kept_multiple(11, 24, 8), kept_multiple(12, 24, 8), kept_multiple(2, 24, 8)
        (8, 16, 8)
        >>> kept_multiple(10, 32, 8, least=10)  # 8 would keep fewer than min_density's 10
        16
    """
    if wanted >= kept:
        return kept
    rounded = multiple * math.floor(wanted / multiple + 0.5)
    floor = multiple * max(1, math.ceil(least / multiple))
    return min(kept, max(floor, rounded))


def row_goal(target: float, row_size: int, min_density: float) -> int:
    """The units each row of ``row_size`` units holds pruned at ``target`` sparsity
    (``scope="row"``): ``round(target * row_size)``, at most what ``min_density`` lets a row
    lose. A row with fewer pruned prunes the difference; one with more keeps them pruned.

    Example:
        >>> row_goal(0.5, 5, 0.0), row_goal(0.9, 10, 0.25)
        (2, 7)
    """
    return min(
        compute_nparams_to_prune(target, row_size), row_size - min_kept(row_size, min_density)
    )
