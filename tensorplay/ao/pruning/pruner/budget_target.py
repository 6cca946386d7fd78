"""The pruner's parameter budget: ``target_params=`` resolved once, reached step by step.

:func:`make_budget` is called when the :class:`~tensorplay.ao.pruning.pruner.Pruner` is built:
it resolves the budget against the model's parameters then (tied ones once), prices the
structure's units and refuses a budget the floors cannot reach, before anything changes. The
schedule has no target of its own: its value at a pruning step is the fraction of the way, and
:meth:`BudgetTarget.prune_to` prunes until ``fraction * (total - budget)`` parameters are gone.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
    >>> from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # 58; 7 a channel
    >>> pruner = Pruner(model, LinearSchedule(end_step=2), structure="channel",
    ...                 target_params=30, example_inputs=torch.randn(2, 4))
    >>> [pruner.step(s) for s in (0, 1, 2)]  # 0, then 14 of 28 (2 channels), then 2 more
    [0, 2, 2]
"""

from __future__ import annotations

from torch import nn

from tensorplay.ao.pruning.masking.mode import MaskingMode
from tensorplay.ao.pruning.parity.aliases import alias_map
from tensorplay.ao.pruning.parity.methods import L1Unstructured
from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.structured.dependency.unit_groups import shapes_of
from tensorplay.ao.pruning.structured.units.budget import model_params, resolve_budget
from tensorplay.ao.pruning.structured.units.budget_space import BudgetPlanner
from tensorplay.ao.pruning.structured.units.space import UnitSpace
from tensorplay.ao.pruning.structured.units.structure import PruningStructure
from tensorplay.ao.pruning.structured.units.unit_space import StructuredSpace

__all__ = ["BudgetTarget", "make_budget"]


class BudgetTarget:
    """A budget in parameters and the planner that reaches it.

    Args:
        budget: The parameters the model keeps.
        total: Its parameters when the pruner was built.
        planner: The units, priced.
    """

    def __init__(self, budget: int, total: int, planner: BudgetPlanner) -> None:
        self.budget = budget
        self.total = total
        self._planner = planner

    def prune_to(self, space: UnitSpace, fraction: float) -> int:
        """Prune until ``fraction`` of ``total - budget`` parameters are gone; the units newly
        pruned."""
        space = _structured(space)
        goal = round(min(1.0, fraction) * (self.total - self.budget))
        return self._planner.prune(space, goal - self._planner.removed(space))


def make_budget(
    model: nn.Module, config: PrunerConfig, structure: PruningStructure, mode: MaskingMode
) -> BudgetTarget | None:
    """The budget of ``config.target_params`` (``None`` without it), checked against the
    floors.

    Raises:
        ValueError: A budget below the smallest reachable size (naming it); units a budget
            cannot price
            (:class:`~tensorplay.ao.pruning.structured.units.budget_space.BudgetPlanner`).
    """
    if config.target_params is None:
        return None
    space = _structured(structure.space(mode, L1Unstructured, lambda targets: []))
    total = model_params(model)
    budget = resolve_budget(config.target_params, total)
    aliases = {name: tied.names[0] for name, tied in alias_map(model).items()}
    sizes = {name: tied.parameter.element_size() for name, tied in alias_map(model).items()}
    planner = BudgetPlanner(
        space,
        shapes_of(model),
        aliases,
        config.min_density,
        layerwise=config.scope == "layerwise",
        element_sizes=sizes,
    )
    planner.check(budget, total)
    return BudgetTarget(budget, total, planner)


def _structured(space: UnitSpace) -> StructuredSpace:
    """``space`` as the units of a structure (the configuration refuses the others first)."""
    if not isinstance(space, StructuredSpace):
        raise TypeError(f"Expected structured units with `target_params`, but got {space!r}.")
    return space
