"""BERT-style blocks: BERT, RoBERTa (and the encoders that share their layout).

A block is ``attention.self`` (``query``/``key``/``value``), ``attention.output`` (``dense``, then
``LayerNorm`` of dense + residual), ``intermediate.dense`` and ``output`` (``dense``, then
``LayerNorm`` of dense + residual). A head is ``attention_head_size`` rows of query, key and
value (and their bias entries) and as many columns of ``attention.output.dense``; a channel is a
row of ``intermediate.dense`` and a column of ``output.dense``. The norms follow the residual
additions (post-norm), so a block whose parameters are zero is not the identity: whole layers
cannot be removed. The head width is derived from ``hidden_size // num_attention_heads``, so a
model with fewer heads is recorded per layer (see
:mod:`~tensorplay.ao.pruning.structured.shrinking.hf_config`).

Example:
    >>> import transformers
    >>> config = transformers.BertConfig(
    ...     vocab_size=16, hidden_size=16, num_hidden_layers=1, num_attention_heads=4,
    ...     intermediate_size=24)
    >>> block = transformers.BertModel(config).encoder.layer[0]
    >>> units = BERT.units("encoder.layer.0", block)
    >>> units.channel.size, units.head.size, BERT.widths(block)
    (24, 4, {'intermediate_size': 24, 'num_attention_heads': 4})
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from tensorplay.ao.pruning.structured.dependency.families.family import (
    BlockUnits,
    UnanalysableError,
    child,
    has_children,
    int_attribute,
    out_in,
    set_present,
    submodule,
    tensor_names,
)
from tensorplay.ao.pruning.structured.dependency.families.projections import (
    channel_group,
    output_slices,
    row_slices,
)
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup

__all__ = ["BERT", "BertFamily"]

_LINEARS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)
_SHARED = (
    "attention.output.dense.bias",
    "attention.output.LayerNorm.weight",
    "attention.output.LayerNorm.bias",
    "output.dense.bias",
    "output.LayerNorm.weight",
    "output.LayerNorm.bias",
)


class BertFamily:
    """BERT-style blocks (see the module docstring)."""

    name = "bert"
    models = "BERT, RoBERTa"
    submodules: tuple[str, ...] = _LINEARS

    def matches(self, block: nn.Module) -> bool:
        """The six Linears of the BERT layout."""
        return has_children(block, _LINEARS, nn.Linear)

    def units(self, prefix: str, block: nn.Module) -> BlockUnits:
        """The block's FFN channels and attention heads."""
        channel = channel_group(
            f"{prefix}.intermediate",
            {f"{prefix}.intermediate.dense": submodule(block, "intermediate.dense")},
            (f"{prefix}.output.dense", submodule(block, "output.dense")),
        )
        cross = [
            name.removeprefix(f"{prefix}.")
            for module in [child(block, "crossattention")]
            if module is not None
            for name in tensor_names(f"{prefix}.crossattention", module)
        ]
        return BlockUnits(channel, _heads(f"{prefix}.attention", block), (*_SHARED, *cross))

    def layer_refusal(self, block: nn.Module) -> str | None:
        """Always refused: a post-norm block is not the identity when its weights are zero."""
        return (
            "its LayerNorms follow the residual additions (post-norm), so a block whose "
            "parameters are zero is not the identity"
        )

    def sync(self, block: nn.Module) -> None:
        """``num_attention_heads`` and ``all_head_size`` of ``attention.self``."""
        attention = submodule(block, "attention.self")
        size = _head_size(attention)
        heads = out_in(submodule(block, "attention.self.query"))[0] // size
        set_present(attention, {"num_attention_heads": heads, "all_head_size": heads * size})

    def widths(self, block: nn.Module) -> dict[str, int]:
        """``intermediate_size`` and ``num_attention_heads``."""
        size = _head_size(submodule(block, "attention.self"))
        return {
            "intermediate_size": out_in(submodule(block, "intermediate.dense"))[0],
            "num_attention_heads": out_in(submodule(block, "attention.self.query"))[0] // size,
        }

    def unit_counts(self, widths: Mapping[str, int]) -> dict[str, int]:
        """Channels: ``intermediate_size``; heads: ``num_attention_heads``."""
        return {"channel": widths["intermediate_size"], "head": widths["num_attention_heads"]}


def _head_size(attention: nn.Module) -> int:
    return int_attribute(attention, "attention_head_size", "attention.self")


def _heads(name: str, block: nn.Module) -> UnitGroup:
    size = _head_size(submodule(block, "attention.self"))
    projections = {
        key: submodule(block, f"attention.self.{key}") for key in ("query", "key", "value")
    }
    output = submodule(block, "attention.output.dense")
    widths = {key: out_in(module)[0] for key, module in projections.items()}
    width = out_in(output)[1]
    if width % size or any(value != width for value in widths.values()):
        raise UnanalysableError(
            f"Expected the query, key and value of {name}.self and the inputs of "
            f"{name}.output.dense to hold the same whole heads of {size}, but got {widths} "
            f"and {width}."
        )
    slices = tuple(
        piece
        for key, module in projections.items()
        for piece in row_slices(f"{name}.self.{key}", module, size)
    )
    return UnitGroup(
        name, "head", width // size, slices + output_slices(f"{name}.output.dense", output, size)
    )


BERT = BertFamily()
"""The BERT family."""
