"""Tiny Hugging Face models built from configs (random init, nothing downloaded).

Each builder skips the calling test when ``transformers`` is not installed and silences the logs
that tiny vocabularies trigger (GPT-2's bos/eos ids lie outside a 97-token vocabulary).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

VOCAB = 97


def _transformers() -> Any:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return transformers


def _build(model_class: Any, config: Any, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model: nn.Module = model_class(config).eval()
    return model


def tiny_gpt2(seed: int = 0, *, n_head: int = 2, dropout: float = 0.1) -> nn.Module:
    """``GPT2LMHeadModel``: 2 blocks of Conv1D projections, LM head tied to the embedding
    (``dropout``: every GPT-2 dropout, 0.1 as GPT-2's defaults)."""
    transformers = _transformers()
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=n_head, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
        eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
    )  # fmt: skip
    return _build(transformers.GPT2LMHeadModel, config, seed)


def tiny_bert(seed: int = 0, *, dropout: float = 0.1) -> nn.Module:
    """``BertForMaskedLM``: Linear layers, the decoder tied to the word embeddings."""
    transformers = _transformers()
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )  # fmt: skip
    return _build(transformers.BertForMaskedLM, config, seed)


def tiny_roberta(seed: int = 0, *, dropout: float = 0.0) -> nn.Module:
    """``RobertaForMaskedLM``: BERT's layout (post-norm), 4 heads of 8."""
    transformers = _transformers()
    config = transformers.RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=72, hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )  # fmt: skip
    return _build(transformers.RobertaForMaskedLM, config, seed)


def _llama_style(config_class: Any, **extra: Any) -> Any:
    """3 pre-norm blocks, 4 query heads of 8 sharing 2 key/value heads, an FFN of 48, an LM
    head of its own (untied)."""
    return config_class(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False, **extra,
    )  # fmt: skip


def tiny_llama(seed: int = 0) -> nn.Module:
    """``LlamaForCausalLM`` with grouped-query attention (see :func:`_llama_style`)."""
    transformers = _transformers()
    return _build(transformers.LlamaForCausalLM, _llama_style(transformers.LlamaConfig), seed)


def tiny_mistral(seed: int = 0) -> nn.Module:
    """``MistralForCausalLM`` with grouped-query attention (see :func:`_llama_style`)."""
    transformers = _transformers()
    config = _llama_style(transformers.MistralConfig, sliding_window=None)
    return _build(transformers.MistralForCausalLM, config, seed)


def tiny_qwen2(seed: int = 0) -> nn.Module:
    """``Qwen2ForCausalLM``: biases on q/k/v (see :func:`_llama_style`)."""
    transformers = _transformers()
    return _build(transformers.Qwen2ForCausalLM, _llama_style(transformers.Qwen2Config), seed)


def tiny_qwen3(seed: int = 0) -> nn.Module:
    """``Qwen3ForCausalLM``: per-head ``q_norm``/``k_norm`` (see :func:`_llama_style`)."""
    transformers = _transformers()
    config = _llama_style(transformers.Qwen3Config, head_dim=8)
    return _build(transformers.Qwen3ForCausalLM, config, seed)


def tiny_vit(seed: int = 0) -> nn.Module:
    """``ViTForImageClassification`` of 8x8 RGB images in 4 patches, 2 pre-norm blocks of 4
    heads of 8, an FFN of 48, 3 labels."""
    transformers = _transformers()
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        image_size=8, patch_size=4, num_labels=3,
    )  # fmt: skip
    return _build(transformers.ViTForImageClassification, config, seed)


def _decoder(config_class: Any, **extra: Any) -> Any:
    """2 blocks, 4 query heads of 8 sharing 2 key/value heads (``head_dim`` explicit), an FFN
    of 48, an LM head of its own unless ``extra`` ties it; tokens 0-2 are pad, bos and eos."""
    values = {
        "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
        **extra,
    }  # fmt: skip
    return config_class(**values)


def tiny_gemma(seed: int = 0) -> nn.Module:
    """``GemmaForCausalLM`` (Gemma 1): Llama's layout, norms of ``1 + weight``."""
    transformers = _transformers()
    config = _decoder(transformers.GemmaConfig, head_dim=8)
    return _build(transformers.GemmaForCausalLM, config, seed)


def tiny_granite(seed: int = 0) -> nn.Module:
    """``GraniteForCausalLM``: Llama's layout with embedding, residual, attention and logit
    multipliers."""
    transformers = _transformers()
    config = _decoder(
        transformers.GraniteConfig, embedding_multiplier=2.0, residual_multiplier=0.5,
        attention_multiplier=0.2, logits_scaling=4.0,
    )  # fmt: skip
    return _build(transformers.GraniteForCausalLM, config, seed)


SLIDING_WINDOW = 4
"""The Gemma models' sliding window: shorter than the test sequences, so it masks."""


def tiny_gemma2(seed: int = 0) -> nn.Module:
    """``Gemma2ForCausalLM``: a sliding then a global layer (window 4), attention and final
    logit soft-capping, the LM head tied to the embedding."""
    transformers = _transformers()
    config = _decoder(transformers.Gemma2Config, head_dim=8, sliding_window=SLIDING_WINDOW,
                      attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                      query_pre_attn_scalar=8, tie_word_embeddings=True)  # fmt: skip
    return _build(transformers.Gemma2ForCausalLM, config, seed)


def tiny_gemma3(seed: int = 0) -> nn.Module:
    """``Gemma3ForCausalLM`` (text): per-head q/k norms, a sliding then a global layer (window
    4, each with its own rotary base), soft-capping on, the LM head tied to the embedding."""
    transformers = _transformers()
    config = _decoder(transformers.Gemma3TextConfig, head_dim=8, sliding_window=SLIDING_WINDOW,
                      layer_types=["sliding_attention", "full_attention"],
                      attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                      query_pre_attn_scalar=8, tie_word_embeddings=True)  # fmt: skip
    return _build(transformers.Gemma3ForCausalLM, config, seed)


def tiny_phi3(seed: int = 0) -> nn.Module:
    """``Phi3ForCausalLM``: fused ``qkv_proj`` and ``gate_up_proj``, half of each head
    rotated."""
    transformers = _transformers()
    config = _decoder(transformers.Phi3Config, resid_pdrop=0.0, embd_pdrop=0.0,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                       "partial_rotary_factor": 0.5})  # fmt: skip
    return _build(transformers.Phi3ForCausalLM, config, seed)


def tiny_olmo2(seed: int = 0) -> nn.Module:
    """``Olmo2ForCausalLM``: norms after attention and the FFN, q/k norms over all heads."""
    transformers = _transformers()
    return _build(transformers.Olmo2ForCausalLM, _decoder(transformers.Olmo2Config), seed)


def tiny_gpt_neox(seed: int = 0, *, parallel: bool = True) -> nn.Module:
    """``GPTNeoXForCausalLM`` (Pythia's layout): 4 heads of 8 in an interleaved
    ``query_key_value``, a quarter of each head rotated, the parallel residual or not."""
    transformers = _transformers()
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, use_parallel_residual=parallel,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, hidden_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    return _build(transformers.GPTNeoXForCausalLM, config, seed)
