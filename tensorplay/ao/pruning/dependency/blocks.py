"""Finding a Hugging Face model's residual blocks wherever the user put the model.

The blocks are the entries of an ``nn.ModuleList`` that all match one
:data:`~tensorplay.ao.pruning.dependency.families.FAMILIES` entry (``model.layers`` of a Llama,
``transformer.h`` of GPT-2, ``bert.encoder.layer``...). The model may be the module given or sit
inside a wrapper (a ``LightningModule`` holding it as ``model``): names stay the wrapper's
qualified names. The model that owns the blocks is the outermost module above them holding a
``config`` (duck-typed: an object with ``to_dict``), the one whose config a shrunk model updates.

Example:
    >>> import transformers
    >>> from torch import nn
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=16,
    ...                                   bos_token_id=0, eos_token_id=0)
    >>> wrapper = nn.Module()
    >>> wrapper.model = transformers.GPT2LMHeadModel(config)
    >>> found = find_blocks(wrapper)
    >>> found.family.name, found.name, found.owner_name, found.block_names()
    ('gpt2', 'model.transformer.h', 'model', ['model.transformer.h.0', 'model.transformer.h.1'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from tensorplay.ao.pruning.dependency.families import FAMILIES, Family, UnanalysableError
from tensorplay.ao.pruning.dependency.families.family import join

__all__ = ["FoundBlocks", "find_blocks", "hf_config_of", "looks_like_hf"]


@dataclass(frozen=True)
class FoundBlocks:
    """A model's residual blocks and the family they belong to.

    Args:
        family: The family every block matches.
        name: The qualified name of the ``nn.ModuleList`` holding the blocks.
        blocks: That list.
        owner_name: The qualified name of the model holding the config (``""``: the model
            itself), or of the list's parent where no module above it holds a config.
        owner: That module.
    """

    family: Family
    name: str
    blocks: nn.ModuleList
    owner_name: str
    owner: nn.Module

    def block_names(self) -> list[str]:
        """The blocks' qualified names, in order."""
        return [join(self.name, str(index)) for index in range(len(self.blocks))]

    @property
    def config(self) -> Any:
        """The owner's config (a Hugging Face ``PretrainedConfig``), or ``None``."""
        return hf_config_of(self.owner)


def hf_config_of(module: nn.Module) -> Any:
    """``module.config`` if it looks like a Hugging Face config (has ``to_dict``), else ``None``.

    Example:
        >>> hf_config_of(nn.Linear(2, 2)) is None
        True
    """
    config = getattr(module, "config", None)
    return config if callable(getattr(config, "to_dict", None)) else None


def looks_like_hf(model: nn.Module) -> bool:
    """Whether some module of ``model`` holds a Hugging Face config (one with a ``model_type``).

    Example:
        >>> looks_like_hf(nn.Linear(2, 2))
        False
    """
    return any(
        getattr(hf_config_of(module), "model_type", None) is not None for module in model.modules()
    )


def find_blocks(model: nn.Module) -> FoundBlocks | None:
    """The blocks of the one Hugging Face model in ``model``, or ``None`` if there is none.

    Raises:
        UnanalysableError: Two block lists (two models: pass the one to prune), or a list whose
            first block matches a family and another does not, naming them.
    """
    found: list[FoundBlocks] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or not len(module):
            continue
        if any(name.startswith(f"{other.name}.") for other in found):
            continue  # a list inside a block already found
        family = _family_of(name, module)
        if family is not None:
            owner_name, owner = _owner(model, name)
            found.append(FoundBlocks(family, name, module, owner_name, owner))
    if len(found) > 1:
        lists = ", ".join(f"{item.name!r} ({item.family.name})" for item in found)
        raise UnanalysableError(
            f"Expected one Hugging Face model in {type(model).__name__}, but found blocks at "
            f"{lists}: analyse the model to prune on its own."
        )
    return found[0] if found else None


def _family_of(name: str, blocks: nn.ModuleList) -> Family | None:
    for family in FAMILIES:
        if not family.matches(blocks[0]):
            continue
        for index, block in enumerate(blocks):
            if not family.matches(block):
                raise UnanalysableError(
                    f"Expected every block of {name!r} to be a {family.name} block like the "
                    f"first, but {join(name, str(index))!r} ({type(block).__name__}) is not."
                )
        return family
    return None


def _owner(model: nn.Module, list_name: str) -> tuple[str, nn.Module]:
    """The outermost module above the list holding a config, else the list's parent."""
    parts = list_name.split(".")
    for depth in range(len(parts)):
        prefix = ".".join(parts[:depth])
        module = model.get_submodule(prefix)
        if hf_config_of(module) is not None:
            return prefix, module
    parent = ".".join(parts[:-1])
    return parent, model.get_submodule(parent)
