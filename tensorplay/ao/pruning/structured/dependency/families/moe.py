"""Mixture-of-experts blocks of transformers 5: Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE.

A block is Llama-style (``input_layernorm -> self_attn -> +residual ->
post_attention_layernorm -> mlp -> +residual``, pre-norm) with a sparse ``mlp``: a router
``mlp.gate`` (a module with a ``weight`` of ``(num_experts, hidden)`` and an int ``top_k``: it
computes ``logits = x @ weight.T``, a softmax, the top-k, and renormalises them over the top-k
where ``norm_topk_prob`` is set, Mixtral always) and the experts ``mlp.experts``, fused 3-D
parameters ``gate_up_proj`` ``(num_experts, 2 * inter, hidden)`` and ``down_proj``
``(num_experts, hidden, inter)``. Qwen2-MoE adds a shared expert (``mlp.shared_expert``, a gated
FFN every token goes through, scaled by ``sigmoid(mlp.shared_expert_gate(x))``).

The units:

* ``"expert"``: expert ``e`` is index ``e`` along dim 0 of each fused expert tensor (and of their
  biases) with row ``e`` of the router's weight (and its bias entries); the group's
  :attr:`~tensorplay.ao.pruning.structured.dependency.unit_groups.UnitGroup.min_kept` is the
  router's ``top_k`` (a layer needs that many experts to route a token); the shared expert is never
  an expert unit;
* ``"channel"``: the FFN channels of each routed expert, one group per expert, named
  ``"<mlp>.experts[e]"`` (:attr:`BlockUnits.expert_channels
  <tensorplay.ao.pruning.structured.dependency.families.family.BlockUnits>`): channel ``c`` of
  expert ``e`` is row ``c`` (gate) and row ``inter + c`` (up) of ``gate_up_proj[e]`` with column
  ``c`` of ``down_proj[e]`` (and the same entries of ``gate_up_proj_bias[e]``); and, on
  Qwen2-MoE, the shared expert's FFN channels (its gate ``shared_expert_gate`` stays whole). A
  fused tensor holds one width for all the experts of a layer: the config's
  ``moe_intermediate_size`` (Qwen2-MoE, Qwen3-MoE) or ``intermediate_size`` (Mixtral, OLMoE);
* ``"head"``: key/value groups with their query heads as for Llama (Qwen3-MoE's per-head
  ``q_norm``/``k_norm`` stay whole); OLMoE normalises queries and keys over all heads at once,
  which mixes the heads, so it has no head units.

A masked expert must never be routed to (:mod:`~tensorplay.ao.pruning.structured.units.routing` sets
its logit to minus infinity); :attr:`BlockUnits.routing
<tensorplay.ao.pruning.structured.dependency. families.family.BlockUnits>` says where the router is
and how it routes. The config's expert count is ``num_experts`` (an alias of Mixtral's and
Qwen3-MoE's ``num_local_experts``).

Example:
    >>> import transformers
    >>> config = transformers.MixtralConfig(
    ...     vocab_size=16, hidden_size=16, intermediate_size=8, num_hidden_layers=1,
    ...     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
    ...     num_experts_per_tok=2)
    >>> block = transformers.MixtralForCausalLM(config).model.layers[0]
    >>> units = MOE.units("model.layers.0", block)
    >>> MOE.matches(block), units.expert.size, units.expert.min_kept, units.channel
    (True, 4, 2, None)
    >>> [(s.parameter, s.dim, s.scored) for s in units.expert.slices]
    [('model.layers.0.mlp.experts.gate_up_proj', 0, True),
     ('model.layers.0.mlp.experts.down_proj', 0, True),
     ('model.layers.0.mlp.gate.weight', 0, False)]
    >>> second = units.expert_channels[1]  # expert 1's 8 channels
    >>> second.name, second.size
    ('model.layers.0.mlp.experts[1]', 8)
    >>> [(s.parameter.rpartition(".")[2], s.dim, s.offset, s.expert) for s in second.slices]
    [('gate_up_proj', 1, 0, 1), ('gate_up_proj', 1, 8, 1), ('down_proj', 2, 0, 1)]
    >>> MOE.widths(block)
    {'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': 4, 'num_experts': 4,
     'intermediate_size': 8}
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from tensorplay.ao.pruning.structured.dependency.families.family import (
    BlockUnits,
    Routing,
    UnanalysableError,
    child,
    has_children,
    int_attribute,
    is_linear,
    join,
    out_in,
    set_present,
    submodule,
    weight_of,
)
from tensorplay.ao.pruning.structured.dependency.families.projections import (
    QKVO,
    channel_group,
    head_layout,
    norm_over_heads,
    qkvo_heads,
    sync_head_counts,
)
from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup

__all__ = ["MOE", "MoeFamily"]

_FUSED = ("gate_up_proj", "down_proj")
_GATED = ("gate_proj", "up_proj", "down_proj")
_SHARED = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.o_proj.bias",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.shared_expert.down_proj.bias",
    "mlp.shared_expert_gate.weight",
    "mlp.shared_expert_gate.bias",
)


class MoeFamily:
    """Mixture-of-experts blocks (see the module docstring)."""

    name = "moe"
    models = "Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE"
    submodules: tuple[str, ...] = (
        *(f"self_attn.{key}" for key in QKVO), "mlp.gate", "mlp.experts",
        "input_layernorm", "post_attention_layernorm",
    )  # fmt: skip

    def matches(self, block: nn.Module) -> bool:
        """Llama-style attention and norms, a router ``mlp.gate`` with a 2-D ``weight`` and an
        int ``top_k``, experts ``mlp.experts`` with 3-D ``gate_up_proj`` and ``down_proj``."""
        router = child(block, "mlp.gate")
        experts = child(block, "mlp.experts")
        return (
            has_children(block, tuple(f"self_attn.{key}" for key in QKVO), nn.Linear)
            and has_children(block, ("input_layernorm", "post_attention_layernorm"))
            and router is not None
            and not is_linear(router)
            and isinstance(getattr(router, "top_k", None), int)
            and _dims(router, "weight") == 2
            and experts is not None
            and all(_dims(experts, key) == 3 for key in _FUSED)
        )

    def units(self, prefix: str, block: nn.Module) -> BlockUnits:
        """The block's experts, their channels, its shared expert's channels and its heads
        (``None`` where it has none: see the module docstring).

        Raises:
            UnanalysableError: Expert tensors or a router whose expert counts disagree.
        """
        mlp = f"{prefix}.mlp"
        shared = child(block, "mlp.shared_expert")
        channel = None
        if shared is not None:
            if not has_children(shared, _GATED, nn.Linear):
                raise UnanalysableError(
                    f"Expected {mlp}.shared_expert to be a gated FFN ({', '.join(_GATED)}), but "
                    f"it is a {type(shared).__name__} without them."
                )
            name = f"{mlp}.shared_expert"
            inputs = {f"{name}.{key}": submodule(shared, key) for key in ("gate_proj", "up_proj")}
            channel = channel_group(
                name, inputs, (f"{name}.down_proj", submodule(shared, "down_proj"))
            )
        attention, name = submodule(block, "self_attn"), f"{prefix}.self_attn"
        head = qkvo_heads(name, attention)
        expert, routing = _experts(mlp, block)
        return BlockUnits(
            channel, head, _SHARED, expert=expert, routing=routing,
            head_refusal=norm_over_heads(name, attention),
            expert_channels=_expert_channels(mlp, block, expert.size),
        )  # fmt: skip

    def layer_refusal(self, block: nn.Module) -> str | None:
        """None: a pre-norm block whose parameters are zero adds zero to the residual."""
        return None

    def sync(self, block: nn.Module) -> None:
        """Head counts on the attention module, expert counts on the router and experts, the
        experts' width (``intermediate_dim``) on the experts."""
        attention = submodule(block, "self_attn")
        if not _norms_all_heads(attention):
            sync_head_counts("self_attn", attention)
        count = _expert_count(block)
        for path in ("mlp.gate", "mlp.experts"):
            set_present(submodule(block, path), {"num_experts": count})
        set_present(submodule(block, "mlp.experts"), {"intermediate_dim": _expert_width(block)})

    def widths(self, block: nn.Module) -> dict[str, int]:
        """The head counts and ``head_dim``, ``shared_expert_intermediate_size`` (Qwen2-MoE),
        ``num_experts``, the experts' width under the config's key for it
        (``moe_intermediate_size``; ``intermediate_size`` where the config has no such key:
        Mixtral, OLMoE)."""
        widths: dict[str, int] = {}
        attention = submodule(block, "self_attn")
        if not _norms_all_heads(attention):
            layout = head_layout("self_attn", attention)
            widths.update(
                num_attention_heads=layout.query,
                num_key_value_heads=layout.key_value,
                head_dim=layout.head_dim,
            )
        shared = child(block, "mlp.shared_expert.up_proj")
        if shared is not None:
            widths["shared_expert_intermediate_size"] = out_in(shared)[0]
        widths["num_experts"] = _expert_count(block)
        widths[_width_key(attention)] = _expert_width(block)
        return widths

    def unit_counts(self, widths: Mapping[str, int]) -> dict[str, int]:
        """Experts: ``num_experts``; channels: ``shared_expert_intermediate_size``; each
        expert's channels: the experts' width; heads: ``num_key_value_heads`` (those the widths
        hold)."""
        keys = {
            "expert": "num_experts",
            "channel": "shared_expert_intermediate_size",
            "expert_channel": "moe_intermediate_size",
            "head": "num_key_value_heads",
        }
        if "moe_intermediate_size" not in widths:  # Mixtral's and OLMoE's key for it
            keys["expert_channel"] = "intermediate_size"
        return {kind: widths[key] for kind, key in keys.items() if key in widths}


def _dims(module: nn.Module, name: str) -> int | None:
    found = weight_of(module, name)
    return None if found is None else found.dim()


def _norms_all_heads(attention: nn.Module) -> bool:
    """Whether ``q_norm`` normalises all heads at once (OLMoE), rather than each head."""
    norm = child(attention, "q_norm")
    weight = None if norm is None else weight_of(norm)
    head_dim = getattr(attention, "head_dim", None)
    return weight is not None and tuple(weight.shape) != (head_dim,)


def _expert_count(block: nn.Module) -> int:
    weight = weight_of(submodule(block, "mlp.gate"))
    assert weight is not None  # matched
    return int(weight.shape[0])


def _expert_width(block: nn.Module) -> int:
    """The experts' FFN width: the last dim of ``down_proj`` ``(num_experts, hidden, inter)``."""
    weight = weight_of(submodule(block, "mlp.experts"), "down_proj")
    assert weight is not None  # matched
    return int(weight.shape[-1])


def _width_key(attention: nn.Module) -> str:
    """The config key of the experts' width: ``moe_intermediate_size`` where the model's config
    has it (Qwen2-MoE and Qwen3-MoE, whose ``intermediate_size`` is a dense FFN's), else
    ``intermediate_size`` (Mixtral, OLMoE). The attention module holds the config."""
    config = getattr(attention, "config", None)
    return "intermediate_size" if config is not None and not hasattr(
        config, "moe_intermediate_size"
    ) else "moe_intermediate_size"  # fmt: skip


def _expert_channels(mlp: str, block: nn.Module, count: int) -> tuple[UnitGroup, ...]:
    """One channel group per routed expert: its rows of the gate and up sections of
    ``gate_up_proj`` (``chunk(2)``: gate first), its columns of ``down_proj``, its entries of
    ``gate_up_proj_bias``.

    Raises:
        UnanalysableError: ``gate_up_proj`` not twice as wide as ``down_proj``.
    """
    experts = submodule(block, "mlp.experts")
    gate_up, down = (weight_of(experts, key) for key in _FUSED)
    assert gate_up is not None and down is not None  # matched
    width = int(down.shape[-1])
    if gate_up.shape[1] != 2 * width or gate_up.shape[2] != down.shape[1]:
        raise UnanalysableError(
            f"Expected {mlp}.experts.gate_up_proj to hold the gate and up projections of the "
            f"{width} channels of {mlp}.experts.down_proj (shape (num_experts, {2 * width}, "
            f"{down.shape[1]})), but it has shape {tuple(gate_up.shape)}."
        )
    name = f"{mlp}.experts"
    bias = weight_of(experts, "gate_up_proj_bias") is not None
    groups = []
    for expert in range(count):
        slices = [
            Slice(f"{name}.gate_up_proj", 1, 0, expert=expert),
            Slice(f"{name}.gate_up_proj", 1, width, expert=expert),
            Slice(f"{name}.down_proj", 2, expert=expert),
        ]
        if bias:
            slices += [
                Slice(f"{name}.gate_up_proj_bias", 1, offset, scored=False, expert=expert)
                for offset in (0, width)
            ]
        groups.append(UnitGroup(f"{name}[{expert}]", "channel", width, tuple(slices)))
    return tuple(groups)


def _experts(mlp: str, block: nn.Module) -> tuple[UnitGroup, Routing]:
    """The expert units of the sparse ``mlp`` and how its router routes."""
    router = submodule(block, "mlp.gate")
    experts = submodule(block, "mlp.experts")
    count = _expert_count(block)
    slices: list[Slice] = []
    for key in _FUSED:
        weight = weight_of(experts, key)
        assert weight is not None  # matched
        if weight.shape[0] != count:
            raise UnanalysableError(
                f"Expected {mlp}.experts.{key} to hold the {count} experts the router "
                f"{mlp}.gate routes to along dim 0, but it has shape {tuple(weight.shape)}."
            )
        slices.append(Slice(f"{mlp}.experts.{key}", 0))
    for key in ("gate_up_proj_bias", "down_proj_bias"):
        if weight_of(experts, key) is not None:
            slices.append(Slice(f"{mlp}.experts.{key}", 0, scored=False))
    for key in ("weight", "bias", "e_score_correction_bias"):
        if weight_of(router, key) is not None:
            slices.append(Slice(join(f"{mlp}.gate", key), 0, scored=False))
    top_k = int_attribute(router, "top_k", f"{mlp}.gate")
    group = UnitGroup(mlp, "expert", count, tuple(slices), min_kept=top_k)
    normalise = bool(getattr(router, "norm_topk_prob", True))  # Mixtral always renormalises
    return group, Routing(f"{mlp}.gate", top_k, normalise)


MOE = MoeFamily()
"""The mixture-of-experts family."""
