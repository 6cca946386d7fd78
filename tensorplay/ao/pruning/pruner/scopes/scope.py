"""The scope protocol: where a pruning step's units are ranked against each other.

A scope turns the schedule's cumulative target into counts over a
:class:`~tensorplay.ao.pruning.structured.units.space.UnitSpace` and tells the space to prune them;
it owns that decision alone (the pruner asks, never tests the ``scope`` string). Each scope is one
module of this package and one line of :data:`~tensorplay.ao.pruning.pruner.scopes.SCOPES`; the
configuration accepts its name and validates a method against it.

Example:
    >>> from tensorplay.ao.pruning.pruner.scopes import make_scope
    >>> isinstance(make_scope("layerwise", 0.0), PruningScope)
    True
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.structured.units.space import UnitSpace

__all__ = ["PruningScope"]


@runtime_checkable
class PruningScope(Protocol):
    """Where units compete: made with the configuration's ``min_density``.

    Attributes:
        name: The ``scope=`` value that chooses it.
    """

    name: ClassVar[str]

    def __init__(self, min_density: float) -> None:
        """Make the scope.

        Args:
            min_density: The least fraction of each group (or row) kept.
        """

    @classmethod
    def check_method(cls, method: type[BasePruningMethod]) -> None:
        """Refuse, when the configuration is made, a method this scope cannot rank with."""

    def check_target(self, space: UnitSpace, target: float) -> None:
        """Refuse, changing nothing, a ``target`` that :meth:`prune_to` could not reach in
        ``space`` (a pruner asks it for its schedule's final target when it is built).

        Raises:
            ValueError: As :meth:`prune_to` would, for the same target.
        """

    def prune_to(self, space: UnitSpace, target: float, step: int) -> int:
        """Prune ``space`` up to ``target`` sparsity (> 0) at ``step``; the units newly pruned.

        Raises:
            ValueError: A space this scope cannot rank (rows of a space without them).
        """
