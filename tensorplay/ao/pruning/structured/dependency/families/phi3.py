"""Phi-3 blocks: a fused ``qkv_proj`` and a fused ``gate_up_proj``.

A block is ``input_layernorm -> self_attn -> +residual -> post_attention_layernorm -> mlp ->
+residual`` (pre-norm, so a block whose parameters are zero is the identity). ``self_attn.qkv_proj``
computes the queries, then the keys, then the values: ``num_heads * head_dim`` rows, then
``num_key_value_heads * head_dim`` twice. Under grouped-query attention a head unit is key/value
head ``g`` with its ``G`` query heads: ``G * head_dim`` rows of the query section, ``head_dim``
rows of the key and of the value sections, ``G * head_dim`` columns of ``o_proj``.
``mlp.gate_up_proj`` computes the gate rows, then the up rows (``chunk(2, dim=-1)``): a channel
is row ``c`` and row ``intermediate_size + c`` of it and column ``c`` of ``down_proj``.

Phi-3's attention splits ``qkv_proj`` at ``config.num_attention_heads * head_dim``, read from the
config all layers share: a layer that keeps another number of heads than the config says reads
its own (:mod:`~tensorplay.ao.pruning.structured.dependency.families.layer_config`). The config does
not hold ``head_dim`` (it derives it from ``hidden_size // num_attention_heads``), so a shrunk
model's config gets it explicitly.

Example:
    >>> import transformers
    >>> config = transformers.Phi3Config(
    ...     vocab_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
    ...     num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    >>> block = transformers.Phi3ForCausalLM(config).model.layers[0]
    >>> units = PHI3.units("model.layers.0", block)
    >>> [(s.parameter.split(".", 3)[-1], s.offset, s.width) for s in units.head.slices]
    [('self_attn.qkv_proj.weight', 0, 8), ('self_attn.qkv_proj.weight', 16, 4),
     ('self_attn.qkv_proj.weight', 24, 4), ('self_attn.o_proj.weight', 0, 8)]
    >>> [(s.parameter.split(".", 3)[-1], s.offset) for s in units.channel.slices]
    [('mlp.gate_up_proj.weight', 0), ('mlp.gate_up_proj.weight', 24), ('mlp.down_proj.weight', 0)]
    >>> PHI3.widths(block)
    {'intermediate_size': 24, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': 4}
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from tensorplay.ao.pruning.structured.dependency.families.family import (
    BlockUnits,
    UnanalysableError,
    int_attribute,
    join,
    laid_out,
    out_in,
    set_present,
    submodule,
)
from tensorplay.ao.pruning.structured.dependency.families.layer_config import layer_config
from tensorplay.ao.pruning.structured.dependency.families.projections import (
    HeadLayout,
    Rows,
    decoder_counts,
    decoder_widths,
    projection_group,
)
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup

__all__ = ["PHI3", "Phi3Family"]

_NORMS = ("input_layernorm", "post_attention_layernorm")
_SHARED = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.bias",
           "mlp.down_proj.bias")  # fmt: skip


class Phi3Family:
    """Phi-3 blocks (see the module docstring)."""

    name = "phi3"
    models = "Phi-3"
    submodules: tuple[str, ...] = (
        "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj", *_NORMS,
    )  # fmt: skip

    def matches(self, block: nn.Module) -> bool:
        """The four fused and output Linears and exactly the two norms beside them."""
        return laid_out(block, self.submodules[:4], ("self_attn", "mlp", *_NORMS))

    def units(self, prefix: str, block: nn.Module) -> BlockUnits:
        """The block's FFN channels and key/value-group heads."""
        return BlockUnits(_channels(join(prefix, "mlp"), block), _heads(prefix, block), _SHARED)

    def layer_refusal(self, block: nn.Module) -> str | None:
        """None: a pre-norm block whose projections are zero adds zero to the residual."""
        return None

    def sync(self, block: nn.Module) -> None:
        """The key/value head counts of ``self_attn``, and the query heads its config view
        answers where they differ from the shared config's."""
        attention = submodule(block, "self_attn")
        layout = _layout("self_attn", block)
        set_present(
            attention,
            {"num_key_value_heads": layout.key_value, "num_key_value_groups": layout.group},
        )
        config = getattr(attention, "config", None)
        if config is not None:
            attention.config = layer_config(config, num_attention_heads=layout.query)

    def widths(self, block: nn.Module) -> dict[str, int]:
        """``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``,
        ``head_dim``."""
        return decoder_widths(
            out_in(submodule(block, "mlp.down_proj"))[1], _layout("self_attn", block)
        )

    def unit_counts(self, widths: Mapping[str, int]) -> dict[str, int]:
        """Channels: ``intermediate_size``; heads: ``num_key_value_heads``."""
        return decoder_counts(widths)


def _channels(name: str, block: nn.Module) -> UnitGroup:
    fused, output = submodule(block, "mlp.gate_up_proj"), submodule(block, "mlp.down_proj")
    size = out_in(output)[1]
    if out_in(fused)[0] != 2 * size:
        raise UnanalysableError(
            f"Expected {join(name, 'gate_up_proj')!r} to hold gate and up rows for each of the "
            f"{size} inputs of {join(name, 'down_proj')!r}, but it has {out_in(fused)[0]} outputs."
        )
    fused_name = join(name, "gate_up_proj")
    rows = [Rows(fused_name, fused, 1, offset) for offset in (0, size)]
    return projection_group(name, "channel", size, rows, Rows(join(name, "down_proj"), output, 1))


def _layout(name: str, block: nn.Module) -> HeadLayout:
    """The heads, from the shapes: queries from ``o_proj``'s inputs, keys and values from the
    rest of ``qkv_proj``'s outputs."""
    head_dim = int_attribute(submodule(block, "self_attn"), "head_dim", name)
    fused = out_in(submodule(block, "self_attn.qkv_proj"))[0]
    query = out_in(submodule(block, "self_attn.o_proj"))[1]
    key_value = (fused - query) // 2
    if query % head_dim or key_value % head_dim or fused != query + 2 * key_value or not key_value:
        raise UnanalysableError(
            f"Expected {name}.qkv_proj to hold the {query} query rows of {name}.o_proj's inputs "
            f"and as many key as value rows, in whole heads of head_dim {head_dim}, but it has "
            f"{fused} outputs."
        )
    layout = HeadLayout(query // head_dim, key_value // head_dim, head_dim)
    if layout.query % layout.key_value:
        raise UnanalysableError(
            f"Expected the {layout.query} query heads of {name!r} to share its "
            f"{layout.key_value} key/value heads evenly, but they do not."
        )
    return layout


def _heads(prefix: str, block: nn.Module) -> UnitGroup:
    name = join(prefix, "self_attn")
    layout = _layout(name, block)
    fused, output = submodule(block, "self_attn.qkv_proj"), submodule(block, "self_attn.o_proj")
    query_width, width = layout.group * layout.head_dim, layout.head_dim
    keys = layout.query * width
    fused_name = join(name, "qkv_proj")
    rows = [
        Rows(fused_name, fused, query_width),
        Rows(fused_name, fused, width, keys),
        Rows(fused_name, fused, width, keys + layout.key_value * width),
    ]
    output_rows = Rows(join(name, "o_proj"), output, query_width)
    return projection_group(name, "head", layout.key_value, rows, output_rows)


PHI3 = Phi3Family()
"""The Phi-3 family."""
