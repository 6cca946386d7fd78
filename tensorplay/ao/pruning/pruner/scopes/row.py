"""``scope="row"``: each output row of each group is its own comparison group.

Every row of ``n`` units holds ``round(target * n)`` pruned units afterwards, within
``min_density`` (:mod:`~tensorplay.ao.pruning.structured.units.row_pruning` has the rule and the
sharded case). Only a space of single weights has rows (a
:class:`~tensorplay.ao.pruning.structured.units.space.RowSpace`), ranked by the streaming keys of
``l1_unstructured`` or ``random_unstructured``.

Example:
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> model = nn.Linear(4, 3)
    >>> Pruner(model, OneShotSchedule(0.5), scope="row").step()
    6
    >>> (model.weight_mask == 0).sum(dim=1).tolist()
    [2, 2, 2]
"""

from __future__ import annotations

from typing import ClassVar

from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.methods import L1Unstructured, RandomUnstructured
from tensorplay.ao.pruning.structured.units.space import RowSpace, UnitSpace

__all__ = ["RowScope"]

# The per-row selection orders units by the keys of method_selection.STREAMING's methods.
_STREAMING = (L1Unstructured.compute_mask, RandomUnstructured.compute_mask)


class RowScope:
    """Every output row on its own, within ``min_density``.

    Args:
        min_density: The least fraction of each row kept.
    """

    name: ClassVar[str] = "row"

    def __init__(self, min_density: float) -> None:
        self.min_density = min_density

    @classmethod
    def check_method(cls, method: type[BasePruningMethod]) -> None:
        """Refuse a method whose keys the per-row selection cannot rank by.

        Raises:
            ValueError: A method other than ``l1_unstructured`` or ``random_unstructured``.
        """
        if method.compute_mask not in _STREAMING:
            raise ValueError(
                "Expected `method` to be 'l1_unstructured' or 'random_unstructured' with "
                f"scope='row', but got {method.__name__}: the per-row selection ranks by their "
                "keys."
            )

    def check_target(self, space: UnitSpace, target: float) -> None:
        """Nothing to refuse: a row keeps what ``min_density`` keeps, whatever the target."""

    def prune_to(self, space: UnitSpace, target: float, step: int) -> int:
        """Prune every row of every group to ``target``."""
        if not isinstance(space, RowSpace):
            raise ValueError(
                f"Expected units of single weights in output rows for scope='row', but got "
                f"{type(space).__name__}, which has none: use scope='global' or 'layerwise'."
            )
        before = sum(space.pruned())
        space.prune_rows(target, self.min_density)
        return sum(space.pruned()) - before
