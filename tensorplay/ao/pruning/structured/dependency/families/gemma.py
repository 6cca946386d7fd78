"""Gemma 2 and Gemma 3 (text) blocks: norms before and after attention and the FFN.

A block is ``input_layernorm -> self_attn -> post_attention_layernorm -> +residual ->
pre_feedforward_layernorm -> mlp -> post_feedforward_layernorm -> +residual``, with q/k/v/o
attention and a gated FFN
(:mod:`~tensorplay.ao.pruning.structured.dependency.families.gated_decoder`). The norm after each
sublayer is over the residual stream: a removed head or channel contributed zero to its input, so it
computes the same. Gemma 3's ``q_norm``/``k_norm`` are per head (``head_dim`` entries) and shared by
all heads. Sliding and global layers, attention and final logit soft-capping and the query scaling
(``query_pre_attn_scalar``) do not depend on the widths; the config's ``layer_types`` follows
removed layers and its explicit ``head_dim`` stays.

Example:
    >>> import transformers
    >>> config = transformers.Gemma2Config(
    ...     vocab_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
    ...     num_attention_heads=4, num_key_value_heads=2, head_dim=4)
    >>> block = transformers.Gemma2ForCausalLM(config).model.layers[0]
    >>> units = GEMMA.units("model.layers.0", block)
    >>> GEMMA.matches(block), units.channel.size, units.head.size, units.shared[:2]
    (True, 24, 2, ('input_layernorm.weight', 'input_layernorm.bias'))
"""

from __future__ import annotations

from tensorplay.ao.pruning.structured.dependency.families.gated_decoder import GatedDecoderFamily

__all__ = ["GEMMA"]

GEMMA = GatedDecoderFamily(
    "gemma2",
    "Gemma 2, Gemma 3",
    ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
     "post_feedforward_layernorm"),
)  # fmt: skip
"""The Gemma 2 / Gemma 3 family."""
