"""``structure="hidden"``: the residual stream's width (``hidden_size``) as units.

One unit is one channel of the residual stream with every slice that reads or writes it (the
embeddings' columns, the norms' entries, the readers' input columns, the writers' output rows,
the LM head's columns: :mod:`~tensorplay.ao.pruning.structured.dependency.hidden_width`), the
"embedding channel" Minitron prunes. The whole model is one group, so ``scope="global"`` and
``"layerwise"`` agree; ``multiple_of`` makes the kept width a multiple of it (``head_dim`` is
kept: the width is free), at least one channel stays.

**Exact.** While channels are masked, every norm over the stream normalises the kept channels
only (:mod:`~tensorplay.ao.pruning.structured.units.stream_norms`, forward hooks the structure
installs when it is built, through the one owner of model changes; a resumed pruner installs
them again), so the masked model computes what the shrunk one does;
:func:`~tensorplay.ao.pruning.shrink` removes the channels, the hooks, and sets the config's
``hidden_size`` (``n_embd``) and ``head_dim``. A model whose width is not found exactly (Gemma,
BERT, a head or a module no family accounts for) is refused before anything changes, saying
why. A block whose every tensor is masked whole (a layer pruned before) is left out of the
group: its channels are pruned in the blocks that remain, and shrinking removes the block.

**Saving before shrinking.** A model loaded without tensorplay has no hooks: its norms would
normalise over the full width. The permanent forms of a model with hidden channels masked
(:func:`~tensorplay.ao.pruning.permanent_state_dict`,
:func:`~tensorplay.ao.pruning.saving.permanent_saves.save_permanent`) are refused, saying to
``shrink`` first; training checkpoints (with the masks) resume exactly.

**Scores** (``importance=``): ``"magnitude"`` and ``"taylor"`` (the root mean square of the
unit's weight scores: embedding and LM head columns, readers' columns, writers' rows) and
``"activation"`` (the default of :func:`~tensorplay.ao.pruning.prune_one_shot` here; Minitron's:
the mean absolute value of the channel at the output of every
norm over the stream, summed over the norms). ``"wanda"`` and ``"movement"`` are refused, as
are a tuple of kinds with ``"hidden"`` and FSDP2.

**Reconstruction** (``prune_one_shot(..., reconstruct=True)``): the readers of the stream that
are Linear or ``Conv1D`` layers (an untied LM head too) are re-solved over their kept columns
(:mod:`~tensorplay.ao.pruning.structured.reconstruction.consumers`).

Example:
    >>> import torch
    >>> import transformers
    >>> from tensorplay.ao.pruning import Pruner, OneShotSchedule, shrink
    >>> config = transformers.LlamaConfig(
    ...     vocab_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
    ...     num_attention_heads=4, num_key_value_heads=2)
    >>> model = transformers.LlamaForCausalLM(config).eval()
    >>> pruner = Pruner(model, OneShotSchedule(0.25), structure="hidden")
    >>> pruner.step()
    4
    >>> tokens = torch.tensor([[1, 2, 3]])
    >>> masked = model(tokens).logits
    >>> _ = shrink(model)
    >>> model.config.hidden_size, model.config.head_dim
    (12, 4)
    >>> torch.testing.assert_close(model(tokens).logits, masked, atol=1e-5, rtol=1e-5)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from torch import nn

from tensorplay.ao.pruning.parity.aliases import ParameterTable, alias_map
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.selection.sharding import first_sharded
from tensorplay.ao.pruning.structured.dependency.blocks import hf_config_of
from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
from tensorplay.ao.pruning.structured.dependency.hidden_width import HIDDEN, NormKind
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup, expert_width_step
from tensorplay.ao.pruning.structured.units.kept_grid import masked_blocks
from tensorplay.ao.pruning.structured.units.stream_norms import install_stream_norms
from tensorplay.ao.pruning.structured.units.structured import UnitStructure
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["HIDDEN_IMPORTANCES", "HiddenStructure", "hidden_step"]

HIDDEN_IMPORTANCES = ("magnitude", "taylor", "activation")
"""The ``importance=`` values hidden channels are ranked by."""


class HiddenStructure(UnitStructure):
    """``structure="hidden"``: see the module.

    Raises:
        ValueError: A model whose hidden width is not found exactly (naming the family, model
            type or parameter, and why), a selection holding none of its weights, a sharded
            (FSDP2) model; as
            :class:`~tensorplay.ao.pruning.structured.units.structured.UnitStructure`.
    """

    name: ClassVar[str] = HIDDEN
    row_label: ClassVar[str] = "hidden group"
    one_shot_importance: ClassVar[str] = "activation"

    def __init__(
        self,
        model: nn.Module,
        selected: Sequence[Target],
        example_inputs: Any = None,
        multiple_of: int = 1,
    ) -> None:
        self._norms: list[tuple[nn.Module, NormKind]] = []
        self._norm_weights: list[str] = []
        super().__init__(model, selected, example_inputs, multiple_of)
        # The norms' weights are observed too (not scored): importance="activation" reads the
        # norms' outputs, which is where Minitron measures a hidden channel.
        aliases = alias_map(model)
        names = [
            *(name for g in self.groups for name in g.scored_parameters()),
            *self._norm_weights,
        ]
        found: dict[int, Target] = {}
        for name in names:
            tied = aliases[name]
            found.setdefault(id(tied.parameter), Target(tied.names, tied.pairs))
        self.scored = list(found.values())
        step = hidden_step(model, self.groups, ParameterTable(aliases))
        self._multiple = math.lcm(self._multiple, step)
        install_stream_norms(self._norms)

    @classmethod
    def selects_blocks(cls, model: nn.Module) -> bool:
        """True: the one group takes part when the selection holds some of its weights (the
        embedding is not a Linear weight: the default selection holds the rest)."""
        return True

    @classmethod
    def _refuse_shards(cls, model: nn.Module) -> None:
        """Refuse an FSDP2 model before anything is traced or changed.

        Raises:
            ValueError: Naming the first ``DTensor`` parameter.
        """
        name = first_sharded(model)
        if name is not None:
            raise ValueError(
                f"Expected plain tensors with structure='hidden', but {name!r} is a DTensor "
                "(FSDP2): the residual stream's channels are not pruned across shards. Prune "
                "them on one device or under DDP (shrink, then shard)."
            )

    def _selected_groups(
        self, graph: DependencyGraph, model: nn.Module, selected: Sequence[Target]
    ) -> list[UnitGroup]:
        """The model's one hidden group, if the selection holds some of its scored weights."""
        width = graph.hidden()  # refuses a model whose width is not found exactly, saying why
        chosen = {name for target in selected for name in target.names}
        aliases = alias_map(model)
        dropped = masked_blocks(model, aliases)
        group = _without(width.group, dropped)
        held = {alias for name in chosen if name in aliases for alias in aliases[name].names}
        if not held & set(group.scored_parameters()):
            raise ValueError(
                f"Expected the selection to hold some weight of the hidden group "
                f"{group.name!r} for structure='hidden', but it holds none of "
                f"{list(group.scored_parameters())[:3]}...: widen `parameters`, "
                "`include` or `exclude`."
            )
        norms = [norm for norm in width.norms if not _within(norm.name, dropped)]
        self._norms = [(model.get_submodule(norm.name), norm.kind) for norm in norms]
        self._norm_weights = [f"{norm.name}.weight" for norm in norms]
        return [group]

    @classmethod
    def check_options(
        cls, method: type[BasePruningMethod], scope: str, importance: str, multiple_of: int
    ) -> None:
        """As :class:`~tensorplay.ao.pruning.structured.units.structured.UnitStructure`, and an
        importance hidden channels are not ranked by (:data:`HIDDEN_IMPORTANCES`).

        Raises:
            ValueError: Naming the option and the value.
        """
        super().check_options(method, scope, importance, multiple_of)
        if importance not in HIDDEN_IMPORTANCES:
            raise ValueError(
                f"Expected `importance` to be one of {HIDDEN_IMPORTANCES} with "
                f"structure='hidden', but got {importance!r}: a hidden channel spans embeddings "
                "and norms, which its per-input-row scores do not cover."
            )


def _within(name: str, blocks: Sequence[str]) -> bool:
    return any(name.startswith(f"{block}.") for block in blocks)


def _without(group: UnitGroup, blocks: Sequence[str]) -> UnitGroup:
    """``group`` without its slices in ``blocks``."""
    if not blocks:
        return group
    kept = tuple(piece for piece in group.slices if not _within(piece.parameter, blocks))
    return dataclasses.replace(group, slices=kept)


def hidden_step(
    model: nn.Module, groups: Sequence[UnitGroup], table: ParameterTable | None = None
) -> int:
    """The multiple of hidden channels ``groups`` (the model's hidden group) are pruned in:
    transformers' experts kernel needs 16-byte rows, the fused expert tensors' hidden width
    too, and a config states ``hidden_size`` only as a multiple of the query heads where it
    states ``head_dim`` apart (``table``: the model's
    :class:`~tensorplay.ao.pruning.parity.aliases.ParameterTable`, if read already; else its
    parameters are read here).

    Example:
        >>> hidden_step(nn.Linear(2, 2), [])
        1
    """
    table = ParameterTable.of(model) if table is None else table
    step = max(
        (expert_width_step(group, table.element_sizes, table.shapes) for group in groups),
        default=1,
    )
    return math.lcm(step, _heads_step(model))


def _heads_step(model: nn.Module) -> int:
    """The number of query heads where the model's config states ``head_dim`` apart from
    ``hidden_size`` (transformers then requires ``hidden_size`` to be a multiple of the heads,
    and the shrunk width loads with plain ``from_pretrained``); else 1 (GPT-2 derives its head
    width from ``n_embd``: its shrunk width is recorded per layer anyway)."""
    for module in model.modules():
        config = hf_config_of(module)
        if config is None:
            continue
        heads = getattr(config, "num_attention_heads", None)
        width = getattr(config, "hidden_size", None)
        if (
            isinstance(heads, int)
            and isinstance(width, int)
            and isinstance(config.to_dict().get("head_dim"), int)
            and heads > 0
            and width % heads == 0
        ):
            return heads
        return 1
    return 1
