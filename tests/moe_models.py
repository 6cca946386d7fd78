"""Tiny mixture-of-experts Hugging Face models built from configs (random init, nothing
downloaded): 2 pre-norm blocks, 4 query heads of 8 sharing 2 key/value heads, 8 experts of 16
channels with 2 chosen per token (Qwen2-MoE adds a shared expert of 24 channels)."""

from __future__ import annotations

from typing import Any

from torch import nn

from tests.hf_models import VOCAB, _build, _transformers

EXPERTS = 8
TOP_K = 2


def _common(**extra: Any) -> dict[str, Any]:
    return dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
        num_experts_per_tok=TOP_K, **extra,
    )  # fmt: skip


def tiny_qwen2_moe(seed: int = 0, **extra: Any) -> nn.Module:
    """``Qwen2MoeForCausalLM``: a shared expert with its sigmoid gate, top-k not renormalised."""
    transformers = _transformers()
    config = transformers.Qwen2MoeConfig(**_common(
        num_experts=EXPERTS, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        intermediate_size=40, norm_topk_prob=False, **extra,
    ))  # fmt: skip
    return _build(transformers.Qwen2MoeForCausalLM, config, seed)


def tiny_qwen3_moe(seed: int = 0, **extra: Any) -> nn.Module:
    """``Qwen3MoeForCausalLM``: per-head ``q_norm``/``k_norm``, top-k renormalised."""
    transformers = _transformers()
    config = transformers.Qwen3MoeConfig(**_common(
        num_experts=EXPERTS, moe_intermediate_size=16, intermediate_size=40, head_dim=8,
        norm_topk_prob=True, **extra,
    ))  # fmt: skip
    return _build(transformers.Qwen3MoeForCausalLM, config, seed)


def tiny_mixtral(seed: int = 0, **extra: Any) -> nn.Module:
    """``MixtralForCausalLM``: softmax, top-k, renormalised over the top-k (always)."""
    transformers = _transformers()
    config = transformers.MixtralConfig(**_common(
        num_local_experts=EXPERTS, intermediate_size=16, sliding_window=None, **extra,
    ))  # fmt: skip
    return _build(transformers.MixtralForCausalLM, config, seed)


def tiny_olmoe(seed: int = 0, **extra: Any) -> nn.Module:
    """``OlmoeForCausalLM``: ``q_norm``/``k_norm`` over all heads (no head units)."""
    transformers = _transformers()
    config = transformers.OlmoeConfig(**_common(
        num_experts=EXPERTS, intermediate_size=16, norm_topk_prob=False, **extra,
    ))  # fmt: skip
    return _build(transformers.OlmoeForCausalLM, config, seed)


MOE_MODELS = {
    "qwen2_moe": tiny_qwen2_moe,
    "qwen3_moe": tiny_qwen3_moe,
    "mixtral": tiny_mixtral,
    "olmoe": tiny_olmoe,
}
"""Each family's builder by model type."""
