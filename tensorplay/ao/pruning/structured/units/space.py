"""What a scope ranks: a :class:`UnitSpace`, units in groups, each with a score and a count.

A scope (:mod:`~tensorplay.ao.pruning.pruner.scopes`) decides how many units to prune where; it
never touches a tensor. It asks a unit space for the groups' sizes and pruned counts, and tells it
to prune a count of units over some groups, lowest score first. The space knows what a unit is (a
structure): the element structure (:mod:`~tensorplay.ao.pruning.structured.units.element`) has one
group per target and one unit per weight; a structure of channels, heads or layers would have one
group per coupled set of slices and one score per unit, and the same scopes rank it.

A :class:`RowSpace` also prunes each output row of each group on its own (``scope="row"``);
only a space of single weights has rows.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.masking import masking_mode
    >>> from tensorplay.ao.pruning.parity.methods import L1Unstructured
    >>> from tensorplay.ao.pruning.structured.units.element import ElementSpace
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(4, 2)
    >>> space = ElementSpace([Target(("weight",), ((layer, "weight"),))],
    ...                      masking_mode("inplace"), L1Unstructured, lambda targets: None)
    >>> isinstance(space, RowSpace), space.names, space.numels(), space.pruned()
    (True, ['weight'], [8], [0])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["RowSpace", "UnitSpace"]


@runtime_checkable
class UnitSpace(Protocol):
    """Units in groups, as a scope ranks them.

    Attributes:
        names: One name per group, as messages name it (a target's name).
        collapse_share: The share of a group's units kept at or below which a global step
            warns of layer collapse (:mod:`~tensorplay.ao.pruning.parity.collapse`): 0 where a group
            can be emptied (single weights), 0.1 where one unit always stays (structured units).
        has_floors: Whether some group must keep units (one unit, ``multiple_of`` of them, an
            expert layer's ``top_k``), so that a target can lie beyond reach.
    """

    names: list[str]
    collapse_share: float
    has_floors: bool

    def numels(self) -> list[int]:
        """Per group, its units."""

    def pruned(self) -> list[int]:
        """Per group, its pruned units, as the masks hold them now."""

    def prune(
        self, count: int, groups: Sequence[int] | None = None, caps: Sequence[int] | None = None
    ) -> None:
        """Prune ``count`` more units over ``groups`` (indices; ``None``: all) together, lowest
        score first; with ``caps``, at most ``caps[i]`` more from ``groups[i]``."""

    def check_reach(
        self, count: int, groups: Sequence[int] | None = None, caps: Sequence[int] | None = None
    ) -> None:
        """Raise what :meth:`prune` would refuse for ``count`` units over ``groups`` with none
        of them pruned yet, changing and reading nothing but sizes (how a pruner refuses, when
        it is built, a cumulative target its schedule could never reach)."""


@runtime_checkable
class RowSpace(UnitSpace, Protocol):
    """A unit space whose groups are tensors of single weights, in output rows."""

    def prune_rows(self, target: float, min_density: float) -> None:
        """Prune every output row of every group to ``target`` sparsity on its own, keeping at
        least ``min_density`` of each row."""
