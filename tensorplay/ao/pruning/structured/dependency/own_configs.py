"""A Hugging Face model's config made its own before tensorplay writes to it.

Two models built from one config object share it (``teacher = LlamaForCausalLM(config)`` and
``student = LlamaForCausalLM(config)``), as every module inside one model that keeps a
``config`` attribute does. Recording a structured pruner's groups and shrinking write to the
config; written in place, the other model's config would describe a model it is not, and its
saved folder would no longer load. So before the first write, :func:`own_configs` gives every
module of the model that holds a config one deep copy of it, through the one owner of model
changes (:mod:`~tensorplay.ao.pruning.edits.changes`: a refusal puts the original back). The
modules of the model keep sharing one config among themselves, and a sub-config (a composite
model's ``text_config`` held by its language model) stays the very object its parent config
holds. A config copied once is not copied again.

Example:
    >>> import transformers
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16)
    >>> teacher = transformers.GPT2LMHeadModel(config)
    >>> student = transformers.GPT2LMHeadModel(config)
    >>> own_configs(student)
    >>> student.config is config, student.transformer.config is student.config
    (False, True)
    >>> student.config.n_layer = 0
    >>> teacher.config.n_layer
    1
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

from torch import nn

from tensorplay.ao.pruning.edits import changes

__all__ = ["own_configs"]

_OWNED: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
"""The copies made, by id (a Hugging Face config compares by value, so it is not hashable)."""


def own_configs(model: nn.Module) -> None:
    """Give the modules of ``model`` that hold a config (an object with ``to_dict``) a copy of
    it of their own, unless it is one this function made (see the module)."""
    memo: dict[int, Any] = {}  # one memo: configs nested in one another stay nested in the copies
    for module in model.modules():
        config = vars(module).get("config")
        if config is None or not hasattr(config, "to_dict") or _OWNED.get(id(config)) is config:
            continue
        copied = copy.deepcopy(config, memo)
        _OWNED[id(copied)] = copied
        changes.set_attribute(module, "config", copied)
