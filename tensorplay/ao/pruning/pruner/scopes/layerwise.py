"""``scope="layerwise"``: each group pruned to the target on its own.

Each group of ``n`` units holds ``round(target * n)`` pruned units afterwards (at most what
``min_density`` lets it lose: :func:`~tensorplay.ao.pruning.parity.amount.layerwise_counts`).

Example:
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    >>> pruner = Pruner(model, OneShotSchedule(0.5), scope="layerwise")
    >>> pruner.step(), [row.pruned for row in pruner.report().rows]
    (40, [32, 8])
"""

from __future__ import annotations

from typing import ClassVar

from tensorplay.ao.pruning.parity.amount import caps_under, layerwise_counts
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.structured.units.space import UnitSpace

__all__ = ["LayerwiseScope"]


class LayerwiseScope:
    """Every group on its own, within ``min_density``'s cap.

    Args:
        min_density: The least fraction of each group kept.
    """

    name: ClassVar[str] = "layerwise"

    def __init__(self, min_density: float) -> None:
        self.min_density = min_density

    @classmethod
    def check_method(cls, method: type[BasePruningMethod]) -> None:
        """Any method ranks within a group."""

    def check_target(self, space: UnitSpace, target: float) -> None:
        """Refuse a group's count at ``target`` where the space's floors forbid it."""
        if not space.has_floors:
            return
        numels = space.numels()
        counts, caps = self._counts([0] * len(numels), numels, target)  # the whole way there
        for group, count in enumerate(counts):
            if count > 0:
                space.check_reach(count, groups=[group], caps=[caps[group]])

    def _counts(
        self, pruned: list[int], numels: list[int], target: float
    ) -> tuple[list[int], list[int]]:
        caps = caps_under(self.min_density, pruned, numels)
        return layerwise_counts(target, pruned, numels, caps), caps

    def prune_to(self, space: UnitSpace, target: float, step: int) -> int:
        """Prune each group's own count."""
        pruned, numels = space.pruned(), space.numels()
        counts, caps = self._counts(pruned, numels, target)
        for group, count in enumerate(counts):
            if count > 0:
                space.prune(count, groups=[group], caps=[caps[group]])
        return sum(space.pruned()) - sum(pruned)
