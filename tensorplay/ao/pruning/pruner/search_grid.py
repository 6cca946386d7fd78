"""The candidates of a search: how the parameters to remove are shared among the kinds.

A candidate is an *allocation*: one share per kind, each a fraction in ``[0, 1]``, summing to 1
(the share of the parameters to remove that the kind removes). :func:`allocations` lays a grid
over that simplex, every share a multiple of ``1 / steps``, and adds each kind alone; for ``k``
kinds and ``steps`` parts the grid holds :math:`\\binom{steps + k - 1}{k - 1}` allocations (with
quarters: 15 for 3 kinds, 35 for 4). Pure: no torch.

Example:
    >>> grid = allocations(("layer", "channel"), 2)
    >>> [tuple(float(share) for share in allocation.values()) for allocation in grid]
    [(0.0, 1.0), (0.5, 0.5), (1.0, 0.0)]
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Literal

__all__ = [
    "SEARCH_ORDER",
    "Allocation",
    "SearchGrid",
    "allocations",
    "check_allocation",
    "check_grid",
    "check_search",
    "check_search_score",
]

SEARCH_ORDER = ("layer", "hidden", "head", "channel", "expert")
"""The kinds a search mixes, in the order a candidate prunes them."""

Allocation = dict[str, Fraction]
"""One share per kind, summing to 1."""

SearchGrid = int | Sequence[Mapping[str, float]]
"""``search_grid=``: the number of parts each share is a multiple of, or explicit allocations."""


def allocations(kinds: Sequence[str], steps: int) -> list[Allocation]:
    """Every allocation over ``kinds`` whose shares are multiples of ``1 / steps`` (each kind
    alone among them), in lexicographic order of the shares.

    Example:
        >>> len(allocations(("layer", "hidden", "channel"), 4))
        15
    """
    found = []
    for cuts in itertools.combinations_with_replacement(range(steps + 1), len(kinds) - 1):
        bounds = (0, *cuts, steps)
        parts = [Fraction(b - a, steps) for a, b in itertools.pairwise(bounds)]
        found.append(dict(zip(kinds, parts, strict=True)))
    return sorted(found, key=lambda allocation: tuple(allocation.values()))


def check_grid(grid: object, kinds: Sequence[str]) -> list[Allocation]:
    """The allocations ``search_grid=`` asks for, each kind alone added where missing.

    Args:
        grid: An int >= 1 (the shares are multiples of its inverse), or a list of mappings from
            each kind to its share (non-negative, summing to 1; a kind left out has 0).
        kinds: The kinds searched.

    Raises:
        TypeError, ValueError: Naming ``search_grid`` and the value at fault.

    Example:
        >>> [dict(a) for a in check_grid([{"layer": 0.5, "channel": 0.5}], ("layer", "channel"))]
        [{'layer': Fraction(1, 2), 'channel': Fraction(1, 2)}, {'layer': Fraction(1, 1), 'channel': Fraction(0, 1)}, {'layer': Fraction(0, 1), 'channel': Fraction(1, 1)}]
    """  # noqa: E501
    if isinstance(grid, bool) or not isinstance(grid, (int, list, tuple)):
        raise TypeError(
            "Expected `search_grid` to be an int >= 1 or a list of allocations (mappings from "
            f"kind to share), but got {grid!r}."
        )
    if isinstance(grid, int):
        if grid < 1:
            raise ValueError(f"Expected `search_grid` to be an int >= 1, but got {grid}.")
        found = allocations(kinds, grid)
    else:
        if not grid:
            raise ValueError("Expected `search_grid` to hold at least one allocation, but got [].")
        found = [check_allocation(entry, kinds) for entry in grid]
    for kind in kinds:
        alone = {other: Fraction(int(other == kind)) for other in kinds}
        if alone not in found:
            found.append(alone)
    return found


def check_allocation(entry: object, kinds: Sequence[str]) -> Allocation:
    """``entry``, a mapping from each kind to its share, as an allocation over ``kinds``.

    Raises:
        TypeError, ValueError: Not a mapping, a kind not among ``kinds``, a share outside
            ``[0, 1]``, shares that do not sum to 1; naming ``search_grid`` and the value.

    Example:
        >>> check_allocation({"layer": 0.25, "channel": 0.75}, ("layer", "hidden", "channel"))
        {'layer': Fraction(1, 4), 'hidden': Fraction(0, 1), 'channel': Fraction(3, 4)}
    """
    if not isinstance(entry, Mapping):
        raise TypeError(
            f"Expected each allocation of `search_grid` to be a mapping from kind to share, "
            f"but got {entry!r}."
        )
    unknown = [kind for kind in entry if kind not in kinds]
    if unknown:
        raise ValueError(
            f"Expected the allocations of `search_grid` to name the searched kinds {tuple(kinds)}, "
            f"but got {unknown[0]!r} in {dict(entry)!r}."
        )
    shares: Allocation = {}
    for kind in kinds:
        value = entry.get(kind, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(
                f"Expected each share of `search_grid` to be a number in [0, 1], but got "
                f"{kind}={value!r} in {dict(entry)!r}."
            )
        shares[kind] = Fraction(value).limit_denominator(10**6)
    if sum(shares.values()) != 1:
        raise ValueError(
            f"Expected the shares of each allocation of `search_grid` to sum to 1, but "
            f"{dict(entry)!r} sums to {float(sum(shares.values()))}."
        )
    return shares


def check_search_score(score: object) -> Literal["loss", "kl"]:
    """``score``, a ``search_score``: ``"loss"`` or ``"kl"``.

    Example:
        >>> check_search_score("mse")
        Traceback (most recent call last):
        ...
        ValueError: Expected `search_score` to be 'loss' or 'kl', but got 'mse'.
    """
    if score == "loss" or score == "kl":
        return score
    raise ValueError(f"Expected `search_score` to be 'loss' or 'kl', but got {score!r}.")


def check_search(
    structure: object,
    budgets: Mapping[str, object],
    grid: object,
    importance: object,
    allocation: object = None,
) -> tuple[tuple[str, ...], list[Allocation]]:
    """The kinds (in :data:`SEARCH_ORDER`) and the allocations of a search, checked: those of
    ``grid`` (``None``: 4), or the one ``allocation`` given in place of a search.

    Raises:
        TypeError, ValueError: A ``structure`` that is not a tuple of at least two distinct
            kinds of :data:`SEARCH_ORDER`; no budget; a bad ``search_grid``; an ``importance``
            that is neither a name nor a mapping from kind to name; both a grid and an
            allocation, or a bad allocation. Each names the option.

    Example:
        >>> kinds, grid = check_search(("channel", "layer"), {"target_params": 0.5}, 4, None)
        >>> kinds, len(grid)
        (('layer', 'channel'), 5)
        >>> check_search(("channel", "layer"), {"target_params": 0.5}, None, None,
        ...              {"layer": 1.0})[1]
        [{'layer': Fraction(1, 1), 'channel': Fraction(0, 1)}]
    """
    if not isinstance(structure, (tuple, list)) or len(structure) < 2:
        raise ValueError(
            "Expected `structure` to be a tuple of at least two kinds with search=True (the "
            f"kinds whose mix is searched), but got {structure!r}."
        )
    unknown = [kind for kind in structure if kind not in SEARCH_ORDER]
    if unknown or len(set(structure)) < len(structure):
        raise ValueError(
            f"Expected `structure` to name distinct kinds among {SEARCH_ORDER} with "
            f"search=True, but got {tuple(structure)!r}."
        )
    if all(value is None for value in budgets.values()):
        raise ValueError(
            "Expected a budget (`target_params`, `target_active_params`, `target_memory` or "
            "`target_latency`) with search=True: the candidates share what it asks to remove, "
            "but got none."
        )
    if not (importance is None or isinstance(importance, (str, Mapping))):
        raise TypeError(
            "Expected `importance` to be a name or a mapping from kind to name with "
            f"search=True, but got {importance!r}."
        )
    kinds = tuple(kind for kind in SEARCH_ORDER if kind in structure)
    if allocation is None:
        return kinds, check_grid(4 if grid is None else grid, kinds)
    if grid is not None:
        raise ValueError(
            "Expected either `search_grid` (a search) or the allocation to prune to (the mix "
            f"given), but got both: search_grid={grid!r}, allocation={allocation!r}."
        )
    return kinds, [check_allocation(allocation, kinds)]
