"""Every Hugging Face architecture the dependency analysis knows, as one tiny model each.

:data:`FAMILY_MODELS` is the one list: the family tests build each entry and check each kind of
unit on it (masked = shrunk = reloaded), and the docs' table of families
(``docs/_generated/families.md``) is generated from it. A new family is a builder in
:mod:`tests.hf_models` and its line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from torch import nn

from tests.hf_models import (
    tiny_bert,
    tiny_gemma,
    tiny_gemma2,
    tiny_gemma3,
    tiny_gpt2,
    tiny_gpt_neox,
    tiny_granite,
    tiny_llama,
    tiny_mistral,
    tiny_olmo2,
    tiny_phi3,
    tiny_qwen2,
    tiny_qwen3,
    tiny_roberta,
    tiny_vit,
)
from tests.moe_models import tiny_mixtral, tiny_olmoe, tiny_qwen2_moe, tiny_qwen3_moe


@dataclass(frozen=True)
class FamilyModel:
    """One architecture.

    Args:
        title: Its name in the docs' table.
        build: A tiny model of it (random init, evaluation mode, no dropout).
        auto: The transformers auto class that loads a saved copy.
        generates: Whether it is a decoder whose cached greedy generation is compared.
    """

    title: str
    build: Callable[[], nn.Module]
    auto: str
    generates: bool = True


FAMILY_MODELS: dict[str, FamilyModel] = {
    "llama": FamilyModel("Llama", tiny_llama, "AutoModelForCausalLM"),
    "mistral": FamilyModel("Mistral", tiny_mistral, "AutoModelForCausalLM"),
    "qwen2": FamilyModel("Qwen2", tiny_qwen2, "AutoModelForCausalLM"),
    "qwen3": FamilyModel("Qwen3", tiny_qwen3, "AutoModelForCausalLM"),
    "gemma": FamilyModel("Gemma", tiny_gemma, "AutoModelForCausalLM"),
    "granite": FamilyModel("Granite", tiny_granite, "AutoModelForCausalLM"),
    "gemma2": FamilyModel("Gemma 2", tiny_gemma2, "AutoModelForCausalLM"),
    "gemma3": FamilyModel("Gemma 3 (text)", tiny_gemma3, "AutoModelForCausalLM"),
    "phi3": FamilyModel("Phi-3", tiny_phi3, "AutoModelForCausalLM"),
    "olmo2": FamilyModel("OLMo 2", tiny_olmo2, "AutoModelForCausalLM"),
    "gpt_neox": FamilyModel("GPT-NeoX, Pythia", tiny_gpt_neox, "AutoModelForCausalLM"),
    "gpt_neox-sequential": FamilyModel(
        "GPT-NeoX without the parallel residual",
        partial(tiny_gpt_neox, parallel=False),
        "AutoModelForCausalLM",
    ),
    "gpt2": FamilyModel("GPT-2", partial(tiny_gpt2, n_head=4, dropout=0.0), "AutoModelForCausalLM"),
    "bert": FamilyModel("BERT", partial(tiny_bert, dropout=0.0), "AutoModelForMaskedLM", False),
    "roberta": FamilyModel("RoBERTa", tiny_roberta, "AutoModelForMaskedLM", False),
    "vit": FamilyModel("ViT", tiny_vit, "AutoModelForImageClassification", False),
    "qwen2_moe": FamilyModel("Qwen2-MoE", tiny_qwen2_moe, "AutoModelForCausalLM"),
    "qwen3_moe": FamilyModel("Qwen3-MoE", tiny_qwen3_moe, "AutoModelForCausalLM"),
    "mixtral": FamilyModel("Mixtral", tiny_mixtral, "AutoModelForCausalLM"),
    "olmoe": FamilyModel("OLMoE", tiny_olmoe, "AutoModelForCausalLM"),
}
"""Every architecture, by a short id (the tests' parameter ids)."""
