"""The Hugging Face families the dependency analysis recognises, one module each.

* :mod:`~tensorplay.ao.pruning.structured.dependency.families.llama`: Llama, Mistral, Qwen2, Qwen3;
* :mod:`~tensorplay.ao.pruning.structured.dependency.families.gemma`: Gemma 2, Gemma 3;
* :mod:`~tensorplay.ao.pruning.structured.dependency.families.olmo2`: OLMo 2 (no heads: its q/k
  norms span all heads);
* :mod:`~tensorplay.ao.pruning.structured.dependency.families.phi3`: Phi-3 (fused projections);
* :mod:`~tensorplay.ao.pruning.structured.dependency.families.gpt_neox`: GPT-NeoX, Pythia;
* :mod:`~tensorplay.ao.pruning.structured.dependency.families.gpt2`: GPT-2;
* :mod:`~tensorplay.ao.pruning.structured.dependency.families.bert`: BERT, RoBERTa;
* :mod:`~tensorplay.ao.pruning.structured.dependency.families.vit`: ViT, DeiT;
* :mod:`~tensorplay.ao.pruning.structured.dependency.families.moe`: the mixtures of experts
  Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE.

A new family is one module implementing
:class:`~tensorplay.ao.pruning.structured.dependency.families.family.Family` (or one table of
:class:`~tensorplay.ao.pruning.structured.dependency.families.gated_decoder.GatedDecoderFamily`
where its blocks differ from Llama's in their norms only) and its line in :data:`FAMILIES`. A block
matches one family at most: each checks the exact children its blocks hold.

Example:
    >>> [family.name for family in FAMILIES]
    ['llama', 'gemma2', 'olmo2', 'phi3', 'gpt_neox', 'gpt2', 'bert', 'vit', 'moe']
"""

from __future__ import annotations

from tensorplay.ao.pruning.structured.dependency.families.bert import BERT
from tensorplay.ao.pruning.structured.dependency.families.family import (
    BlockUnits,
    Family,
    UnanalysableError,
)
from tensorplay.ao.pruning.structured.dependency.families.gemma import GEMMA
from tensorplay.ao.pruning.structured.dependency.families.gpt2 import GPT2
from tensorplay.ao.pruning.structured.dependency.families.gpt_neox import GPT_NEOX
from tensorplay.ao.pruning.structured.dependency.families.llama import LLAMA
from tensorplay.ao.pruning.structured.dependency.families.moe import MOE
from tensorplay.ao.pruning.structured.dependency.families.olmo2 import OLMO2
from tensorplay.ao.pruning.structured.dependency.families.phi3 import PHI3
from tensorplay.ao.pruning.structured.dependency.families.vit import VIT

__all__ = ["FAMILIES", "BlockUnits", "Family", "UnanalysableError"]

FAMILIES: tuple[Family, ...] = (LLAMA, GEMMA, OLMO2, PHI3, GPT_NEOX, GPT2, BERT, VIT, MOE)
"""Every family, tried in this order on a model's blocks."""
