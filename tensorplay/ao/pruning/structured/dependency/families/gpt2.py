"""GPT-2 blocks: ``Conv1D`` projections (weights stored ``(in, out)``) and a fused ``c_attn``.

A block is ``ln_1 -> attn -> +residual -> ln_2 -> mlp -> +residual`` (pre-norm). ``attn.c_attn``
computes queries, keys and values at once: its outputs are three sections of ``split_size``
(``num_heads * head_dim``), so head ``h`` is ``head_dim`` columns at offset ``h * head_dim`` of
each section, with the matching bias entries, and ``head_dim`` rows of ``attn.c_proj``. An FFN
channel is a column of ``mlp.c_fc`` (and its bias entry) and a row of ``mlp.c_proj``. A
cross-attention (``add_cross_attention``) stays whole. GPT-2 derives ``head_dim`` from
``n_embd // n_head``, so a model with fewer heads cannot be described by its config: its heads
are recorded per layer (see :mod:`~tensorplay.ao.pruning.structured.shrinking.hf_config`).

Example:
    >>> import transformers
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=4, vocab_size=16,
    ...                                   bos_token_id=0, eos_token_id=0)
    >>> block = transformers.GPT2LMHeadModel(config).transformer.h[0]
    >>> units = GPT2.units("transformer.h.0", block)
    >>> units.head.size, [(s.parameter, s.dim, s.offset) for s in units.head.slices][:3]
    (4, [('transformer.h.0.attn.c_attn.weight', 1, 0), ('transformer.h.0.attn.c_attn.bias', 0, 0),
         ('transformer.h.0.attn.c_attn.weight', 1, 16)])
    >>> GPT2.widths(block)
    {'n_inner': 64, 'n_head': 4}
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from tensorplay.ao.pruning.structured.dependency.families.family import (
    BlockUnits,
    UnanalysableError,
    child,
    int_attribute,
    is_conv1d,
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

__all__ = ["GPT2", "Gpt2Family"]

_LAYERS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
_SHARED = ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_proj.bias",
           "mlp.c_proj.bias")  # fmt: skip


class Gpt2Family:
    """GPT-2 blocks (see the module docstring)."""

    name = "gpt2"
    models = "GPT-2"
    submodules: tuple[str, ...] = (*_LAYERS, "ln_1", "ln_2")

    def matches(self, block: nn.Module) -> bool:
        """``attn`` with ``c_attn``/``c_proj`` and ``mlp`` with ``c_fc``/``c_proj``, all
        ``Conv1D``, and the norms ``ln_1``/``ln_2``."""
        return all(is_conv1d(child(block, path)) for path in _LAYERS) and all(
            child(block, norm) is not None for norm in ("ln_1", "ln_2")
        )

    def units(self, prefix: str, block: nn.Module) -> BlockUnits:
        """The block's FFN channels and attention heads."""
        channel = channel_group(
            f"{prefix}.mlp",
            {f"{prefix}.mlp.c_fc": submodule(block, "mlp.c_fc")},
            (f"{prefix}.mlp.c_proj", submodule(block, "mlp.c_proj")),
        )
        cross = [
            name.removeprefix(f"{prefix}.")
            for path in ("crossattention", "ln_cross_attn")
            if (module := child(block, path)) is not None
            for name in tensor_names(f"{prefix}.{path}", module)
        ]
        return BlockUnits(channel, _heads(f"{prefix}.attn", block), (*_SHARED, *cross))

    def layer_refusal(self, block: nn.Module) -> str | None:
        """Refused where attention is scaled by the block's index: the blocks after a removed
        one would be scaled differently once the model is rebuilt from its config."""
        if getattr(child(block, "attn"), "scale_attn_by_inverse_layer_idx", False):
            return (
                "its attention is scaled by the block's index (scale_attn_by_inverse_layer_idx), "
                "so the blocks after a removed one would compute differently once rebuilt"
            )
        return None

    def sync(self, block: nn.Module) -> None:
        """``num_heads`` and ``split_size`` of ``attn`` from ``c_proj``'s inputs."""
        attention = submodule(block, "attn")
        head_dim = int_attribute(attention, "head_dim", "attn")
        heads = out_in(submodule(block, "attn.c_proj"))[1] // head_dim
        set_present(attention, {"num_heads": heads, "split_size": heads * head_dim})

    def widths(self, block: nn.Module) -> dict[str, int]:
        """``n_inner`` and ``n_head``."""
        head_dim = int_attribute(submodule(block, "attn"), "head_dim", "attn")
        return {
            "n_inner": out_in(submodule(block, "mlp.c_fc"))[0],
            "n_head": out_in(submodule(block, "attn.c_proj"))[1] // head_dim,
        }

    def unit_counts(self, widths: Mapping[str, int]) -> dict[str, int]:
        """Channels: ``n_inner``; heads: ``n_head``."""
        return {"channel": widths["n_inner"], "head": widths["n_head"]}


def _heads(name: str, block: nn.Module) -> UnitGroup:
    attention = submodule(block, "attn")
    head_dim = int_attribute(attention, "head_dim", name)
    split = int_attribute(attention, "split_size", name)
    fused, output = submodule(block, "attn.c_attn"), submodule(block, "attn.c_proj")
    if split % head_dim or out_in(fused)[0] != 3 * split or out_in(output)[1] != split:
        raise UnanalysableError(
            f"Expected {name}.c_attn to hold three sections of split_size {split} (whole heads "
            f"of head_dim {head_dim}) and {name}.c_proj as many inputs, but got "
            f"{out_in(fused)[0]} outputs and {out_in(output)[1]} inputs."
        )
    slices = tuple(
        piece
        for section in range(3)
        for piece in row_slices(f"{name}.c_attn", fused, head_dim, offset=section * split)
    )
    return UnitGroup(
        name, "head", split // head_dim, slices + output_slices(f"{name}.c_proj", output, head_dim)
    )


GPT2 = Gpt2Family()
"""The GPT-2 family."""
