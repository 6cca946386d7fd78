"""The Hugging Face families the dependency analysis recognises, one module each.

* :mod:`~tensorplay.ao.pruning.dependency.families.llama`: Llama, Mistral, Qwen2, Qwen3;
* :mod:`~tensorplay.ao.pruning.dependency.families.gpt2`: GPT-2;
* :mod:`~tensorplay.ao.pruning.dependency.families.bert`: BERT, RoBERTa;
* :mod:`~tensorplay.ao.pruning.dependency.families.vit`: ViT, DeiT;
* :mod:`~tensorplay.ao.pruning.dependency.families.moe`: the mixtures of experts Qwen2-MoE,
  Qwen3-MoE, Mixtral, OLMoE.

A new family is one module implementing
:class:`~tensorplay.ao.pruning.dependency.families.family.Family` and its line in
:data:`FAMILIES`.

Example:
    >>> [family.name for family in FAMILIES]
    ['llama', 'gpt2', 'bert', 'vit', 'moe']
"""

from __future__ import annotations

from tensorplay.ao.pruning.dependency.families.bert import BERT
from tensorplay.ao.pruning.dependency.families.family import BlockUnits, Family, UnanalysableError
from tensorplay.ao.pruning.dependency.families.gpt2 import GPT2
from tensorplay.ao.pruning.dependency.families.llama import LLAMA
from tensorplay.ao.pruning.dependency.families.moe import MOE
from tensorplay.ao.pruning.dependency.families.vit import VIT

__all__ = ["FAMILIES", "BlockUnits", "Family", "UnanalysableError"]

FAMILIES: tuple[Family, ...] = (LLAMA, GPT2, BERT, VIT, MOE)
"""Every family, tried in this order on a model's blocks."""
