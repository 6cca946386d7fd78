"""Which unit groups :func:`~tensorplay.ao.pruning.shrink` removes units from, by default.

The groups a structured pruner masked are recorded on the model
(:mod:`~tensorplay.ao.pruning.structured.dependency.recorded`) and come first: they are exactly what
was masked, found with the inputs the pruner was given. The model's dependency graph adds the groups
it finds now (units zeroed by hand, or by a pruner built before the record existed), except those
that overlap a recorded group (the same indices of the same tensor in another layout): the record
decides, and shrinking refuses where a masked unit of a group set aside would stay. Where the graph
cannot be built without ``example_inputs`` (a Hugging Face model of no known family, a wrapper with
no forward of its own, a forward torch.fx cannot trace) the record alone is used; with nothing
recorded, or with ``example_inputs`` given, the graph's error is raised.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.structured.dependency.recorded import record_groups
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
    >>> model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3),
    ...                       nn.ReLU(), nn.Linear(3, 1))
    >>> [g.name for g in default_groups(model, None).groups]  # flattening needs the shapes
    ['3']
    >>> record_groups(model, [UnitGroup("0", "channel", 2, (
    ...     Slice("0.weight", 0), Slice("0.bias", 0, scored=False), Slice("3.weight", 1, width=4),
    ... ))])  # what a Pruner given example_inputs of shape (N, 1, 2, 2) records
    >>> [g.name for g in default_groups(model, None).groups]
    ['0', '3']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.parity.aliases import ParameterTable, TiedParameter
from tensorplay.ao.pruning.structured.dependency.blocks import FoundBlocks, find_blocks
from tensorplay.ao.pruning.structured.dependency.graph import KINDS, read_graph
from tensorplay.ao.pruning.structured.dependency.recorded import recorded_groups
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup, check_groups

__all__ = ["DefaultGroups", "default_groups"]


@dataclass(frozen=True)
class DefaultGroups:
    """The groups to shrink and what the analysis said about the model.

    Args:
        groups: The recorded groups and the graph's that do not overlap them, in model order.
        recorded: The groups recorded on the model (and its submodules).
        blocks: The Hugging Face blocks found (``None``: none).
        unprunable: Tracing's reasons per module whose channels it left out (a plain model;
            empty when the graph was not built or is a family's).
        set_aside: The graph's groups left out because they overlap a recorded one.
    """

    groups: list[UnitGroup]
    recorded: tuple[UnitGroup, ...]
    blocks: FoundBlocks | None
    unprunable: dict[str, str] = field(default_factory=dict)
    set_aside: list[UnitGroup] = field(default_factory=list)


def default_groups(
    model: nn.Module,
    example_inputs: Tensor | tuple[Any, ...] | None,
    *,
    table: ParameterTable | None = None,
) -> DefaultGroups:
    """The groups :func:`~tensorplay.ao.pruning.shrink` removes units from when it is given
    none (see the module docstring); ``table``: ``model``'s parameters, where they were read
    already (and nothing changed since).

    Raises:
        ValueError: A recorded group that no longer fits the model (naming it), or what
            :class:`~tensorplay.ao.pruning.DependencyGraph` raises where nothing is recorded.
    """
    table = ParameterTable.of(model) if table is None else table
    recorded = recorded_groups(model)
    _check_recorded(model, recorded, table.shapes)
    try:
        graph = read_graph(model, example_inputs, table)
        found = [group for kind in graph.kinds for group in graph.groups(kind)]
    except ValueError:  # an UnanalysableError, or a forward torch.fx cannot trace
        if not recorded or example_inputs is not None:
            raise
        return DefaultGroups(list(recorded), recorded, find_blocks(model))
    if not graph.kinds and not recorded:
        raise ValueError(
            f"Expected a model whose units shrink can find, but {graph.refusal('channel')}: pass "
            "`groups=`, or shrink after a structured Pruner (which records the groups it masks)."
        )
    taken = _indices(table.aliases, recorded)
    extra = [group for group in recorded if group not in found]
    groups: list[UnitGroup] = []
    set_aside: list[UnitGroup] = []
    for group in found:
        fits = group in recorded or not _overlaps(table.aliases, group, taken)
        (groups if fits else set_aside).append(group)
    if extra:
        groups = _in_model_order(model, groups + extra)
    return DefaultGroups(groups, recorded, graph.blocks, dict(graph.unprunable), set_aside)


def _check_recorded(
    model: nn.Module, recorded: Sequence[UnitGroup], shapes: Mapping[str, torch.Size]
) -> None:
    try:
        check_groups(recorded, shapes)
    except ValueError as error:
        raise ValueError(
            f"Expected the unit groups a pruner recorded on {type(model).__name__} to fit it, "
            f"but they do not ({error}): the model changed after the pruner was built. Pass "
            "`groups=` (those of a DependencyGraph of the model as it is now)."
        ) from error


_Index = tuple[str, int | None, int | None]


def _indices(
    aliases: Mapping[str, TiedParameter], groups: Sequence[UnitGroup]
) -> dict[_Index, set[int]]:
    """Per (canonical tensor, dimension, expert), the indices the groups' units span (a
    whole-tensor slice: the dimension ``None``, index 0; the expert ``None`` but in one
    expert's part of a fused expert tensor)."""
    taken: dict[_Index, set[int]] = {}
    for group in groups:
        for piece in group.slices:
            key = (aliases[piece.parameter].name, piece.dim, piece.expert)
            end = piece.offset + group.size * piece.width
            taken.setdefault(key, set()).update(
                range(piece.offset, end) if piece.dim is not None else (0,)
            )
    return taken


def _overlaps(
    aliases: Mapping[str, TiedParameter], group: UnitGroup, taken: dict[_Index, set[int]]
) -> bool:
    mine = _indices(aliases, [group])
    return any(taken[key] & indices for key, indices in mine.items() if key in taken)


def _in_model_order(model: nn.Module, groups: list[UnitGroup]) -> list[UnitGroup]:
    """By kind (channels, heads, layers), then by the position of the module a group is named
    after (a traced group's ``[start:end]`` suffix aside); stable otherwise."""
    modules = {name: index for index, (name, _) in enumerate(model.named_modules())}

    def key(group: UnitGroup) -> tuple[int, int]:
        kind = KINDS.index(group.kind) if group.kind in KINDS else len(KINDS)  # type: ignore[arg-type]
        return kind, modules.get(group.name.partition("[")[0], len(modules))

    return sorted(groups, key=key)
