"""Llama-style blocks: Llama, Mistral, Qwen2, Qwen3.

A block is ``input_layernorm -> self_attn -> +residual -> post_attention_layernorm -> mlp ->
+residual`` (pre-norm). ``self_attn`` holds ``q_proj``/``k_proj``/``v_proj``/``o_proj`` with
grouped-query attention (a head unit is a key/value head with its query heads; Qwen3's per-head
``q_norm``/``k_norm`` are shared by all heads), ``mlp`` the gated FFN ``down(act(gate(x)) *
up(x))`` (a channel is a row of ``gate_proj`` and ``up_proj`` and a column of ``down_proj``).
Removing key/value groups with their query heads keeps ``num_key_value_groups``, so the
attention module needs no change; the config's ``num_attention_heads``,
``num_key_value_heads``, ``head_dim`` (explicit) and ``intermediate_size`` follow.

Example:
    >>> import transformers
    >>> config = transformers.LlamaConfig(
    ...     vocab_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
    ...     num_attention_heads=4, num_key_value_heads=2)
    >>> block = transformers.LlamaForCausalLM(config).model.layers[0]
    >>> units = LLAMA.units("model.layers.0", block)
    >>> LLAMA.matches(block), units.channel.size, units.head.size
    (True, 24, 2)
    >>> LLAMA.widths(block)
    {'intermediate_size': 24, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': 4}
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from tensorplay.ao.pruning.dependency.families.family import (
    BlockUnits,
    has_children,
    out_in,
    set_present,
    submodule,
)
from tensorplay.ao.pruning.dependency.families.projections import (
    QKVO,
    channel_group,
    head_layout,
    qkvo_heads,
)

__all__ = ["LLAMA", "LlamaFamily"]

_GATED = ("gate_proj", "up_proj", "down_proj")
_SHARED = (
    "input_layernorm.weight",
    "input_layernorm.bias",
    "post_attention_layernorm.weight",
    "post_attention_layernorm.bias",
    "self_attn.o_proj.bias",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.down_proj.bias",
)


class LlamaFamily:
    """Llama-style blocks (see the module docstring)."""

    name = "llama"
    models = "Llama, Mistral, Qwen2, Qwen3"

    def matches(self, block: nn.Module) -> bool:
        """``self_attn`` with q/k/v/o Linears, a gated ``mlp``, two norms."""
        return (
            has_children(block, tuple(f"self_attn.{key}" for key in QKVO), nn.Linear)
            and has_children(block, tuple(f"mlp.{key}" for key in _GATED), nn.Linear)
            and has_children(block, ("input_layernorm", "post_attention_layernorm"))
        )

    def units(self, prefix: str, block: nn.Module) -> BlockUnits:
        """The block's FFN channels and key/value-group heads."""
        mlp = f"{prefix}.mlp"
        inputs = {
            f"{mlp}.{key}": submodule(block, f"mlp.{key}") for key in ("gate_proj", "up_proj")
        }
        channel = channel_group(
            mlp, inputs, (f"{mlp}.down_proj", submodule(block, "mlp.down_proj"))
        )
        head = qkvo_heads(f"{prefix}.self_attn", submodule(block, "self_attn"))
        return BlockUnits(channel, head, _SHARED)

    def layer_refusal(self, block: nn.Module) -> str | None:
        """None: a pre-norm block whose projections are zero adds zero to the residual."""
        return None

    def sync(self, block: nn.Module) -> None:
        """Head counts on the attention module, where a version keeps them."""
        attention = submodule(block, "self_attn")
        layout = head_layout("self_attn", attention)
        set_present(
            attention,
            {
                "num_heads": layout.query,
                "num_attention_heads": layout.query,
                "num_key_value_heads": layout.key_value,
                "num_key_value_groups": layout.group,
            },
        )

    def widths(self, block: nn.Module) -> dict[str, int]:
        """``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``,
        ``head_dim``."""
        layout = head_layout("self_attn", submodule(block, "self_attn"))
        return {
            "intermediate_size": out_in(submodule(block, "mlp.up_proj"))[0],
            "num_attention_heads": layout.query,
            "num_key_value_heads": layout.key_value,
            "head_dim": layout.head_dim,
        }

    def unit_counts(self, widths: Mapping[str, int]) -> dict[str, int]:
        """Channels: ``intermediate_size``; heads: ``num_key_value_heads``."""
        return {"channel": widths["intermediate_size"], "head": widths["num_key_value_heads"]}


LLAMA = LlamaFamily()
"""The Llama-style family."""
