"""Budgets applied to the units of a pruning step.

:class:`BudgetPlanner` reads a
:class:`~tensorplay.ao.pruning.structured.units.unit_space.StructuredSpace` (its groups, their
pruned units and unit scores), prices each unit in every measure a budget bounds (parameters,
active parameters, bytes: :mod:`~tensorplay.ao.pruning.structured.units.measures`) and prunes,
group by group through the space's own selection, the counts that
:func:`~tensorplay.ao.pruning.structured.units.budget.plan_global_all` or
:func:`~tensorplay.ao.pruning.structured.units.budget.plan_layerwise_all` give: lowest key
first until every budget is met. A unit's key is its standardised score divided by the share
of the budgets' gaps it closes, the largest over the budgets (``price / (total - budget)``);
with one budget that is the score per unit of that budget removed (per parameter for
``target_params``). Floors are those of the
scopes: every group keeps at least one unit (a mixture-of-experts layer its ``top_k``) and
``min_density`` of its units.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # 58 parameters
    >>> pruner = Pruner(model, OneShotSchedule(), structure="channel", target_params=40,
    ...                 example_inputs=torch.randn(2, 4))
    >>> pruner.step()  # a channel is 4 + 1 + 2 = 7 parameters: 3 go, 37 stay
    3
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from tensorplay.ao.pruning.parity.amount import min_kept
from tensorplay.ao.pruning.structured.dependency.unit_groups import expert_width_step
from tensorplay.ao.pruning.structured.units.budget import (
    budget_keys,
    check_reachable,
    plan_global_all,
    plan_layerwise_all,
    unit_params,
)
from tensorplay.ao.pruning.structured.units.measures import Measure
from tensorplay.ao.pruning.structured.units.unit_space import Ranked, StructuredSpace

__all__ = ["BudgetPlanner"]


class BudgetPlanner:
    """Prunes a structured space towards a number of parameters removed.

    Args:
        space: The units (a structure's :meth:`space`, before any budget step).
        shapes: Each parameter's shape by name.
        aliases: Each parameter name to one name of its parameter (tied ones count once).
        min_density: The least fraction of each group kept.
        layerwise: Every group of a kind keeps the same width.
        element_sizes: Bytes per element of each parameter by name: a routed expert's
            channels keep a multiple of 16 bytes of its fused tensors
            (:func:`~tensorplay.ao.pruning.structured.dependency.unit_groups.expert_width_step`,
            what shrinking keeps); none given: any width.
        measures: What each unit is priced in, one column per measure (none given: its
            parameters alone).
        option: The budget the messages name.

    Raises:
        ValueError: A group whose units differ in size, (``layerwise``) groups of one kind
            of different widths or unit sizes, naming them, or routed experts' channels
            without ``layerwise``: the experts of a layer share one width, so the narrower
            ones would keep pruned channels and the shrunk model would miss the budget.
    """

    def __init__(
        self,
        space: StructuredSpace,
        shapes: Mapping[str, torch.Size],
        aliases: Mapping[str, str],
        min_density: float,
        *,
        layerwise: bool,
        element_sizes: Mapping[str, int] | None = None,
        measures: Sequence[Measure] = (),
        option: str = "target_params",
    ) -> None:
        self._ranked = space.ranked
        self.option = option
        steps = [
            math.lcm(
                space.multiple,
                max(
                    expert_width_step(group, element_sizes or {}, shapes) for group in ranked.groups
                )
                if element_sizes is not None
                else 1,
            )
            for ranked in self._ranked
        ]
        experts = [ranked.name for ranked in self._ranked if _budget_kind(ranked) == _EXPERTS]
        if experts and not layerwise:
            raise ValueError(
                f"Expected scope='layerwise' with `{option}` for the channels of routed "
                f"experts ({experts[0]!r}...), but got scope='global': the experts of a layer "
                "share one width, so those that keep fewer channels would keep pruned ones and "
                "the shrunk model would miss the budget."
            )
        self.params = [_ranked_params(ranked, shapes, aliases) for ranked in self._ranked]
        self.costs = [
            tuple(_ranked_cost(ranked, measure) for measure in measures) or (cost,)
            for ranked, cost in zip(self._ranked, self.params, strict=True)
        ]
        self.kinds = [_budget_kind(ranked) for ranked in self._ranked]
        self._steps = dict.fromkeys(self.kinds, 1)
        for kind, step in zip(self.kinds, steps, strict=True):
            self._steps[kind] = max(self._steps[kind], step)
        self.floors = [
            max(1, ranked.min_kept, min_kept(ranked.size, min_density)) for ranked in self._ranked
        ]
        # One group per kind ranks alike in either scope; one whose widths come in steps (the
        # hidden size of fused experts) is planned as layer-wise, the planner that keeps steps.
        stepped = len(set(self.kinds)) == len(self.kinds) and any(
            step > 1 for step in self._steps.values()
        )
        self.layerwise = (layerwise or stepped) and all(
            len(ranked.groups) == 1 for ranked in self._ranked
        )
        if self.layerwise:
            _check_uniform(self._ranked, self.costs, self.kinds, option)

    def removed(self, pruned: Sequence[int]) -> list[int]:
        """What ``pruned`` units per group (``space.pruned()``) free, per measure."""
        return [
            sum(count * cost[column] for count, cost in zip(pruned, self.costs, strict=True))
            for column in range(len(self.costs[0]) if self.costs else 0)
        ]

    def check(
        self,
        budget: int,
        total: int,
        column: int = 0,
        option: str = "target_params",
        scale: int = 1,
        *,
        as_fraction: bool = False,
    ) -> None:
        """Refuse a ``budget`` below the smallest size the floors allow (``total``: the
        model's measure ``column`` now, nothing pruned; ``option``, ``scale``: its budget and
        the factor its counts carry; ``as_fraction``: sizes named as fractions of ``total``).

        Raises:
            ValueError: Naming the smallest reachable size.
        """
        removable = sum(
            (ranked.size - floor) * cost[column]
            for ranked, floor, cost in zip(self._ranked, self.floors, self.costs, strict=True)
        )
        if self.layerwise:
            removable = sum(
                (ranked.size - self._layer_floor(ranked)) * cost[column]
                for ranked, cost in zip(self._ranked, self.costs, strict=True)
            )
        floors = "every group keeps at least one unit and `min_density` of its units"
        check_reachable(budget, total, removable, floors, option, scale, as_fraction=as_fraction)

    def reprice(self, column: int, measure: Measure) -> None:
        """Price every unit in ``measure`` again, in cost ``column`` (a latency table loaded
        in place of the one measured).

        Raises:
            ValueError: Units of a group priced differently, naming it.
        """
        for index, ranked in enumerate(self._ranked):
            cost = list(self.costs[index])
            cost[column] = _ranked_cost(ranked, measure)
            self.costs[index] = tuple(cost)

    def _kind_floor(self, kind: str) -> list[int]:
        return [floor for floor, k in zip(self.floors, self.kinds, strict=True) if k == kind]

    def _layer_floor(self, ranked: Ranked) -> int:
        """The fewest units every group of ``ranked``'s kind keeps with ``scope="layerwise"``
        (a multiple of its step, or its whole width)."""
        kind = _budget_kind(ranked)
        step = self._steps[kind]
        return min(-(-max(self._kind_floor(kind)) // step) * step, ranked.size)

    def prune(self, space: StructuredSpace, needs: Sequence[int], gaps: Sequence[int]) -> int:
        """Prune units of ``space`` until each measure ``b`` has freed ``needs[b]`` more (see
        the module; ``gaps[b]``: what the whole way frees, for the key); the units newly
        pruned."""
        if all(need <= 0 for need in needs):
            return 0
        states = [space.units(index) for index in range(len(self._ranked))]
        kept = [~pruned for pruned, _ in states]
        scores = [score[keep] for (_, score), keep in zip(states, kept, strict=True)]
        widths = [int(keep.sum()) for keep in kept]
        keys = budget_keys(scores, self.kinds, [1] * len(scores))
        if self.layerwise:
            counts = self._layerwise_counts(keys, widths, needs)
        else:
            weights = _weights(self.costs, gaps)
            priced = [key / weight for key, weight in zip(keys, weights, strict=True)]
            limits = [
                max(0, w - f) if weight > 0 else 0
                for w, f, weight in zip(widths, self.floors, weights, strict=True)
            ]
            counts = plan_global_all(priced, self.costs, limits, needs)
        for index, count in enumerate(counts):
            if count > 0:
                space.prune(count, groups=[index])
        return sum(counts)

    def _layerwise_counts(
        self, keys: list[Tensor], widths: list[int], needs: Sequence[int]
    ) -> list[int]:
        kinds = list(dict.fromkeys(self.kinds))
        rows = [[i for i, kind in enumerate(self.kinds) if kind == k] for k in kinds]
        chosen = plan_layerwise_all(
            kinds,
            [widths[row[0]] for row in rows],
            [self.costs[row[0]] for row in rows],
            [max(self.floors[i] for i in row) for row in rows],
            [torch.stack([keys[i] for i in row]) for row in rows],
            needs,
            [self._steps[kind] for kind in kinds],
        )
        return [width - chosen[kind] for width, kind in zip(widths, self.kinds, strict=True)]


_EXPERTS = "expert channel"
"""The kind a budget counts a routed expert's channels as: their width is the experts', apart
from a shared expert's channels (Qwen2-MoE), and their scores are standardised among them."""


def _budget_kind(ranked: Ranked) -> str:
    """``ranked``'s kind, :data:`_EXPERTS` for a routed expert's channels."""
    group = ranked.groups[0]
    return _EXPERTS if any(piece.expert is not None for piece in group.slices) else group.kind


def _ranked_params(
    ranked: Ranked, shapes: Mapping[str, torch.Size], aliases: Mapping[str, str]
) -> int:
    """One unit's parameters in ``ranked``, refusing groups whose units differ in size."""
    sizes = {unit_params(group, shapes, aliases) for group in ranked.groups}
    if len(sizes) != 1:
        raise ValueError(
            f"Expected the units of {ranked.name!r} to hold equal numbers of parameters for "
            f"`target_params`, but got {sorted(sizes)}: a budget prices every unit of a group "
            "alike."
        )
    return sizes.pop()


def _ranked_cost(ranked: Ranked, measure: Measure) -> int:
    """One unit's price in ``measure``, refusing groups whose units differ in it."""
    prices = {measure.price(group) for group in ranked.groups}
    if len(prices) != 1:
        raise ValueError(
            f"Expected the units of {ranked.name!r} to free equal {measure.label} for "
            f"`{measure.option}`, but got {sorted(prices)} (times {measure.scale}): a budget "
            "prices every unit of a group alike."
        )
    return prices.pop()


def _weights(costs: Sequence[Sequence[int]], gaps: Sequence[int]) -> list[float]:
    """Per group, the share of the budgets' gaps one unit closes, the largest over the
    budgets with a gap (with one budget, its cost itself: the same order)."""
    open_ = [b for b, gap in enumerate(gaps) if gap > 0]
    if len(gaps) == 1:
        return [float(cost[0]) for cost in costs]
    return [max((cost[b] / gaps[b] for b in open_), default=0.0) for cost in costs]


def _check_uniform(
    ranked: list[Ranked], costs: list[tuple[int, ...]], kinds: list[str], option: str
) -> None:
    """Refuse, per layer, groups of one kind that differ in width or unit size."""
    first: dict[str, tuple[str, int, tuple[int, ...]]] = {}
    for group, cost, kind in zip(ranked, costs, kinds, strict=True):
        name, size, price = first.setdefault(kind, (group.name, group.size, cost))
        if (size, price) != (group.size, cost):
            raise ValueError(
                f"Expected every {kind} group to have one width and unit size with "
                f"scope='layerwise' and `{option}`, but {group.name!r} has {group.size} "
                f"units of {cost[0]} parameters and {name!r} {size} of {price[0]}: use "
                "scope='global'."
            )
