"""``scope="global"``: every unit of every group ranked together (the default).

The count is the schedule's exact cumulative one, ``round(target * total) - already_pruned``
(:func:`~tensorplay.ao.pruning.parity.amount.global_count`); with ``min_density`` each group may
lose at most what keeps that fraction of it (the units a capped group cannot give are taken from the
others, still lowest score first). A step that empties a whole group (structured units: leaves it
10% of its units or fewer) warns once, naming it (:mod:`~tensorplay.ao.pruning.parity.collapse`).

Example:
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    >>> pruner = Pruner(model, OneShotSchedule(0.5), scope="global")
    >>> pruner.step(), pruner.pruned_count()
    (40, 40)
"""

from __future__ import annotations

from typing import ClassVar

from tensorplay.ao.pruning.parity.amount import caps_under, global_count
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.collapse import CollapseWatch
from tensorplay.ao.pruning.structured.units.space import UnitSpace

__all__ = ["GlobalScope"]


class GlobalScope:
    """All groups ranked together, within ``min_density``'s caps.

    Args:
        min_density: The least fraction of each group kept.
    """

    name: ClassVar[str] = "global"

    def __init__(self, min_density: float) -> None:
        self.min_density = min_density
        self._collapse = CollapseWatch()

    @classmethod
    def check_method(cls, method: type[BasePruningMethod]) -> None:
        """Any method ranks globally."""

    def check_target(self, space: UnitSpace, target: float) -> None:
        """Refuse the global count at ``target`` where the space's floors forbid it."""
        if not space.has_floors:
            return
        numels = space.numels()
        count, caps = self._count([0] * len(numels), numels, target)  # the whole way there
        if count > 0:
            space.check_reach(count, caps=caps)

    def _count(
        self, pruned: list[int], numels: list[int], target: float
    ) -> tuple[int, list[int] | None]:
        caps = caps_under(self.min_density, pruned, numels) if self.min_density > 0 else None
        return global_count(target, pruned, numels, caps), caps

    def prune_to(self, space: UnitSpace, target: float, step: int) -> int:
        """Prune the global count over all groups; warn for a group left empty."""
        pruned, numels = space.pruned(), space.numels()
        count, caps = self._count(pruned, numels, target)
        if count <= 0:
            return 0
        space.prune(count, caps=caps)
        after = space.pruned()
        self._collapse.check(space.names, numels, pruned, after, step, space.collapse_share)
        return sum(after) - sum(pruned)
