"""``structure="expert"``: the experts of a mixture-of-experts model as units.

An expert is index ``e`` along dim 0 of each fused expert tensor of its layer (``gate_up_proj``,
``down_proj``, their biases) with row ``e`` of the router's weight (and its bias entries), as
:mod:`~tensorplay.ao.pruning.structured.dependency.families.moe` finds them; a shared expert is
never one. Each MoE layer is one group: ``scope="layerwise"`` prunes the same count from every layer
(the shrunk model then loads with plain ``from_pretrained``; the default of
:func:`~tensorplay.ao.pruning.pruner.one_shot.prune_one_shot` here), ``scope="global"`` ranks all
experts together (per-layer counts, :func:`~tensorplay.ao.pruning.load_shrunk`). Every layer keeps
at least its ``top_k`` experts: a target that would take more is refused before anything changes.

A masked expert is never routed to: the structure hooks each router it masks
(:mod:`~tensorplay.ao.pruning.structured.units.routing`), so the masked model computes what the
shrunk one computes, in either masking mode, in training and in cached generation.

**Which layers take part.** The experts' tensors are not Linear weights, so the default
selection holds none of them: an MoE layer takes part when the selection holds some tensor of its
residual block (by default its attention's Linear weights), so ``exclude``, ``include`` and
``parameters`` choose layers by their names (and the default selection gives no
``SelectionWarning`` for the experts it leaves out).

**Scores** (``importance=``): ``"magnitude"`` (the root mean square of the expert's weights, the
default of :class:`~tensorplay.ao.pruning.pruner.Pruner`), ``"taylor"``, and the observed
``"reap"`` and ``"frequency"`` (:mod:`~tensorplay.ao.pruning.importance.expert_routing`;
``"reap"`` is the default of :func:`~tensorplay.ao.pruning.pruner.one_shot.prune_one_shot` here).

Example:
    >>> import torch
    >>> import transformers
    >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> config = transformers.MixtralConfig(
    ...     vocab_size=16, hidden_size=16, intermediate_size=8, num_hidden_layers=2,
    ...     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
    ...     num_experts_per_tok=2)
    >>> model = transformers.MixtralForCausalLM(config).eval()
    >>> pruner = Pruner(model, OneShotSchedule(0.5), structure="expert", scope="layerwise")
    >>> pruner.step(), [row.pruned for row in pruner.report().rows]
    (4, [2, 2])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from torch import nn

from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.methods import L1Unstructured, RandomUnstructured
from tensorplay.ao.pruning.selection.sharding import first_sharded
from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup
from tensorplay.ao.pruning.structured.units.routing import install_routing
from tensorplay.ao.pruning.structured.units.structured import UnitStructure
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["EXPERT_IMPORTANCES", "ExpertStructure"]

EXPERT_IMPORTANCES = ("magnitude", "taylor", "reap", "frequency")
"""The ``importance=`` values experts are ranked by."""


class ExpertStructure(UnitStructure):
    """``structure="expert"``: see the module.

    Raises:
        ValueError: A model without experts (naming its family), a selection that holds no
            tensor of any MoE layer's block; as
            :class:`~tensorplay.ao.pruning.structured.units.structured.UnitStructure`.
    """

    name: ClassVar[str] = "expert"
    row_label: ClassVar[str] = "expert group"
    one_shot_scope: ClassVar[str] = "layerwise"
    one_shot_importance: ClassVar[str] = "reap"

    @classmethod
    def selects_blocks(cls, model: nn.Module) -> bool:
        """True: the selection chooses MoE layers by their blocks' tensors (no selection
        warning)."""
        return True

    def __init__(
        self,
        model: nn.Module,
        selected: Sequence[Target],
        example_inputs: Any = None,
        multiple_of: int = 1,
    ) -> None:
        self._routers: list[tuple[nn.Module, int, bool]] = []
        super().__init__(model, selected, example_inputs, multiple_of)
        for router, top_k, normalise in self._routers:
            install_routing(router, top_k=top_k, normalise=normalise)

    @classmethod
    def _refuse_shards(cls, model: nn.Module) -> None:
        """Refuse an FSDP2 model before the graph traces it or anything changes.

        Raises:
            ValueError: Naming the first ``DTensor`` parameter.
        """
        name = first_sharded(model)
        if name is not None:
            raise ValueError(
                f"Expected plain tensors with structure='expert', but {name!r} is a DTensor "
                "(FSDP2): experts are not pruned across shards. Prune experts on one device "
                "or under DDP (shrink, then shard), or use structure='channel', 'head' or "
                "'layer' with masking='inplace'."
            )

    def _selected_groups(
        self, graph: DependencyGraph, model: nn.Module, selected: Sequence[Target]
    ) -> list[UnitGroup]:
        """The MoE layers whose residual block holds a selected tensor (see the module)."""
        groups = graph.groups(self.name)  # refuses a model without experts, saying why
        found = graph.blocks
        assert found is not None  # only a family has experts
        chosen = {name for target in selected for name in target.names}
        taken: list[UnitGroup] = []
        for name, block in zip(found.block_names(), found.blocks, strict=True):
            units = found.family.units(name, block)
            if units.expert is None or units.routing is None or units.expert not in groups:
                continue
            if any(name_of.startswith(f"{name}.") for name_of in chosen):
                taken.append(units.expert)
                routing = units.routing
                self._routers.append(
                    (model.get_submodule(routing.router), routing.top_k, routing.normalise)
                )
        if not taken:
            raise ValueError(
                f"Expected the selection to hold some tensor of a mixture-of-experts layer of "
                f"{type(model).__name__} for structure='expert', but it holds none of "
                f"{groups[0].name!r} and the others: widen `parameters`, `include` or `exclude`."
            )
        return taken

    @classmethod
    def check_options(
        cls, method: type[BasePruningMethod], scope: str, importance: str, multiple_of: int
    ) -> None:
        """Refuse a method other than ``l1_unstructured`` or ``random_unstructured``, a scope
        other than ``"global"`` or ``"layerwise"``, and an importance experts are not ranked
        by (:data:`EXPERT_IMPORTANCES`).

        Raises:
            ValueError: Naming the option and the value.
        """
        if method.compute_mask not in (
            L1Unstructured.compute_mask,
            RandomUnstructured.compute_mask,
        ):
            raise ValueError(
                f"Expected `method` to be 'l1_unstructured' or 'random_unstructured' with "
                f"structure='expert', but got {method.__name__}: experts are ranked by one "
                "score each."
            )
        if scope not in ("global", "layerwise"):
            raise ValueError(
                f"Expected `scope` to be 'global' or 'layerwise' with structure='expert', but "
                f"got {scope!r}: experts have no rows."
            )
        if importance not in EXPERT_IMPORTANCES:
            raise ValueError(
                f"Expected `importance` to be one of {EXPERT_IMPORTANCES} with "
                f"structure='expert', but got {importance!r}."
            )
