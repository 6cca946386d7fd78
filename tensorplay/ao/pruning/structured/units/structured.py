"""The structures of channels, heads and layers: units found by the dependency graph.

One implementation for the three kinds, which differ only in the kind they ask
:class:`~tensorplay.ao.pruning.structured.dependency.graph.DependencyGraph` for and in how the
scopes see
them: :class:`ChannelStructure` (``structure="channel"``: an FFN neuron, a conv filter, with
every slice that depends on it) and :class:`HeadStructure` (``"head"``: an attention head; under
grouped-query attention a key/value head with its query heads) rank each module's units as one
group; :class:`LayerStructure` (``"layer"``: a residual block) ranks all of a model's blocks as
one group, so ``scope="global"`` and ``"layerwise"`` agree and at least one block stays.

The pruner masks every tensor a unit spans (weights, biases, norm entries, the consumers' input
columns), so :func:`~tensorplay.ao.pruning.structured.shrinking.shrink.shrink` removes exactly the
pruned units afterwards. The selection (``parameters``, ``module_types``, ``include``, ``exclude``,
``keep_dense``) chooses the groups: a group takes part when the tensors its units are scored by (the
weights of its Linear, Conv and ``Conv1D`` layers) are all selected; a routed expert's channels
(a mixture-of-experts layer's fused expert tensors, which hold no Linear weights) take part when
the selection holds some tensor of their layer outside the shared expert (by default its
attention's weights), as experts do. The importance observes and
scores those tensors only (:mod:`~tensorplay.ao.pruning.structured.units.unit_space` turns their
element scores into one per unit). A selected tensor that no group taking part spans stays dense,
and is named when the structure is built, in a warning and under the report's table
(:mod:`~tensorplay.ao.pruning.structured.units.coverage`).

Under FSDP2 (``fully_shard``, ``masking="inplace"``) the units are the same: each rank sums per
unit what it holds of the slices and one ``all_reduce`` per pruning step gives every rank every
unit's score (:mod:`~tensorplay.ao.pruning.structured.units.sharded_units`); each rank writes the
rows it holds of every mask. Experts and their channels are refused there (prune them on one
device or under DDP).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> pruner = Pruner(model, OneShotSchedule(0.5), structure="channel",
    ...                 example_inputs=torch.randn(2, 4))
    >>> pruner.step(), pruner.targets
    (4, ['0.weight', '0.bias', '2.weight'])
    >>> (model[2].weight_mask.sum(dim=0) > 0).sum().item()
    4
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from torch import nn

from tensorplay.ao.pruning.masking.mode import MaskingMode
from tensorplay.ao.pruning.masking.stats import TensorSparsity
from tensorplay.ao.pruning.parity.aliases import alias_map
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.methods import L1Unstructured, RandomUnstructured
from tensorplay.ao.pruning.selection.sharding import first_sharded
from tensorplay.ao.pruning.structured.dependency.blocks import find_blocks
from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
from tensorplay.ao.pruning.structured.dependency.recorded import record_groups
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup, shapes_of
from tensorplay.ao.pruning.structured.units.coverage import uncovered
from tensorplay.ao.pruning.structured.units.sharded_units import ShardedUnits, mesh_of
from tensorplay.ao.pruning.structured.units.structure import Scores, UnitScores
from tensorplay.ao.pruning.structured.units.unit_space import (
    Ranked,
    StructuredSpace,
    held_masks,
    pruned_of,
)
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["ChannelStructure", "HeadStructure", "LayerStructure", "UnitStructure"]

_RANKING = (L1Unstructured.compute_mask, RandomUnstructured.compute_mask)
_SCOPES = ("global", "layerwise")


class UnitStructure:
    """Structured units of one kind (:attr:`name`), found from the model.

    Args:
        model: A Hugging Face model of a known family (or a module holding one), or a plain
            PyTorch model, traced with ``example_inputs``.
        selected: The tensors the pruner's selection chose: the groups whose scored tensors
            are all among them take part.
        example_inputs: Inputs of a plain model's forward (a tensor or a tuple), for tracing.
        multiple_of: Kept widths per group are multiples of it.

    Attributes:
        uncovered: The selected tensors no group taking part spans, and why
            (:func:`~tensorplay.ao.pruning.structured.units.coverage.uncovered`); a
            :class:`UserWarning` names them when the structure is built.
        notes: The report's line about them (none when every selected tensor is spanned).

    Raises:
        ValueError: The model cannot be analysed (naming the submodule), has no units of this
            kind (a plain model's heads or layers, a post-norm model's layers, a model whose
            only layer is its output), or the selection leaves none; a ``multiple_of`` wider
            than some group (naming it and its width); under FSDP2, as
            :meth:`_refuse_shards` of the kind.
        TypeError: ``example_inputs`` neither a tensor nor a tuple.
    """

    name: ClassVar[str]
    one_shot_scope: ClassVar[str] = "global"
    ranks_together: ClassVar[bool] = False

    def __init__(
        self,
        model: nn.Module,
        selected: Sequence[Target],
        example_inputs: Any = None,
        multiple_of: int = 1,
    ) -> None:
        self._refuse_shards(model)
        graph = DependencyGraph(model, example_inputs)
        groups = self._selected_groups(graph, model, selected)
        _check_multiple(self.name, groups, multiple_of)
        self.uncovered = uncovered(self.name, graph, groups, selected, model)
        self.notes = self.uncovered.notes()
        self.groups = tuple(groups)
        if self.ranks_together:
            container = graph.blocks.name if graph.blocks is not None else self.name
            self._ranked = [Ranked(container, tuple(groups))]
        else:
            self._ranked = [Ranked(group.name, (group,)) for group in groups]
        aliases = alias_map(model)
        names = [name for ranked in self._ranked for name in ranked.parameters()]
        scored = [name for group in groups for name in group.scored_parameters()]
        self._by_name: dict[str, Target] = {}
        self.targets = _targets(names, aliases, self._by_name)
        self.scored = _targets(scored, aliases, {})
        self._shapes = shapes_of(model)
        self._multiple = multiple_of
        self.uncovered.warn()  # once built: a refusal above comes first
        record_groups(model, groups)  # what shrink() removes, never re-derived

    @classmethod
    def selects_blocks(cls, model: nn.Module) -> bool:
        """Whether the selection chooses some of ``model``'s units by their blocks' tensors,
        not their own (no selection warning then for the tensors it leaves out): not here."""
        return False

    def _selected_groups(
        self, graph: DependencyGraph, model: nn.Module, selected: Sequence[Target]
    ) -> list[UnitGroup]:
        """The groups of this kind whose scored tensors the selection holds."""
        return _selected_groups(self.name, graph, model, selected)

    @classmethod
    def check_options(
        cls, method: type[BasePruningMethod], scope: str, importance: str, multiple_of: int
    ) -> None:
        """Refuse what units cannot be pruned with: a method other than ``l1_unstructured``
        or ``random_unstructured``, ``scope="row"``, ``importance="movement"`` (its scores
        are signed, a unit's root mean square would rank by their size) and ``multiple_of``
        with layers.

        Raises:
            ValueError: Naming the option and the value.
        """
        if method.compute_mask not in _RANKING:
            raise ValueError(
                f"Expected `method` to be 'l1_unstructured' or 'random_unstructured' with "
                f"structure={cls.name!r}, but got {method.__name__}: units are ranked by one "
                "score each."
            )
        if scope not in _SCOPES:
            raise ValueError(
                f"Expected `scope` to be 'global' or 'layerwise' with structure={cls.name!r}, "
                f"but got {scope!r}: units have no rows."
            )
        if importance == "movement":
            raise ValueError(
                f"Expected `importance` to be 'magnitude', 'taylor', 'wanda' or 'activation' with "
                f"structure={cls.name!r}, but got 'movement': its scores are signed, and a "
                "unit's score is the root mean square of its weights' scores."
            )
        if multiple_of != 1 and cls.ranks_together:
            raise ValueError(
                f"Expected `multiple_of` to be 1 with structure={cls.name!r}, but got "
                f"{multiple_of}: blocks have no width."
            )

    def space(
        self,
        mode: MaskingMode,
        method: type[BasePruningMethod],
        scores: Scores,
        units: UnitScores | None = None,
    ) -> StructuredSpace:
        """The units of a pruning step
        (:class:`~tensorplay.ao.pruning.structured.units.unit_space.StructuredSpace`)."""
        return StructuredSpace(
            self._ranked,
            self._by_name,
            self._shapes,
            mode,
            method,
            scores,
            self.scored,
            self._multiple,
            units,
        )

    def prune_own_count(
        self, mode: MaskingMode, method: type[BasePruningMethod], scores: Scores
    ) -> int:
        """Refused: units are counted by the schedule (:meth:`check_options` refuses such a
        method first).

        Raises:
            ValueError: Always.
        """
        raise ValueError(
            f"Expected a method that takes an `amount` with structure={self.name!r}, but got "
            f"{method.__name__}, which decides its own count."
        )

    def rows(self, mode: MaskingMode, *, permanent: bool) -> list[TensorSparsity]:
        """Per group, its units and those pruned (masked in every slice; once permanent, zero
        in every slice). Under FSDP2 a collective (one ``all_reduce``): call it on every rank."""
        held = None if permanent else mode
        partial: Literal["refuse", "keep"] = "keep" if permanent else "refuse"
        group = mesh_of(self.targets)
        if group is not None:
            groups = [ranked.groups for ranked in self._ranked]
            shapes = self._shapes
            units = ShardedUnits(groups, self._by_name, shapes, held, None, [], group, partial)
            found = [units.pruned(index) for index in range(len(self._ranked))]
        else:
            found = []
            for ranked in self._ranked:
                masks = held_masks(ranked.parameters(), self._by_name, self._shapes, held)
                found.append(pruned_of(ranked, masks, partial))
        return [
            TensorSparsity(ranked.name, (ranked.size,), ranked.size, int(pruned.sum()))
            for ranked, pruned in zip(self._ranked, found, strict=True)
        ]

    @classmethod
    def _refuse_shards(cls, model: nn.Module) -> None:
        """Nothing to refuse: channels, heads and layers are pruned across FSDP2 shards
        (:mod:`~tensorplay.ao.pruning.structured.units.sharded_units`)."""


class ChannelStructure(UnitStructure):
    """``structure="channel"``: see the module."""

    name: ClassVar[str] = "channel"
    row_label: ClassVar[str] = "channel group"

    @classmethod
    def selects_blocks(cls, model: nn.Module) -> bool:
        """Whether ``model`` has routed experts, whose channels its layers choose."""
        try:
            found = find_blocks(model)
        except ValueError:  # no analysable model: the structure says why when it is built
            return False
        if found is None:
            return False
        first = found.family.units(found.block_names()[0], found.blocks[0])
        return bool(first.expert_channels)

    def _selected_groups(
        self, graph: DependencyGraph, model: nn.Module, selected: Sequence[Target]
    ) -> list[UnitGroup]:
        """The channel groups the selection holds (see the module); a routed expert's, only
        on whole tensors.

        Raises:
            ValueError: A routed expert's channels in an FSDP2 model, naming the tensor.
        """
        groups = _selected_groups(self.name, graph, model, selected)
        name = first_sharded(model)
        expert = next((g for g in groups if any(p.expert is not None for p in g.slices)), None)
        if name is not None and expert is not None:
            raise ValueError(
                f"Expected plain tensors for the channels of the routed experts "
                f"({expert.name!r}), but {name!r} is a DTensor (FSDP2): a fused expert tensor's "
                "channels are not pruned across shards. Prune them on one device or under DDP "
                "(shrink, then shard), or leave the mixture-of-experts layers out (`exclude`)."
            )
        return groups


class HeadStructure(UnitStructure):
    """``structure="head"``: see the module."""

    name: ClassVar[str] = "head"
    row_label: ClassVar[str] = "head group"


class LayerStructure(UnitStructure):
    """``structure="layer"``: see the module."""

    name: ClassVar[str] = "layer"
    row_label: ClassVar[str] = "layer group"
    ranks_together: ClassVar[bool] = True


def _selected_groups(
    kind: str, graph: DependencyGraph, model: nn.Module, selected: Sequence[Target]
) -> list[UnitGroup]:
    """The groups of ``kind`` whose scored tensors the selection holds, or why there are none."""
    groups = graph.groups(kind)
    if not groups:
        raise ValueError(
            f"Expected a model with {kind} units for structure={kind!r}, but "
            f"{type(model).__name__} has none ({graph!r}): the model's outputs and the widths "
            "joined to its inputs are never pruned."
        )
    chosen = {name for target in selected for name in target.names}
    by_layer = _expert_layers(graph, chosen)
    found = [
        group
        for group in groups
        if set(group.scored_parameters()) <= chosen or group.name.partition("[")[0] in by_layer
    ]
    if not found:
        first = groups[0]
        missing = [name for name in first.scored_parameters() if name not in chosen]
        raise ValueError(
            f"Expected the selection to hold the weights of some {kind} group of "
            f"{type(model).__name__}, but it holds none whole: e.g. {first.name!r} needs "
            f"{missing}; widen `parameters`, `include` or `exclude`."
        )
    return found


def _expert_layers(graph: DependencyGraph, chosen: set[str]) -> set[str]:
    """The fused experts modules (``"model.layers.0.mlp.experts"``) whose channels take part
    by their layer: those of a layer the selection holds a tensor of, outside the shared
    expert (the fused tensors are no Linear weights, so the default selection holds none)."""
    found = graph.blocks
    if found is None:
        return set()
    taken: set[str] = set()
    for name, block in zip(found.block_names(), found.blocks, strict=True):
        channels = found.family.units(name, block).expert_channels
        inside = [
            tensor
            for tensor in chosen
            if tensor.startswith(f"{name}.") and ".shared_expert" not in tensor
        ]
        if channels and inside:
            taken.update(group.name.partition("[")[0] for group in channels)
    return taken


def _check_multiple(kind: str, groups: Sequence[UnitGroup], multiple_of: int) -> None:
    """Refuse a ``multiple_of`` wider than some group: it could keep no multiple of it."""
    for group in groups:
        if multiple_of > group.size:
            raise ValueError(
                f"Expected `multiple_of` to be at most the width of every {kind} group, but got "
                f"{multiple_of}: group {group.name!r} has {group.size} units."
            )


def _targets(names: Sequence[str], aliases: Any, by_name: dict[str, Target]) -> list[Target]:
    """Each parameter of ``names`` once, as a target with all its names (``by_name`` gets
    every name of each)."""
    found: dict[int, Target] = {}
    for name in names:
        tied = aliases[name]
        target = found.get(id(tied.parameter))
        if target is None:
            target = found[id(tied.parameter)] = Target(tied.names, tied.pairs)
        for alias in target.names:
            by_name[alias] = target
    return list(found.values())
