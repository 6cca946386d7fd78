"""Validating the pruning ``amount`` and turning it into a count of units.

``amount`` is always relative to the units that are **not yet pruned** (the rule of
``torch.nn.utils.prune``): a ``float`` in ``[0, 1]`` is a fraction of them, rounded to the nearest
int (Python's ``round``, ties to even), and a non-negative ``int`` is an absolute count of them.
This module is the one place that does that arithmetic; the rest of the library calls it.
"""

from __future__ import annotations

import numbers

__all__ = [
    "compute_nparams_to_prune",
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
