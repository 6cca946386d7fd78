"""The residual-stream width as units: one channel of ``hidden_size`` with every slice on it.

A **hidden unit** (Minitron's "embedding channel") is channel ``c`` of the residual stream:
column ``c`` of the token embedding (and of GPT-2's position embedding ``wpe``), entry ``c`` of
every norm over the stream (weight and bias), column ``c`` of every projection that reads the
stream (q/k/v, gate/up, a mixture-of-experts router, a shared expert and its gate, the routed
experts' fused ``gate_up_proj`` along its last dim), row ``c`` (and bias entry) of every
projection that writes it (o_proj, down_proj, the fused ``down_proj`` along dim 1, GPT-2's
``c_proj``), and column ``c`` of the LM head (a head tied to the embedding is one parameter:
one slice). The whole model's stream is one
:class:`~tensorplay.ao.pruning.structured.dependency.unit_groups.UnitGroup` of kind
``"hidden"``, of ``hidden_size`` units.

**Exact, or refused.** A hidden channel whose slices are all zero is absent from every
projection; only the norms over the stream see it, as a zero counted in their mean (and
variance). With :mod:`~tensorplay.ao.pruning.structured.units.stream_norms` recomputing those
norms over the kept channels, the masked model computes what the shrunk one does. That holds for
the model types of :data:`HIDDEN_MODEL_TYPES`, each a row of the tests; any other model is
refused, saying why (:func:`hidden_refusal`): Gemma scales its embeddings by
``sqrt(hidden_size)`` computed from the config, so a shrunk model would scale differently;
post-norm encoders (BERT) normalise after the residual addition; the others are not verified.
Every parameter of the model must be a slice of the group or one the family knows is off the
stream (Qwen3's per-head ``q_norm``/``k_norm``, the q/k/v biases, a router's per-expert bias):
a parameter nobody accounts for (a classification head, a cross-attention) is refused, naming
it, never approximated.

Example:
    >>> import transformers
    >>> config = transformers.LlamaConfig(
    ...     vocab_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
    ...     num_attention_heads=4, num_key_value_heads=2)
    >>> width = hidden_width(transformers.LlamaForCausalLM(config))
    >>> width.group.kind, width.group.size, width.config_key
    ('hidden', 16, 'hidden_size')
    >>> [(s.parameter, s.dim) for s in width.group.slices][:3]
    [('model.embed_tokens.weight', 1), ('model.layers.0.input_layernorm.weight', 0),
     ('model.layers.0.post_attention_layernorm.weight', 0)]
    >>> [norm.name for norm in width.norms]
    ['model.layers.0.input_layernorm', 'model.layers.0.post_attention_layernorm', 'model.norm']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from torch import nn

from tensorplay.ao.pruning.parity.aliases import ParameterTable, TiedParameter
from tensorplay.ao.pruning.structured.dependency.blocks import FoundBlocks, find_blocks
from tensorplay.ao.pruning.structured.dependency.families import UnanalysableError
from tensorplay.ao.pruning.structured.dependency.families.family import child, join, weight_of
from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup

__all__ = [
    "HIDDEN",
    "HIDDEN_MODEL_TYPES",
    "HiddenWidth",
    "NormKind",
    "StreamNorm",
    "hidden_refusal",
    "hidden_width",
    "hidden_width_of",
    "norm_kind",
]

HIDDEN: Final = "hidden"
"""The kind of a hidden unit (``structure="hidden"``)."""

HIDDEN_MODEL_TYPES: Final = (
    "llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "gpt2",
)  # fmt: skip
"""The config ``model_type`` values whose hidden width is pruned exactly (each a test row)."""

_WHY_NOT: Final[Mapping[str, str]] = {
    "gemma": "it scales the token embeddings by sqrt(hidden_size), computed from the config, so "
    "a shrunk model would scale them by the square root of its new width",
    "gemma2": "it scales the token embeddings by sqrt(hidden_size), computed from the config",
    "gemma3_text": "it scales the token embeddings by sqrt(hidden_size), computed from the config",
    "bert": "its LayerNorms follow the residual additions (post-norm) and its token-type "
    "embeddings, pooler and prediction head read the stream",
    "roberta": "its LayerNorms follow the residual additions (post-norm) and its token-type "
    "embeddings, pooler and prediction head read the stream",
    "vit": "its stream starts in a patch convolution and a class token, which this analysis "
    "does not slice",
}

NormKind = Literal["rms", "layer"]

# Per family: the stream's readers (columns of their inputs), writers (rows of their outputs),
# norms over it, and the block tensors known to be off the stream.
_READ: Final[Mapping[str, tuple[str, ...]]] = {
    "llama": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
              "mlp.up_proj"),
    "moe": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate",
            "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert_gate"),
    "gpt2": ("attn.c_attn", "mlp.c_fc"),
}  # fmt: skip
_WRITE: Final[Mapping[str, tuple[str, ...]]] = {
    "llama": ("self_attn.o_proj", "mlp.down_proj"),
    "moe": ("self_attn.o_proj", "mlp.shared_expert.down_proj"),
    "gpt2": ("attn.c_proj", "mlp.c_proj"),
}
_NORMS: Final[Mapping[str, tuple[str, ...]]] = {
    "llama": ("input_layernorm", "post_attention_layernorm"),
    "moe": ("input_layernorm", "post_attention_layernorm"),
    "gpt2": ("ln_1", "ln_2"),
}
_OFF_STREAM: Final[Mapping[str, tuple[str, ...]]] = {
    "llama": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
              "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.bias",
              "mlp.up_proj.bias"),
    "moe": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
            "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate.bias",
            "mlp.gate.e_score_correction_bias", "mlp.experts.gate_up_proj_bias",
            "mlp.shared_expert.gate_proj.bias", "mlp.shared_expert.up_proj.bias",
            "mlp.shared_expert_gate.bias"),
    "gpt2": ("attn.c_attn.bias", "mlp.c_fc.bias"),
}  # fmt: skip


@dataclass(frozen=True)
class StreamNorm:
    """A norm over the residual stream: its module's qualified name and what it computes
    (``"rms"``: ``weight * x / sqrt(mean(x**2) + eps)`` in float32, as Hugging Face's RMSNorm;
    ``"layer"``: ``nn.LayerNorm``).

    Example:
        >>> StreamNorm("model.norm", "rms").kind
        'rms'
    """

    name: str
    kind: NormKind


@dataclass(frozen=True)
class HiddenWidth:
    """A model's hidden units: the group, the norms over the stream, and the config key of
    the width (``hidden_size``; GPT-2's ``n_embd`` is an alias of it).

    Example:
        >>> group = UnitGroup("model", "hidden", 4, (Slice("embed.weight", 1),))
        >>> HiddenWidth(group, (), "hidden_size").group.size
        4
    """

    group: UnitGroup
    norms: tuple[StreamNorm, ...]
    config_key: str


def norm_kind(module: nn.Module) -> NormKind | None:
    """``"layer"`` for an ``nn.LayerNorm`` with a weight, ``"rms"`` for a Hugging Face RMSNorm
    (a class named ``*RMSNorm`` holding ``weight`` and ``variance_epsilon`` or ``eps``),
    else ``None``.

    Example:
        >>> norm_kind(nn.LayerNorm(4)), norm_kind(nn.Linear(4, 4))
        ('layer', None)
    """
    return _norm_kind(module, weighted=weight_of(module) is not None)


def _norm_kind(module: nn.Module, *, weighted: bool) -> NormKind | None:
    """:func:`norm_kind`, told whether ``module`` holds a ``weight`` (pruned or not)."""
    if isinstance(module, nn.LayerNorm) and module.elementwise_affine:
        return "layer"
    named = type(module).__name__.endswith("RMSNorm")
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if named and isinstance(eps, float) and weighted:
        return "rms"
    return None


def hidden_refusal(model: nn.Module) -> str | None:
    """Why ``model``'s hidden width cannot be pruned exactly, or ``None`` where it can.

    Example:
        >>> from torch import nn
        >>> print(hidden_refusal(nn.Linear(2, 2))[:56])
        Linear is not a Hugging Face model of a known family, an
    """
    try:
        hidden_width(model)
    except ValueError as error:
        return str(error)
    return None


def hidden_width(model: nn.Module) -> HiddenWidth:
    """The hidden units of ``model`` (see the module docstring).

    Raises:
        UnanalysableError: (a ``ValueError``) A model whose stream is not found exactly, naming
            the family and model type, or the parameter no family accounts for.
    """
    return hidden_width_of(find_blocks(model), ParameterTable.of(model), type(model).__name__)


def hidden_width_of(
    found: FoundBlocks | None, table: ParameterTable, model_name: str
) -> HiddenWidth:
    """:func:`hidden_width` of a model already read: its blocks (``None``: none found), its
    parameters, and its class name (for the errors).

    Example:
        >>> import transformers
        >>> from tensorplay.ao.pruning.structured.dependency.blocks import find_blocks
        >>> config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=16,
        ...                                   bos_token_id=0, eos_token_id=0)
        >>> model = transformers.GPT2LMHeadModel(config)
        >>> width = hidden_width_of(find_blocks(model), ParameterTable.of(model), "GPT2")
        >>> width.group.size, width.config_key
        (16, 'n_embd')
    """
    if found is None:
        raise UnanalysableError(
            f"{model_name} is not a Hugging Face model of a known family, and the "
            "residual stream of a plain model is not traced"
        )
    config = found.config
    model_type = getattr(config, "model_type", None)
    if model_type not in HIDDEN_MODEL_TYPES or found.family.name not in _READ:
        why = _WHY_NOT.get(str(model_type), "no test proves its masked and shrunk models equal")
        raise UnanalysableError(
            f"the hidden size of {model_name} (model type {model_type!r}, "
            f"{found.family.name} family) cannot be pruned exactly: {why}. Hidden-size pruning "
            f"supports the model types {', '.join(HIDDEN_MODEL_TYPES)}"
        )
    aliases = table.aliases
    width = _width(found, aliases)
    slices: list[Slice] = []
    norms: list[StreamNorm] = []
    known: set[int] = set()
    blocks = set(found.block_names())
    for name, tied in aliases.items():  # the embeddings first, in model order
        if name != tied.name or _in(name, blocks):
            continue
        module, local = tied.pairs[0]
        if isinstance(module, nn.Embedding) and local == "weight":
            _check_width(name, tied, 1, width)
            slices.append(Slice(name, 1))
            known.add(id(tied.parameter))
    for block_name, block in zip(found.block_names(), found.blocks, strict=True):
        family = found.family.name
        for path in _NORMS[family]:
            norms.append(_norm(block_name, path, block, width, aliases, slices, known))
        for path in _READ[family]:
            _linear(block_name, path, block, width, aliases, slices, known, read=True)
        for path in _WRITE[family]:
            _linear(block_name, path, block, width, aliases, slices, known, read=False)
        if family == "moe":
            _fused_experts(block_name, block, width, aliases, slices, known)
        for off in _OFF_STREAM[family]:
            name = join(block_name, off)
            if name in aliases:
                known.add(id(aliases[name].parameter))
    for name, tied in aliases.items():  # the final norm and the LM head
        if name != tied.name or id(tied.parameter) in known or _in(name, blocks):
            continue
        module, local = tied.pairs[0]
        module_name = name.rpartition(".")[0]
        kind = _norm_kind(module, weighted=join(module_name, "weight") in aliases)
        if kind is not None and local in ("weight", "bias"):
            if local == "weight":
                norms.append(StreamNorm(module_name, kind))
            _check_width(name, tied, 0, width)
            slices.append(Slice(name, 0, scored=False))
            known.add(id(tied.parameter))
        elif isinstance(module, nn.Linear) and local == "weight" and module.in_features == width:
            slices.append(Slice(name, 1))
            known.add(id(tied.parameter))
        elif isinstance(module, nn.Linear) and local == "bias":
            known.add(id(tied.parameter))  # an output head's bias, over its outputs
    unknown = [tied.name for tied in aliases.values() if id(tied.parameter) not in known]
    if unknown:
        raise UnanalysableError(
            f"the hidden size of {model_name} cannot be pruned exactly: "
            f"{unknown[0]!r} is a parameter the {found.family.name} family does not place on or "
            "off the residual stream, so removing a hidden channel could change what it computes"
        )
    key = "n_embd" if found.family.name == "gpt2" else "hidden_size"
    group = UnitGroup(found.owner_name or found.name, HIDDEN, width, tuple(slices))
    return HiddenWidth(group, tuple(norms), key)


def _in(name: str, blocks: set[str]) -> bool:
    parts = name.split(".")
    return any(".".join(parts[:depth]) in blocks for depth in range(1, len(parts)))


def _width(found: FoundBlocks, aliases: Mapping[str, TiedParameter]) -> int:
    norm = join(found.block_names()[0], _NORMS[found.family.name][0])
    weight = aliases.get(join(norm, "weight"))  # its _orig where pruned, as the model reads it
    if weight is None or weight.parameter.dim() != 1:
        raise UnanalysableError(
            f"Expected {norm!r} to be a norm over the residual stream with a 1-D weight, but it "
            "is not."
        )
    return int(weight.parameter.shape[0])


def _check_width(name: str, tied: TiedParameter, dim: int, width: int) -> None:
    shape = tuple(tied.parameter.shape)
    if len(shape) <= dim or shape[dim] != width:
        raise UnanalysableError(
            f"Expected {name!r} to hold the residual stream's {width} channels along dim {dim}, "
            f"but it has shape {shape}."
        )


def _norm(
    block_name: str,
    path: str,
    block: nn.Module,
    width: int,
    aliases: Mapping[str, TiedParameter],
    slices: list[Slice],
    known: set[int],
) -> StreamNorm:
    module = child(block, path)
    name = join(block_name, path)
    kind = None if module is None else _norm_kind(module, weighted=join(name, "weight") in aliases)
    if module is None or kind is None:
        raise UnanalysableError(
            f"Expected {name!r} to be an RMSNorm or a LayerNorm over the residual stream, but "
            f"it is a {type(module).__name__}."
        )
    for local in ("weight", "bias"):
        if join(name, local) in aliases:
            tied = aliases[join(name, local)]
            _check_width(tied.name, tied, 0, width)
            slices.append(Slice(tied.name, 0, scored=False))
            known.add(id(tied.parameter))
    return StreamNorm(name, kind)


def _linear(
    block_name: str,
    path: str,
    block: nn.Module,
    width: int,
    aliases: Mapping[str, TiedParameter],
    slices: list[Slice],
    known: set[int],
    *,
    read: bool,
) -> None:
    """The stream's slices of a Linear (weight ``(out, in)``), a ``Conv1D`` (``(in, out)``)
    or a router (a ``weight`` of ``(experts, hidden)``): input columns where it reads the
    stream, output rows and bias entries where it writes it. A missing optional part (a
    shared expert) is skipped."""
    module = child(block, path)
    if module is None:
        return
    name = join(block_name, path)
    weight = aliases[join(name, "weight")]
    in_out = type(module).__name__ == "Conv1D"
    dim = (0 if in_out else 1) if read else (1 if in_out else 0)
    _check_width(weight.name, weight, dim, width)
    slices.append(Slice(weight.name, dim))
    known.add(id(weight.parameter))
    bias = aliases.get(join(name, "bias"))
    if bias is not None and not read:
        slices.append(Slice(bias.name, 0, scored=False))
        known.add(id(bias.parameter))


def _fused_experts(
    block_name: str,
    block: nn.Module,
    width: int,
    aliases: Mapping[str, TiedParameter],
    slices: list[Slice],
    known: set[int],
) -> None:
    """The routed experts' fused tensors: ``gate_up_proj`` ``(E, 2 * inter, hidden)`` reads
    the stream along dim 2, ``down_proj`` ``(E, hidden, inter)`` writes it along dim 1 (its
    bias ``(E, hidden)`` along dim 1)."""
    name = join(block_name, "mlp.experts")
    for local, dim, scored in (("gate_up_proj", 2, True), ("down_proj", 1, True),
                               ("down_proj_bias", 1, False)):  # fmt: skip
        tied = aliases.get(join(name, local))
        if tied is None:
            continue
        _check_width(tied.name, tied, dim, width)
        slices.append(Slice(tied.name, dim, scored=scored))
        known.add(id(tied.parameter))
