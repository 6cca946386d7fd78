"""What a search of the mix of kinds asks of the dense model, read once.

A search (:mod:`~tensorplay.ao.pruning.pruner.search`) plans every candidate against the model
as it is before any candidate: its parameters, each budget resolved against its measures, its
routed experts, its latency table (with ``target_latency``) and its dependency graph.
:func:`read_search` reads them in one pass, into a frozen :class:`SearchReading`, so the search
asks the model once and then plans from the reading; what the masks of a candidate keep is read
as the candidate goes (:mod:`~tensorplay.ao.pruning.structured.units.kept_grid`).

Example:
    >>> import sys; sys.path.insert(0, "tests")
    >>> from hf_models import tiny_llama
    >>> model = tiny_llama()
    >>> reading = read_search(model, {"target_params": 0.8})
    >>> reading.limits["params"] == reading.planned == int(0.8 * reading.total)
    True
    >>> reading.remove == reading.total - reading.planned, reading.experts, reading.active
    (True, (), False)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import nn

from tensorplay.ao.pruning.parity.aliases import ParameterTable
from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
from tensorplay.ao.pruning.structured.units.budget import model_params, resolve_budget
from tensorplay.ao.pruning.structured.units.hidden import hidden_step
from tensorplay.ao.pruning.structured.units.latency import LatencyTable, latency_table
from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
from tensorplay.ao.pruning.structured.units.measures import Measure, measures_of, routed_experts
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget

__all__ = ["SearchReading", "read_search"]

_BOUNDS = {"target_params": "params", "target_active_params": "active_params",
           "target_memory": "memory"}  # fmt: skip
"""The measure each budget option bounds, as a search's report names it."""


@dataclass(frozen=True)
class SearchReading:
    """The dense model as a search plans with it (:func:`read_search`).

    Args:
        total: Every parameter of the model, tied ones once.
        limits: Each budget given, resolved against the dense model, by the measure it bounds
            (``params``, ``active_params``, ``memory`` in bytes, ``latency`` in seconds).
        planned: The parameters the candidates plan to keep: the parameter budget, or else the
            fraction of the parameters that the first other budget keeps of its measure.
        experts: The model's routed expert tensors (canonical names).
        active: Whether a candidate's active parameters are measured (routed experts, or
            ``target_active_params``).
        memory: The setting of ``target_memory``, if given.
        latency: The latency table measured on the dense model, with ``target_latency``.
        graph: The model's dependency graph: the groups each kind prunes.
        hidden_step: The multiple hidden channels are pruned in
            (:func:`~tensorplay.ao.pruning.structured.units.hidden.hidden_step`; 1 when the
            hidden width is not searched).

    Example:
        >>> reading = read_search(nn.Linear(4, 4), {"target_params": 12})
        >>> reading.total, reading.limits, reading.planned, reading.remove
        (20, {'params': 12}, 12, 8)
    """

    total: int
    limits: Mapping[str, int | float]
    planned: int
    experts: tuple[str, ...]
    active: bool
    memory: MemoryBudget | None
    latency: LatencyTable | None
    graph: DependencyGraph
    hidden_step: int = 1

    @property
    def remove(self) -> int:
        """The parameters the candidates share among their kinds to remove."""
        return self.total - min(self.planned, self.total)


def read_search(
    model: nn.Module, budgets: Mapping[str, object], kinds: Sequence[str] = ()
) -> SearchReading:
    """Read what a search of ``kinds`` plans with from the dense ``model``, under ``budgets``
    (by option: ``target_params``, ``target_active_params``, ``target_memory``,
    ``target_latency``; at least one given).

    Raises:
        ValueError: A budget out of range (naming it); a model whose latency cannot be measured
            (:func:`~tensorplay.ao.pruning.structured.units.latency.latency_table`) or whose
            measures or routed experts cannot be read
            (:mod:`~tensorplay.ao.pruning.structured.units.measures`).
    """
    memory = budgets.get("target_memory")
    setting = memory if isinstance(memory, MemoryBudget) else None
    total = model_params(model)
    latency = budgets.get("target_latency")
    table = latency_table(model, latency) if isinstance(latency, LatencyBudget) else None
    params = ParameterTable.of(model)
    active = budgets.get("target_active_params") is not None
    measures = measures_of(model, setting, active=active, table=params)
    limits, planned = _limits(measures, budgets, table)
    experts = tuple(routed_experts(model, params))
    graph = DependencyGraph(model)
    step = 1
    if "hidden" in kinds:  # the parameters read above, not read again
        step = hidden_step(model, [graph.hidden().group], params)
    return SearchReading(
        total, limits, planned, experts, "active_params" in limits or bool(experts), setting,
        table, graph, step,
    )  # fmt: skip


def _limits(
    measures: Mapping[str, Measure], budgets: Mapping[str, object], table: LatencyTable | None
) -> tuple[dict[str, int | float], int]:
    """Each budget given, resolved against the dense model's ``measures`` (the latency in
    seconds, estimated from ``table``), by the measure it bounds; and the parameters the
    candidates plan to keep (:attr:`SearchReading.planned`)."""
    found: dict[str, int | float] = {}
    planned: int | None = None
    for option, measure in measures.items():
        value = budgets.get(option)
        if value is None:
            continue
        if isinstance(value, MemoryBudget):
            value = value.bytes
        real = measure.total // measure.scale
        found[_BOUNDS[option]] = resolve_budget(value, real, option, measure.unit)  # type: ignore[arg-type]
        if planned is None:
            planned = measures["target_params"].total * int(found[_BOUNDS[option]]) // real
    latency = budgets.get("target_latency")
    if table is not None and isinstance(latency, LatencyBudget):
        found["latency"] = latency.fraction * table.dense
        if planned is None:
            planned = math.floor(measures["target_params"].total * latency.fraction)
    assert planned is not None  # a search is refused without a budget before it reads the model
    return found, planned
