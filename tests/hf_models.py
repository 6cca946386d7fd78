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


def tiny_gpt2(seed: int = 0) -> nn.Module:
    """``GPT2LMHeadModel``: 2 blocks of Conv1D projections, LM head tied to the embedding."""
    transformers = _transformers()
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.GPT2LMHeadModel(config).eval()


def tiny_bert(seed: int = 0) -> nn.Module:
    """``BertForMaskedLM``: Linear layers, the decoder tied to the word embeddings."""
    transformers = _transformers()
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.BertForMaskedLM(config).eval()


def tiny_llama(seed: int = 0) -> nn.Module:
    """``LlamaForCausalLM``: 2 blocks, grouped-query attention (4 query heads over 2 key/value
    heads), SwiGLU MLP, an output head that is not tied to the embedding."""
    transformers = _transformers()
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.LlamaForCausalLM(config).eval()
