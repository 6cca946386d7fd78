"""OLMo 2 blocks: norms after attention and the FFN, and q/k norms over all heads.

A block is ``self_attn -> post_attention_layernorm -> +residual -> mlp ->
post_feedforward_layernorm -> +residual`` (no norm before a sublayer), with q/k/v/o attention and
a gated FFN (:mod:`~tensorplay.ao.pruning.structured.dependency.families.gated_decoder`). A block
whose parameters are zero adds zero (a norm of zero is zero), so whole layers can go; FFN channels
are exact. ``self_attn.q_norm`` and ``k_norm`` are RMS norms over the whole projection (``num_heads
* head_dim`` entries): the root mean square over all heads changes when one head goes, so heads
cannot be removed exactly and are refused.

Example:
    >>> import transformers
    >>> config = transformers.Olmo2Config(
    ...     vocab_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
    ...     num_attention_heads=4, num_key_value_heads=2)
    >>> block = transformers.Olmo2ForCausalLM(config).model.layers[0]
    >>> units = OLMO2.units("model.layers.0", block)
    >>> units.channel.size, units.head.size
    (24, 2)
    >>> print(units.head_refusal)
    'model.layers.0.self_attn.q_norm' normalises the queries of all heads together (a weight ...
"""

from __future__ import annotations

from tensorplay.ao.pruning.structured.dependency.families.gated_decoder import GatedDecoderFamily

__all__ = ["OLMO2"]

OLMO2 = GatedDecoderFamily(
    "olmo2", "OLMo 2", ("post_attention_layernorm", "post_feedforward_layernorm")
)
"""The OLMo 2 family."""
