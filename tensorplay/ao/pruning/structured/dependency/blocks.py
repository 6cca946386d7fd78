"""Finding a Hugging Face model's residual blocks wherever the user put the model.

The blocks are the entries of an ``nn.ModuleList`` that all match one
:data:`~tensorplay.ao.pruning.structured.dependency.families.FAMILIES` entry (``model.layers`` of a
Llama, ``transformer.h`` of GPT-2, ``bert.encoder.layer``...). The model may be the module given or
sit inside a wrapper (a ``LightningModule`` holding it as ``model``): names stay the wrapper's
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

from tensorplay.ao.pruning.structured.dependency.families import FAMILIES, Family, UnanalysableError
from tensorplay.ao.pruning.structured.dependency.families.family import child, join

__all__ = ["FoundBlocks", "find_blocks", "hf_config_of", "looks_like_hf", "unknown_family"]


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


def unknown_family(model: nn.Module) -> str:
    """Why ``model`` (a Hugging Face model whose blocks match no family) cannot be analysed,
    naming its block class and the submodules no family knows (or, where every submodule is
    one some family has, what the closest family needs that the block lacks).

    The blocks are taken to be the longest ``nn.ModuleList`` of one class of module.

    Example:
        >>> from torch import nn
        >>> block = nn.Module()
        >>> block.self_attention = nn.Module()
        >>> block.self_attention.query_key_value = nn.Linear(4, 12)
        >>> model = nn.Module()
        >>> model.h = nn.ModuleList([block])
        >>> why = unknown_family(model)
        >>> print(why[:why.index(" (known")])
        Module is a Hugging Face model of no known family: its blocks 'h' (Module) hold
        'self_attention.query_key_value', which no known family has
    """
    known = "; ".join(f"{family.name}: {family.models}" for family in FAMILIES)
    where = f"{type(model).__name__} is a Hugging Face model of no known family"
    lists = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and len(module) and len({type(m) for m in module}) == 1
    ]
    if not lists:
        return f"{where}: it holds no list of blocks (known: {known})"
    name, blocks = max(lists, key=lambda item: len(item[1]))
    block = blocks[0]
    holders = [path for path, sub in block.named_modules() if path and sub._parameters]
    familiar = {path for family in FAMILIES for path in family.submodules}
    strange = [path for path in holders if path not in familiar]
    what = f"its blocks {name!r} ({type(block).__name__})"
    if strange:
        listed = ", ".join(repr(path) for path in strange)
        return f"{where}: {what} hold {listed}, which no known family has (known: {known})"
    closest = max(FAMILIES, key=lambda f: sum(child(block, p) is not None for p in f.submodules))
    lacking = [path for path in closest.submodules if child(block, path) is None]
    return (
        f"{where}: {what} are laid out like no family's; the closest, {closest.name} "
        f"({closest.models}), also has {', '.join(repr(p) for p in lacking) or 'other children'}"
    )


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
