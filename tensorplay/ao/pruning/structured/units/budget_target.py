"""A pruner's budgets: ``target_params=``, ``target_active_params=``, ``target_memory=`` and
``target_latency=``, resolved once, reached step by step.

:func:`make_budget` is called when the :class:`~tensorplay.ao.pruning.pruner.Pruner` is built:
it measures the model then (parameters, tied ones once; active parameters; bytes of weights and
key/value cache: :mod:`~tensorplay.ao.pruning.structured.units.measures`; the latency table,
timed then: :mod:`~tensorplay.ao.pruning.structured.units.latency`), resolves each budget
given against its measure, prices the structure's units in every measure and refuses a budget the
floors cannot reach, before anything changes. The schedule has no target of its own: its value
at a pruning step is the fraction of the way, and :meth:`BudgetTarget.prune_to` prunes until
every budget ``b`` has freed ``fraction * (total_b - budget_b)``. :meth:`BudgetTarget.report`
says where the model stands against each (:class:`BudgetReport`).

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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from torch import nn

from tensorplay.ao.pruning.masking.mode import MaskingMode
from tensorplay.ao.pruning.parity.aliases import ParameterTable
from tensorplay.ao.pruning.parity.methods import L1Unstructured
from tensorplay.ao.pruning.structured.units.budget import resolve_budget
from tensorplay.ao.pruning.structured.units.budget_space import BudgetPlanner
from tensorplay.ao.pruning.structured.units.latency import (
    LatencyMeasure,
    LatencyTable,
    latency_table,
)
from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
from tensorplay.ao.pruning.structured.units.measures import Measure, measures_of
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget
from tensorplay.ao.pruning.structured.units.space import UnitSpace
from tensorplay.ao.pruning.structured.units.structure import PruningStructure
from tensorplay.ao.pruning.structured.units.unit_space import StructuredSpace

__all__ = ["BudgetLine", "BudgetOptions", "BudgetReport", "BudgetTarget", "make_budget"]


@dataclass(frozen=True)
class BudgetLine:
    """One measure of a model against its budget.

    Args:
        option: The budget's argument (``"target_active_params"``).
        label: What the measure is (``"active parameters"``).
        before: The model's measure when the pruner was built.
        budget: The budget resolved (``None``: not a budget of this pruner, shown for
            reference).
        after: The measure of the model :func:`~tensorplay.ao.pruning.shrink` leaves from the
            units pruned now (an int where exact, as it is for every fused expert layer; the
            latency in seconds, estimated).

    Example:
        >>> BudgetLine("target_params", "parameters", 100, 80, 79).met
        True
    """

    option: str
    label: str
    before: int | float
    budget: int | float | None
    after: int | float

    @property
    def fraction(self) -> float:
        """``after`` as a fraction of ``before``.

        Example:
            >>> BudgetLine("target_params", "parameters", 100, 80, 79).fraction
            0.79
        """
        return float(Fraction(self.after) / Fraction(self.before)) if self.before else 1.0

    @property
    def met(self) -> bool:
        """Whether ``after`` is within the budget (true without one)."""
        return self.budget is None or self.after <= self.budget


@dataclass(frozen=True)
class BudgetReport:
    """Parameters, active parameters and memory of the shrunk model against the budgets
    (:meth:`~tensorplay.ao.pruning.pruner.Pruner.budget_report`); ``str()`` is a table.

    Args:
        lines: One per measure: parameters always, active parameters and memory where
            budgeted.

    Example:
        >>> report = BudgetReport((BudgetLine("target_params", "parameters", 100, 80, 79),))
        >>> print(report)
        measure     before  budget  after
        parameters     100      80     79
        >>> report["target_params"].after, report.met
        (79, True)
    """

    lines: tuple[BudgetLine, ...]

    def __getitem__(self, option: str) -> BudgetLine:
        """The line of the budget ``option`` (``"target_params"``...)."""
        for line in self.lines:
            if line.option == option:
                return line
        raise KeyError(option)

    @property
    def met(self) -> bool:
        """Whether every budget is met."""
        return all(line.met for line in self.lines)

    def __str__(self) -> str:
        rows = [("measure", "before", "budget", "after")] + [
            (line.label, f"{line.before}", "-" if line.budget is None else f"{line.budget}",
             f"{line.after}")
            for line in self.lines
        ]  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        return "\n".join(
            "  ".join([row[0].ljust(widths[0])] + [row[i].rjust(widths[i]) for i in range(1, 4)])
            for row in rows
        )


class BudgetTarget:
    """Budgets in one or more measures and the planner that reaches them all.

    Args:
        measures: Every measure reported, parameters first (each with its ``total``).
        budgets: Per measure, its budget times its scale (``None``: not a budget).
        planner: The units, priced in every measure.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> pruner = Pruner(mlp, OneShotSchedule(), structure="channel", target_params=0.5,
        ...                 example_inputs=torch.randn(2, 4))
        >>> line = pruner.budget_report()["target_params"]  # the pruner's BudgetTarget reports
        >>> line.before, line.budget  # 58 parameters, half kept
        (58, 29)
    """

    def __init__(
        self,
        measures: Sequence[Measure],
        budgets: Sequence[int | None],
        planner: BudgetPlanner,
        latency_fraction: float | None = None,
    ) -> None:
        self.measures = tuple(measures)
        self.budgets = tuple(budgets)
        self._planner = planner
        self._latency_fraction = latency_fraction

    @property
    def latency_table(self) -> LatencyTable | None:
        """The latency table ``target_latency`` is estimated from (``None`` without it)."""
        found = self._latency()
        return None if found is None else found[1].latency

    def _latency(self) -> tuple[int, LatencyMeasure] | None:
        for column, measure in enumerate(self.measures):
            if isinstance(measure, LatencyMeasure):
                return column, measure
        return None

    def use_latency_table(self, model: nn.Module, table: LatencyTable) -> None:
        """Estimate from ``table`` (a saved one: a resumed run prices units as the first did)
        in place of the one measured, the budget resolved against it again.

        Raises:
            ValueError: A pruner without ``target_latency``, or a table of other modules or
                shapes than ``model``'s.
        """
        found = self._latency()
        if found is None or self._latency_fraction is None:
            raise ValueError(
                "Expected a pruner with `target_latency` to load a latency table, but it has none."
            )
        column, old = found
        table.check_model(model)
        if {leaf.module for leaf in table.leaves} != {leaf.module for leaf in old.latency.leaves}:
            raise ValueError(
                "Expected a latency table of the modules measured on this model, but the saved "
                "one times other modules."
            )
        measure = LatencyMeasure(model, table, ParameterTable.of(model))
        self._planner.reprice(column, measure)
        measures, budgets = list(self.measures), list(self.budgets)
        measures[column] = measure
        budgets[column] = math.floor(self._latency_fraction * measure.total)
        self.measures, self.budgets = tuple(measures), tuple(budgets)

    @property
    def budget(self) -> int:
        """The parameter budget (the model's parameters where none is given)."""
        return self.budgets[0] if self.budgets[0] is not None else self.measures[0].total

    @property
    def total(self) -> int:
        """The model's parameters when the pruner was built."""
        return self.measures[0].total

    def _gaps(self) -> list[int]:
        return [
            0 if budget is None else measure.total - budget
            for measure, budget in zip(self.measures, self.budgets, strict=True)
        ]

    def prune_to(self, space: UnitSpace, fraction: float) -> int:
        """Prune until every budget has freed ``fraction`` of its way; the units newly
        pruned."""
        space = _structured(space)
        gaps = self._gaps()
        removed = self._planner.removed(space.pruned())
        needs = [
            round(min(1.0, fraction) * gap) - done for gap, done in zip(gaps, removed, strict=True)
        ]
        needs = [need if gap > 0 else 0 for need, gap in zip(needs, gaps, strict=True)]
        return self._planner.prune(space, needs, gaps)

    def report(self, pruned: Sequence[int]) -> BudgetReport:
        """Each measure before, its budget and after shrinking ``pruned`` units per group."""
        removed = self._planner.removed(pruned)
        lines = []
        for measure, budget, freed in zip(self.measures, self.budgets, removed, strict=True):
            lines.append(
                BudgetLine(
                    measure.option,
                    measure.label,
                    _unscaled(measure.total, measure.scale),
                    None if budget is None else _unscaled(budget, measure.scale),
                    _unscaled(measure.total - freed, measure.scale),
                )
            )
        return BudgetReport(tuple(lines))


class BudgetOptions(Protocol):
    """What :func:`make_budget` reads of a pruner's options: the budgets and the floors.

    A :class:`~tensorplay.ao.pruning.pruner.config.PrunerConfig` is one; the budgets are
    resolved without the pruner they serve.

    Example:
        >>> from tensorplay.ao.pruning.pruner.config import PrunerConfig
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> options: BudgetOptions = PrunerConfig(OneShotSchedule(), structure="channel",
        ...                                       target_params=0.5)
        >>> options.target_params, options.min_density, options.scope
        (0.5, 0.0, 'global')
    """

    @property
    def target_params(self) -> int | float | None: ...
    @property
    def target_active_params(self) -> int | float | None: ...
    @property
    def target_memory(self) -> MemoryBudget | None: ...
    @property
    def target_latency(self) -> LatencyBudget | None: ...
    @property
    def min_density(self) -> float: ...
    @property
    def scope(self) -> str: ...


def make_budget(
    model: nn.Module, config: BudgetOptions, structure: PruningStructure, mode: MaskingMode
) -> BudgetTarget | None:
    """The budgets of ``config`` (``None`` without any), checked against the floors.

    Raises:
        ValueError: A budget below the smallest reachable size (naming it and the budget); a
            model whose active parameters or key/value cache cannot be read, or whose forward
            fails on the latency budget's inputs; units a budget cannot price
            (:class:`~tensorplay.ao.pruning.structured.units.budget_space.BudgetPlanner`).
    """
    latency = config.target_latency
    given = {
        "target_params": config.target_params,
        "target_active_params": config.target_active_params,
        "target_memory": None if config.target_memory is None else config.target_memory.bytes,
        "target_latency": None if latency is None else latency.fraction,
    }
    if all(value is None for value in given.values()):
        return None
    space = _structured(structure.space(mode, L1Unstructured, lambda targets: []))
    table = ParameterTable.of(model)
    measures = measures_of(
        model, config.target_memory, active=config.target_active_params is not None, table=table
    )
    if latency is not None:
        measures["target_latency"] = LatencyMeasure(model, latency_table(model, latency), table)
    budgets: list[int | None] = []
    for option, measure in measures.items():
        value = given[option]
        if option == "target_latency" and value is not None:  # a fraction of the estimate
            budgets.append(math.floor(value * measure.total))
            continue
        real = measure.total // measure.scale
        resolved = None if value is None else resolve_budget(value, real, option, measure.unit)
        budgets.append(None if resolved is None else resolved * measure.scale)
    first = next(option for option, value in given.items() if value is not None)
    planner = BudgetPlanner(
        space,
        table.shapes,
        table.canonical,
        config.min_density,
        layerwise=config.scope == "layerwise",
        element_sizes=table.element_sizes,
        measures=list(measures.values()),
        option=first,
    )
    for column, (measure, budget) in enumerate(zip(measures.values(), budgets, strict=True)):
        if budget is not None:
            planner.check(
                budget, measure.total, column, measure.option, measure.scale,
                as_fraction=isinstance(measure, LatencyMeasure),
            )  # fmt: skip
    fraction = None if latency is None else latency.fraction
    return BudgetTarget(list(measures.values()), budgets, planner, fraction)


def _unscaled(count: int, scale: int) -> int | float:
    """``count / scale``: an int where it divides, else a float."""
    value = Fraction(count, scale)
    return int(value) if value.denominator == 1 else float(value)


def _structured(space: UnitSpace) -> StructuredSpace:
    """``space`` as the units of a structure (the configuration refuses the others first)."""
    if not isinstance(space, StructuredSpace):
        raise TypeError(f"Expected structured units with a budget, but got {space!r}.")
    return space
