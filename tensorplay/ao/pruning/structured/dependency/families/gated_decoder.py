"""Decoder blocks of q/k/v/o attention and a gated FFN, told apart by their norms.

Llama, Gemma 2 and 3, and OLMo 2 share one layout: ``self_attn`` holds four ``nn.Linear``
layers ``q_proj``/``k_proj``/``v_proj``/``o_proj`` (grouped-query attention: a head unit is a
key/value head with its query heads), ``mlp`` the gated FFN ``down(act(gate(x)) * up(x))`` (a
channel is a row of ``gate_proj`` and ``up_proj`` and a column of ``down_proj``). The families
differ in the norms around them, each a weight over the residual stream that stays whole:

* Llama-style: ``input_layernorm`` before attention, ``post_attention_layernorm`` before the FFN;
* Gemma 2 and 3: those, and ``pre_feedforward_layernorm``/``post_feedforward_layernorm``, the
  outputs of attention and the FFN normalised before each residual addition;
* OLMo 2: ``post_attention_layernorm``/``post_feedforward_layernorm`` only (no norm before).

A block is recognised by exactly these children (``self_attn``, ``mlp`` and the family's norms,
no other child holding parameters), so a Gemma 2 block is never taken for a Llama one. Every
such block whose parameters are zero adds zero to the residual stream (a norm of zero is zero),
so whole layers can go. A ``q_norm``/``k_norm`` per head (Qwen3, Gemma 3: a weight of
``head_dim``) is shared by all heads; one over the whole projection (OLMo 2) mixes the heads, and
heads are refused
(:func:`~tensorplay.ao.pruning.structured.dependency.families.projections.norm_over_heads`).
Removing key/value groups with their query heads keeps ``num_key_value_groups``; the config's
``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` (explicit) and ``intermediate_size``
follow.

Example:
    >>> from torch import nn
    >>> family = GatedDecoderFamily("toy", "Toy", ("norm",))
    >>> family.submodules[-3:]
    ('mlp.up_proj', 'mlp.down_proj', 'norm')
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from tensorplay.ao.pruning.structured.dependency.families.family import (
    BlockUnits,
    join,
    laid_out,
    out_in,
    submodule,
)
from tensorplay.ao.pruning.structured.dependency.families.projections import (
    QKVO,
    channel_group,
    decoder_counts,
    decoder_widths,
    head_layout,
    norm_over_heads,
    qkvo_heads,
    sync_head_counts,
)

__all__ = ["GatedDecoderFamily"]

_GATED = ("gate_proj", "up_proj", "down_proj")
_SHARED = (
    "self_attn.o_proj.bias",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.down_proj.bias",
)


class GatedDecoderFamily:
    """Blocks of q/k/v/o attention and a gated FFN with the norms ``norms`` (see the module
    docstring).

    Args:
        name: Short name in summaries and errors.
        models: The architectures it covers.
        norms: The block's norm children, each over the residual stream.
    """

    def __init__(self, name: str, models: str, norms: tuple[str, ...]) -> None:
        self.name = name
        self.models = models
        self.norms = norms
        self.submodules: tuple[str, ...] = (
            *(f"self_attn.{key}" for key in QKVO),
            *(f"mlp.{key}" for key in _GATED),
            *norms,
        )

    def matches(self, block: nn.Module) -> bool:
        """The q/k/v/o and gated FFN Linears, and exactly the family's norms beside them."""
        return laid_out(block, self.submodules[:7], ("self_attn", "mlp", *self.norms))

    def units(self, prefix: str, block: nn.Module) -> BlockUnits:
        """The block's FFN channels and key/value-group heads (heads refused where a norm
        spans all of them)."""
        mlp = join(prefix, "mlp")
        inputs = {join(mlp, key): submodule(block, f"mlp.{key}") for key in _GATED[:2]}
        channel = channel_group(
            mlp, inputs, (join(mlp, "down_proj"), submodule(block, "mlp.down_proj"))
        )
        norms = tuple(f"{norm}.{kind}" for norm in self.norms for kind in ("weight", "bias"))
        name, attention = join(prefix, "self_attn"), submodule(block, "self_attn")
        head = qkvo_heads(name, attention)
        return BlockUnits(
            channel, head, (*norms, *_SHARED), head_refusal=norm_over_heads(name, attention)
        )

    def layer_refusal(self, block: nn.Module) -> str | None:
        """None: a block whose parameters are zero adds zero to the residual stream."""
        return None

    def sync(self, block: nn.Module) -> None:
        """Head counts on the attention module, where a version keeps them."""
        sync_head_counts("self_attn", submodule(block, "self_attn"))

    def widths(self, block: nn.Module) -> dict[str, int]:
        """``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``,
        ``head_dim``."""
        return decoder_widths(
            out_in(submodule(block, "mlp.up_proj"))[0],
            head_layout("self_attn", submodule(block, "self_attn")),
        )

    def unit_counts(self, widths: Mapping[str, int]) -> dict[str, int]:
        """Channels: ``intermediate_size``; heads: ``num_key_value_heads``."""
        return decoder_counts(widths)
