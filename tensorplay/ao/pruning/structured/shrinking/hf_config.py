"""A shrunk Hugging Face model's config, and loading a saved one back.

After :func:`~tensorplay.ao.pruning.shrink` the config must describe the model, so that a saved
copy loads:

* the number of blocks (``num_hidden_layers``/``n_layer``) and the lists of one entry per layer
  (:data:`PER_LAYER_KEYS`: ``layer_types`` with Gemma's sliding and global layers, SmolLM3's
  ``no_rope_layers``...) follow removed layers;
* **uniform widths** (every layer keeps the same number of channels and heads) are written to the
  config's own keys (``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``,
  ``head_dim``; ``n_inner``/``n_head`` for GPT-2) when the family's code builds exactly the
  shrunk shapes from them: this is checked by building the model from the new config on the
  meta device, so ``save_pretrained`` gives a folder plain ``from_pretrained`` loads. ``head_dim``
  is written even where the config class has no such key (Phi-3, OLMo 2): their code reads it
  when present and would otherwise derive it from the new head count;
* otherwise (widths that differ per layer, or shapes the config cannot express: GPT-2, BERT and
  GPT-NeoX derive the head width from ``hidden_size // num_attention_heads``, so fewer heads
  change it; Llama requires ``hidden_size`` divisible by the number of heads) the widths of each
  layer are recorded under the config key ``tensorplay_layer_widths`` and the config's own keys
  keep values its model code builds with (those before shrinking). Plain ``from_pretrained``
  then stops with a size-mismatch error, never a wrong model; :func:`load_shrunk` loads it.

Transformers' own ``per_layer_config`` is not used: a Llama whose config has it refuses to build
and its ``config.intermediate_size`` raises.

Example:
    >>> import tempfile
    >>> import torch
    >>> import transformers
    >>> from tensorplay.ao.pruning import DependencyGraph, load_shrunk, shrink
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=4, vocab_size=16,
    ...                                   bos_token_id=0, eos_token_id=0)
    >>> model = transformers.GPT2LMHeadModel(config).eval()
    >>> heads = DependencyGraph(model).groups("head")[0]  # zero the first block's second head
    >>> with torch.no_grad():
    ...     for piece in heads.slices:
    ...         model.get_parameter(piece.parameter)[piece.index(1, piece.dim + 1)] = 0
    >>> shrink(model).config  # GPT-2's config cannot say "3 heads of 4"
    'per_layer'
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     model.save_pretrained(directory)
    ...     loaded = load_shrunk(transformers.AutoModelForCausalLM, directory)
    >>> tokens = torch.tensor([[1, 2, 3]])
    >>> torch.allclose(loaded(tokens).logits, model(tokens).logits, atol=1e-6)
    True
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from tensorplay.ao.pruning.structured.dependency.blocks import FoundBlocks, find_blocks
from tensorplay.ao.pruning.structured.dependency.families import UnanalysableError
from tensorplay.ao.pruning.structured.dependency.families.family import child, set_present
from tensorplay.ao.pruning.structured.dependency.hidden_width import hidden_width
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup, shapes_of
from tensorplay.ao.pruning.structured.shrinking.removal import apply_cuts, plan_cuts
from tensorplay.ao.pruning.structured.shrinking.shrink_report import ConfigUpdate

__all__ = [
    "PER_LAYER_KEYS",
    "WIDTHS_KEY",
    "check_config",
    "load_shrunk",
    "rebuild_widths",
    "update_config",
]

WIDTHS_KEY = "tensorplay_layer_widths"
"""The config key holding each layer's widths (a list of ``{config key: width}``)."""
PER_LAYER_KEYS = ("layer_types", "mlp_layer_types", "no_rope_layers", "sliding_windows",
                  "layers_block_type", "kv_sharing_modes", "indexer_types")  # fmt: skip
"""The config keys transformers' model code indexes by layer (``config.layer_types[layer_idx]``):
lists of one entry per layer, which keep the entries of the layers that stay."""


def check_config(found: FoundBlocks) -> None:
    """Refuse a config this module cannot keep right: one using transformers'
    ``per_layer_config`` (its layers are described by its own overrides).

    Raises:
        ValueError: Naming the model.
    """
    if getattr(found.config, "is_heterogeneous", False):
        raise ValueError(
            f"Expected the config of {type(found.owner).__name__} to describe every layer alike, "
            "but it uses per_layer_config: shrinking such a model is not supported."
        )


def update_config(
    found: FoundBlocks, kept_layers: Sequence[int], hidden: int | None = None
) -> ConfigUpdate:
    """Describe the shrunk blocks of ``found`` in its owner's config (see the module
    docstring); ``kept_layers`` are the indices, before shrinking, of the blocks that stayed;
    ``hidden`` the residual stream's width where hidden channels were removed (written as
    ``hidden_size``, with the attention's ``head_dim``, which the family would otherwise derive
    from it).

    Returns:
        ``"uniform"`` or ``"per_layer"``.
    """
    config = found.config
    for key in PER_LAYER_KEYS:
        values = getattr(config, key, None)
        if isinstance(values, list) and len(values) == config.num_hidden_layers:
            setattr(config, key, [values[index] for index in kept_layers])
    config.num_hidden_layers = len(found.blocks)
    widths = [{**found.family.widths(block), **_stream(block, hidden)} for block in found.blocks]
    if all(layer == widths[0] for layer in widths) and _rebuilds(found.owner, widths[0]):
        for key, value in widths[0].items():
            setattr(config, key, value)
        set_present(found.owner, widths[0])  # its copies: a MoE model's num_experts (aux loss)
        if hasattr(config, WIDTHS_KEY):
            delattr(config, WIDTHS_KEY)
        return "uniform"
    setattr(config, WIDTHS_KEY, widths)
    return "per_layer"


def _stream(block: nn.Module, hidden: int | None) -> dict[str, int]:
    """``hidden_size`` (and ``head_dim``, read from the attention) where the stream shrank."""
    if hidden is None:
        return {}
    widths = {"hidden_size": hidden}
    head_dim = getattr(child(block, "self_attn"), "head_dim", None)
    if isinstance(head_dim, int):
        widths["head_dim"] = head_dim
    return widths


def _rebuilds(owner: nn.Module, widths: Mapping[str, int]) -> bool:
    """Whether the owner's class builds the owner's exact shapes from its config with
    ``widths``: what plain ``from_pretrained`` of a saved copy would do."""
    config: Any = owner.config
    aliases = getattr(config, "attribute_map", {})  # Mixtral's num_experts: num_local_experts
    values = {**config.to_dict(), **{aliases.get(key, key): value for key, value in widths.items()}}
    values.pop(WIDTHS_KEY, None)
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            rebuilt = type(owner)(type(config).from_dict(values))
    except Exception:  # whatever the family's own code refuses, from_pretrained refuses too
        return False
    return shapes_of(rebuilt) == shapes_of(owner)


def rebuild_widths(model: nn.Module, widths: Sequence[Mapping[str, int]]) -> None:
    """Shrink a freshly built ``model`` to the recorded per-layer ``widths``, keeping each
    group's first units (the weights loaded afterwards fill them).

    Raises:
        ValueError: The model has no blocks of a known family, or the record does not fit it
            (another number of layers, widths larger than the model's).
    """
    found = find_blocks(model)
    if found is None or len(found.blocks) != len(widths):
        raise ValueError(
            f"Expected {type(model).__name__} to have {len(widths)} blocks of a known family, as "
            f"its config's {WIDTHS_KEY} records, but found "
            f"{'none' if found is None else len(found.blocks)}."
        )
    keeps: list[tuple[UnitGroup, torch.Tensor]] = []
    hidden = widths[0].get("hidden_size") if widths else None
    if hidden is not None:  # the stream's width first: per-layer widths do not depend on it
        group = hidden_width(model).group
        if not 1 <= hidden <= group.size:
            raise ValueError(
                f"Expected {WIDTHS_KEY} to give the residual stream between 1 and {group.size} "
                f"channels, but it gives {hidden}."
            )
        keeps.append((group, torch.arange(group.size, device="cpu") < hidden))
    for name, block, recorded in zip(found.block_names(), found.blocks, widths, strict=True):
        units = found.family.units(name, block)
        counts = found.family.unit_counts(recorded)
        for group in units.groups():
            # A routed expert's channels have their own width (the config's key for the experts').
            kind = "expert_channel" if group in units.expert_channels else group.kind
            if kind not in counts:
                continue  # units the family lays out but never removes (heads under a shared norm)
            count = counts[kind]
            if not group.min_kept <= count <= group.size:
                raise ValueError(
                    f"Expected {WIDTHS_KEY} to give {group.name!r} between {group.min_kept} and "
                    f"{group.size} "
                    f"{group.kind} units, but it gives {count}."
                )
            keeps.append((group, torch.arange(group.size, device="cpu") < count))
    apply_cuts(plan_cuts(model, [(group, keep) for group, keep in keeps if not keep.all()]))
    for index, (block, recorded) in enumerate(zip(found.blocks, widths, strict=True)):
        found.family.sync(block)
        rebuilt = found.family.widths(block)
        # The keys recorded: a record written before a family reported a width does not hold it.
        rebuilt.update(_stream(block, hidden))
        if any(rebuilt.get(key) != value for key, value in recorded.items()):
            raise ValueError(
                f"Expected block {index} to be rebuilt to {dict(recorded)}, but it has {rebuilt}."
            )


def load_shrunk(model_class: Any, directory: str | os.PathLike[str], **kwargs: Any) -> Any:
    """Load a shrunk model saved with ``save_pretrained``, whatever its widths per layer.

    Works like ``model_class.from_pretrained(directory, **kwargs)`` (the same loading: dtypes,
    devices, tied weights) but builds each layer at the widths the config records under
    ``tensorplay_layer_widths`` first; a folder without that key loads as plain
    ``from_pretrained`` loads it.

    Args:
        model_class: A Hugging Face model class (``LlamaForCausalLM``) or auto class
            (``AutoModelForCausalLM``); tensorplay does not import ``transformers`` itself.
        directory: The folder ``save_pretrained`` wrote.
        **kwargs: Passed to ``from_pretrained``.

    Returns:
        The model, an instance of the concrete model class.

    Raises:
        ValueError: The record does not fit the model the config builds.

    Example:
        See :mod:`~tensorplay.ao.pruning.structured.shrinking.hf_config`.
    """
    concrete = _concrete_class(model_class, directory)

    def __init__(self: Any, config: Any, *args: Any, **init_kwargs: Any) -> None:
        concrete.__init__(self, config, *args, **init_kwargs)
        widths = getattr(config, WIDTHS_KEY, None)
        if widths is not None:
            rebuild_widths(self, widths)

    # A subclass whose constructor shrinks: from_pretrained builds the model (on the meta
    # device, without initialising weights) and loads the saved tensors into the shrunk shapes.
    shrunk: Any = type(
        concrete.__name__,
        (concrete,),
        {"__init__": __init__, "__module__": concrete.__module__},
    )
    model = shrunk.from_pretrained(directory, **kwargs)
    model.__class__ = concrete
    return model


def _concrete_class(model_class: Any, directory: str | os.PathLike[str]) -> Any:
    """The model class itself, or the one an auto class maps the saved config to."""
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is None:
        return model_class
    # An auto class: read the config with the auto config of the same package (the class's
    # own, already imported), and map its type as the auto class's from_pretrained does.
    package = sys.modules[model_class.__module__.partition(".")[0]]
    config = package.AutoConfig.from_pretrained(directory)
    try:
        return mapping[type(config)]
    except KeyError:
        raise UnanalysableError(
            f"Expected {model_class.__name__} to have a model class for the saved config "
            f"({type(config).__name__}), but it has none."
        ) from None
