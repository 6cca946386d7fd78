"""Llama-style blocks: Llama, Mistral, Qwen2, Qwen3 (and Gemma 1, Granite, which share them).

A block is ``input_layernorm -> self_attn -> +residual -> post_attention_layernorm -> mlp ->
+residual`` (pre-norm), with q/k/v/o attention and a gated FFN
(:mod:`~tensorplay.ao.pruning.structured.dependency.families.gated_decoder`); Qwen3's per-head
``q_norm``/``k_norm`` are shared by all heads.

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

from tensorplay.ao.pruning.structured.dependency.families.gated_decoder import GatedDecoderFamily

__all__ = ["LLAMA"]

LLAMA = GatedDecoderFamily(
    "llama", "Llama, Mistral, Qwen2, Qwen3", ("input_layernorm", "post_attention_layernorm")
)
"""The Llama-style family."""
