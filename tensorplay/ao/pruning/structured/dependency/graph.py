"""The dependency graph: the one object that says what else changes if a unit goes.

:class:`DependencyGraph` is built once from a model and answers, per kind of unit, which slices
of which tensors one unit spans
(:class:`~tensorplay.ao.pruning.structured.dependency.unit_groups.UnitGroup`). Masking, scoring,
counting and shrinking all ask it, so coupling (a fused ``c_attn``, grouped query attention, the
gate and up projections of one FFN neuron) is decided in one place.

How the model is read:

* a **Hugging Face model** of a known family (Llama, Mistral, Qwen2, Qwen3; Gemma 2 and 3;
  Phi-3; OLMo 2; GPT-NeoX; GPT-2; BERT, RoBERTa; ViT, DeiT; the mixtures of experts Qwen2-MoE,
  Qwen3-MoE, Mixtral, OLMoE:
  :data:`~tensorplay.ao.pruning.structured.dependency.families.FAMILIES`) is recognised by the names
  and types of its blocks' submodules, without importing ``transformers``, wherever it sits (the
  model itself, or inside a wrapper such as a ``LightningModule`` holding it as ``model``: names are
  then the wrapper's);
* a Hugging Face model of **another family** has no units: asking for a kind says so, naming its
  block class and the submodules no family knows (with ``example_inputs`` its channels are
  traced, where its forward traces);
* any **other model** is traced when its channels are first asked
  (:mod:`~tensorplay.ao.pruning.structured.dependency.tracing`, torch.fx; ``example_inputs`` give
  the shapes), which finds channels only: a Linear's or Conv's output channels with their BatchNorm
  entries and consumers' input columns, channels joined by a residual addition as one unit.

What each kind is on a Hugging Face family:

* ``"channel"``: an FFN intermediate neuron (the rows of the input projections with their bias
  entries, the column of the output projection);
* ``"head"``: an attention head (the q/k/v rows with their bias entries, the output projection's
  columns); under grouped-query attention a key/value head with the query heads that read it;
  refused where a norm spans all heads (OLMo 2's ``q_norm``);
* ``"expert"``: one expert of a mixture-of-experts layer: its index along dim 0 of the fused
  expert tensors and its row of the router
  (:mod:`~tensorplay.ao.pruning.structured.dependency.families.moe`; a shared expert is never one);
* ``"layer"``: a whole residual block, only where a block whose parameters are zero is the
  identity (Llama-style, Gemma 2 and 3, Phi-3, OLMo 2, GPT-NeoX, GPT-2, ViT: each sublayer's
  output is zero, normalised or not); BERT and RoBERTa normalise after the residual addition.
  :meth:`DependencyGraph.groups` gives one
  :class:`~tensorplay.ao.pruning.structured.dependency.unit_groups.UnitGroup` of one unit per layer
  (what its slices are); the pruner ranks them together, so the graph's summary, the pruner's report
  and the shrink report all speak of one **layer group**, named after the blocks' container
  (``'model.layers'``), whose units are the layers.

The residual-stream width (embeddings, norms, output biases) and the model's outputs (the LM
head, a classifier) are never in a group.

Example:
    >>> import transformers
    >>> config = transformers.LlamaConfig(
    ...     vocab_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
    ...     num_attention_heads=4, num_key_value_heads=2)
    >>> graph = DependencyGraph(transformers.LlamaForCausalLM(config))
    >>> graph.counts()
    {'channel': 48, 'head': 4, 'layer': 2}
    >>> heads = graph.groups("head")[0]
    >>> heads.name, heads.size, heads.scored_parameters()
    ('model.layers.0.self_attn', 2, ('model.layers.0.self_attn.q_proj.weight',
     'model.layers.0.self_attn.k_proj.weight', 'model.layers.0.self_attn.v_proj.weight',
     'model.layers.0.self_attn.o_proj.weight'))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from torch import Tensor, nn

from tensorplay.ao.pruning.parity.aliases import ParameterTable, TiedParameter
from tensorplay.ao.pruning.structured.dependency.blocks import (
    FoundBlocks,
    find_blocks,
    looks_like_hf,
    unknown_family,
)
from tensorplay.ao.pruning.structured.dependency.families import UnanalysableError
from tensorplay.ao.pruning.structured.dependency.families.family import (
    is_conv1d,
    is_linear,
    join,
    read_tensor_names,
)
from tensorplay.ao.pruning.structured.dependency.hidden_width import (
    HIDDEN,
    HiddenWidth,
    hidden_width_of,
)
from tensorplay.ao.pruning.structured.dependency.tracing import ChannelTrace, trace_channels
from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup, check_groups

__all__ = ["KINDS", "DependencyGraph", "Kind", "read_graph"]

Kind = Literal["channel", "head", "layer", "expert"]
KINDS: tuple[Kind, ...] = get_args(Kind)


class DependencyGraph:
    """The structured units of a model, found once: see the module docstring.

    Args:
        model: A Hugging Face model of a known family, a module holding one, or a plain
            PyTorch model.
        example_inputs: Inputs of the model's forward (a tensor or a tuple of positional
            inputs) for tracing a plain model; not used for a known family.

    Raises:
        UnanalysableError: (a ``ValueError``) The model cannot be analysed, naming the
            submodule or parameter at fault: two models in one wrapper, a block holding a
            parameter its family does not know. (A Hugging Face model of no known family, and a
            forward that cannot be traced, are refused when a kind is asked:
            :meth:`groups`.)

    Example:
        >>> import transformers
        >>> config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=16,
        ...                                   bos_token_id=0, eos_token_id=0)
        >>> print(DependencyGraph(transformers.GPT2LMHeadModel(config)))
        DependencyGraph of GPT2LMHeadModel: gpt2 family (GPT-2), 2 blocks in 'transformer.h'
          channel: 2 groups, 128 units
          head: 2 groups, 4 units
          layer: 1 group ('transformer.h'), 2 units

        A plain model is traced:

        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> graph = DependencyGraph(model, example_inputs=torch.randn(2, 4))
        >>> print(graph)
        DependencyGraph of Sequential: traced with torch.fx
          channel: 1 group, 8 units
        >>> graph.groups("channel")[0].parameters()
        ('0.weight', '0.bias', '2.weight')
    """

    def __init__(
        self, model: nn.Module, example_inputs: Tensor | tuple[Any, ...] | None = None
    ) -> None:
        self._read(model, example_inputs, ParameterTable.of(model), fresh=False)

    def _read(
        self,
        model: nn.Module,
        example_inputs: Tensor | tuple[Any, ...] | None,
        table: ParameterTable,
        *,
        fresh: bool,
    ) -> None:
        """Find the units of ``model`` from its parameters read into ``table``; a plain model's
        channels are traced with ``table`` too where it stays ``fresh`` until they are asked
        (the caller changes nothing in between), else with the parameters read then."""
        self._model_name = type(model).__name__
        self.blocks: FoundBlocks | None = find_blocks(model)
        """The Hugging Face blocks found (``None`` for a traced model)."""
        self._refused: dict[str, str] = {}
        self._unknown: str | None = None
        self._groups: dict[str, list[UnitGroup]] = {}
        self._trace: tuple[nn.Module, Tensor | tuple[Any, ...] | None] | None = None
        self._table = table if fresh else None
        self._traced: ChannelTrace | None = None
        self._hidden: HiddenWidth | str = _hidden_or_why(self.blocks, table, self._model_name)
        if self.blocks is not None:
            self._groups = self._family_groups(self.blocks, table.aliases)
            check_groups([g for groups in self._groups.values() for g in groups], table.shapes)
            return
        unknown = unknown_family(model) if looks_like_hf(model) else None
        self._unknown = unknown
        if unknown is None or example_inputs is not None:
            self._trace = (model, example_inputs)  # traced when its channels are first asked
        for kind in KINDS:
            if unknown is not None and (kind != "channel" or example_inputs is None):
                self._refused[kind] = unknown
            elif kind != "channel":
                self._refused[kind] = (
                    f"{self._model_name} is not a Hugging Face model of a known family, and "
                    "tracing finds channels only"
                )

    @property
    def family(self) -> str:
        """The family's name (``"llama"``, ``"gpt2"``, ``"bert"``, ``"vit"``), or ``"traced"``."""
        return "traced" if self.blocks is None else self.blocks.family.name

    @property
    def kinds(self) -> tuple[Kind, ...]:
        """The kinds this model has groups of, in :data:`KINDS` order."""
        return tuple(kind for kind in KINDS if kind not in self._refused)

    def groups(self, kind: str | tuple[str, ...]) -> list[UnitGroup]:
        """The groups of ``kind`` (``"channel"``, ``"head"``, ``"layer"`` or ``"expert"``), in
        model order; of a tuple of kinds, those of each kind in turn.

        Raises:
            ValueError: An unknown kind, or one this model cannot have (heads or layers of a
                traced model, layers of a post-norm family, heads under a norm over all heads,
                any kind of a Hugging Face model of no known family), naming the structure
                asked and why.
            UnanalysableError: The channels of a plain model whose forward cannot be traced.
        """
        if isinstance(kind, tuple):
            return [group for each in kind for group in self.groups(each)]
        if kind == HIDDEN:
            return [self.hidden().group]
        why = self.refusal(kind)
        if why is not None:
            others = " or ".join(repr(k) for k in self.kinds)
            if self._unknown is not None or not others:  # tracing a HF model rarely works
                hint = "prune single weights (structure='element'), which needs no analysis"
            else:
                hint = f"try {others}"
            raise ValueError(
                f"Expected a model with {kind} units for structure={kind!r}, but {why}: {hint}."
            )
        if kind not in self._groups:  # a plain model's channels: traced the first time
            self._groups[kind] = self._channel_trace().groups
        return list(self._groups[kind])

    @property
    def unprunable(self) -> dict[str, str]:
        """For a traced model, each module whose output channels (some or all) no group holds,
        with the first reason found
        (:func:`~tensorplay.ao.pruning.structured.dependency.tracing.trace_channels`; the model is
        traced if it was not yet); empty for a known family."""
        return {} if self._trace is None else dict(self._channel_trace().unprunable)

    def _channel_trace(self) -> ChannelTrace:
        if self._traced is None:
            assert self._trace is not None  # channels are refused where there is none
            model, example_inputs = self._trace
            table = ParameterTable.of(model) if self._table is None else self._table
            self._traced = _traced_channels(model, example_inputs, table)
            check_groups(self._traced.groups, table.shapes)
        return self._traced

    def refusal(self, kind: str) -> str | None:
        """Why this model has no units of ``kind`` (naming the module, class or config key in
        the way), or ``None`` where it has them.

        Raises:
            ValueError: An unknown kind.

        Example:
            >>> import transformers
            >>> config = transformers.BertConfig(vocab_size=16, hidden_size=16,
            ...     num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
            >>> graph = DependencyGraph(transformers.BertModel(config))
            >>> graph.refusal("head") is None, graph.refusal("layer")[:48]
            (True, "the blocks of BertModel ('encoder.layer.0', ...)")
        """
        if isinstance(kind, tuple):
            return [group for each in kind for group in self.groups(each)]
        if kind == HIDDEN:
            return self._hidden if isinstance(self._hidden, str) else None
        if kind not in KINDS:
            raise ValueError(f"Expected `kind` to be one of {KINDS}, but got {kind!r}.")
        return self._refused.get(kind)

    def hidden(self) -> HiddenWidth:
        """The residual stream's channels as one group, with the norms over the stream
        (:mod:`~tensorplay.ao.pruning.structured.dependency.hidden_width`). Not among
        :attr:`kinds`: the whole model's width is asked for by name (``structure="hidden"``).

        Raises:
            ValueError: A model whose hidden width is not found exactly, saying why.

        Example:
            >>> import transformers
            >>> config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=16,
            ...                                   bos_token_id=0, eos_token_id=0)
            >>> graph = DependencyGraph(transformers.GPT2LMHeadModel(config))
            >>> graph.hidden().group.size, graph.refusal("hidden") is None
            (16, True)
        """
        if isinstance(self._hidden, str):
            raise ValueError(
                f"Expected a model with hidden units for structure='hidden', but {self._hidden}."
            )
        return self._hidden

    def counts(self) -> dict[str, int]:
        """The number of units of each kind this model has (see the class example)."""
        return {kind: sum(group.size for group in self.groups(kind)) for kind in self.kinds}

    def __str__(self) -> str:
        if self.blocks is None:
            where = "no known family" if self._unknown is not None else "traced with torch.fx"
        else:
            family = self.blocks.family
            where = (
                f"{family.name} family ({family.models}), {len(self.blocks.blocks)} blocks in "
                f"{self.blocks.name!r}"
            )
        lines = [f"DependencyGraph of {self._model_name}: {where}"]
        for kind in KINDS:
            if kind not in self._refused:
                lines.append(f"  {kind}: {self._summary(kind)}")
            elif kind == "expert" and self.family != "moe":
                continue  # a dense model has no experts to explain
            elif self.blocks is not None or self._unknown is not None:
                lines.append(f"  {kind}: none ({self._refused[kind]})")
        return "\n".join(lines)

    def _summary(self, kind: str) -> str:
        """``"3 groups, 144 units"``; layers: ``"1 group ('model.layers'), 3 units"``."""
        groups = self.groups(kind)
        units = sum(group.size for group in groups)
        if kind == "layer" and self.blocks is not None:
            return f"1 group ({self.blocks.name!r}), {units} units"
        return f"{len(groups)} group{'s' if len(groups) != 1 else ''}, {units} units"

    def __repr__(self) -> str:
        counts = ", ".join(f"{kind}={count}" for kind, count in self.counts().items())
        return f"DependencyGraph({self._model_name}, family={self.family!r}, {counts})"

    def _family_groups(
        self, found: FoundBlocks, aliases: Mapping[str, TiedParameter]
    ) -> dict[str, list[UnitGroup]]:
        groups: dict[str, list[UnitGroup]] = {kind: [] for kind in KINDS}
        refusals: dict[str, tuple[str, str]] = {}
        held = {id(tied.parameter): tied for tied in aliases.values()}
        for name, block in zip(found.block_names(), found.blocks, strict=True):
            units = found.family.units(name, block)
            tensors = read_tensor_names(name, block, held)
            _check_known(name, tensors, units.groups(), units.shared, found)
            for group in units.groups():
                groups[group.kind].append(group)
            if units.head_refusal is not None:
                refusals.setdefault("head", (name, units.head_refusal))
            scored = _layer_scored(name, block, aliases) or {
                tensor for group in units.groups() for tensor in group.scored_parameters()
            }
            slices = tuple(Slice(tensor, None, scored=tensor in scored) for tensor in tensors)
            groups["layer"].append(UnitGroup(name, "layer", 1, slices))
            refusal = found.family.layer_refusal(block)
            if refusal is not None:
                refusals.setdefault("layer", (name, refusal))
        for kind, (name, why) in refusals.items():
            self._refused[kind] = (
                f"the {'heads' if kind == 'head' else 'blocks'} of {self._model_name} "
                f"({name!r}, ...) cannot be removed {'exactly' if kind == 'head' else 'whole'}: "
                f"{why}"
            )
            del groups[kind]
        for kind in ("channel", "head", "expert"):
            if kind in groups and not groups[kind]:
                self._refused[kind] = (
                    f"the {found.family.name} blocks of {self._model_name} have none"
                )
                del groups[kind]
        return groups


def read_graph(
    model: nn.Module, example_inputs: Tensor | tuple[Any, ...] | None, table: ParameterTable
) -> DependencyGraph:
    """The :class:`DependencyGraph` of ``model`` whose parameters were just read into
    ``table``, for a caller that reads the model once and changes nothing before it has asked
    the graph for its groups.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> graph = read_graph(model, None, ParameterTable.of(model))
        >>> graph.groups("channel")[0].parameters()
        ('0.weight', '0.bias', '2.weight')
    """
    graph = DependencyGraph.__new__(DependencyGraph)
    graph._read(model, example_inputs, table, fresh=True)
    return graph


def _hidden_or_why(
    found: FoundBlocks | None, table: ParameterTable, model_name: str
) -> HiddenWidth | str:
    try:
        return hidden_width_of(found, table, model_name)
    except ValueError as error:
        return str(error)


def _layer_scored(name: str, block: nn.Module, aliases: Mapping[str, TiedParameter]) -> set[str]:
    """The weights of the block's Linear and ``Conv1D`` layers: what a layer unit is scored by,
    so that the default selection (those weights) holds every layer, a mixture-of-experts one
    (whose fused expert tensors it does not select) too."""
    return {
        weight
        for module_name, module in block.named_modules()
        if (is_linear(module) or is_conv1d(module))
        and (weight := join(name, module_name, "weight")) in aliases
    }


def _check_known(
    name: str,
    tensors: list[str],
    groups: tuple[UnitGroup, ...],
    shared: tuple[str, ...],
    found: FoundBlocks,
) -> None:
    """Refuse a block holding a parameter its family does not place in a unit or the
    residual stream: a part the family does not know could depend on the units."""
    known = {*(t for group in groups for t in group.parameters()), *(join(name, k) for k in shared)}
    unknown = [tensor for tensor in tensors if tensor not in known]
    if unknown:
        raise UnanalysableError(
            f"Expected every parameter of {name!r} to be one the {found.family.name} family "
            f"({found.family.models}) knows, but {unknown[0]!r} is not: its channels and heads "
            "cannot be removed safely."
        )


def _traced_channels(
    model: nn.Module, example_inputs: Tensor | tuple[Any, ...] | None, table: ParameterTable
) -> ChannelTrace:
    if not looks_like_hf(model):
        return trace_channels(model, example_inputs, table=table)
    try:
        return trace_channels(model, example_inputs, table=table)
    except (UnanalysableError, ValueError, TypeError) as error:
        raise UnanalysableError(
            f"Expected the channels of {type(model).__name__} to be found by tracing it with "
            f"example_inputs, but {unknown_family(model)}, and tracing failed: {error}"
        ) from error
