"""ViT blocks (ViT, DeiT in transformers 5): q/k/v/o attention and a two-layer FFN, pre-norm.

A block is ``layernorm_before -> attention -> +residual -> layernorm_after -> mlp -> +residual``.
``attention`` holds ``q_proj``/``k_proj``/``v_proj``/``o_proj`` and reads ``head_dim`` from the
config when it is there, so fewer heads are described by ``num_attention_heads`` with an explicit
``head_dim``; a channel is a row of ``mlp.fc1`` and a column of ``mlp.fc2``.

Example:
    >>> import transformers
    >>> config = transformers.ViTConfig(
    ...     hidden_size=16, num_hidden_layers=1, num_attention_heads=4, intermediate_size=24,
    ...     image_size=8, patch_size=4)
    >>> block = transformers.ViTModel(config).layers[0]
    >>> units = VIT.units("layers.0", block)
    >>> units.channel.size, units.head.size, VIT.widths(block)
    (24, 4, {'intermediate_size': 24, 'num_attention_heads': 4, 'head_dim': 4})
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from tensorplay.ao.pruning.structured.dependency.families.family import (
    BlockUnits,
    has_children,
    out_in,
    set_present,
    submodule,
)
from tensorplay.ao.pruning.structured.dependency.families.projections import (
    QKVO,
    channel_group,
    head_layout,
    qkvo_heads,
)

__all__ = ["VIT", "VitFamily"]

_SHARED = (
    "layernorm_before.weight",
    "layernorm_before.bias",
    "layernorm_after.weight",
    "layernorm_after.bias",
    "attention.o_proj.bias",
    "mlp.fc2.bias",
)


class VitFamily:
    """ViT blocks (see the module docstring)."""

    name = "vit"
    models = "ViT, DeiT"
    submodules: tuple[str, ...] = (
        *(f"attention.{key}" for key in QKVO), "mlp.fc1", "mlp.fc2", "layernorm_before",
        "layernorm_after",
    )  # fmt: skip

    def matches(self, block: nn.Module) -> bool:
        """``attention`` with q/k/v/o Linears, ``mlp`` with ``fc1``/``fc2``, the two norms."""
        return has_children(block, self.submodules[:6], nn.Linear) and has_children(
            block, self.submodules[6:]
        )

    def units(self, prefix: str, block: nn.Module) -> BlockUnits:
        """The block's FFN channels and attention heads."""
        channel = channel_group(
            f"{prefix}.mlp",
            {f"{prefix}.mlp.fc1": submodule(block, "mlp.fc1")},
            (f"{prefix}.mlp.fc2", submodule(block, "mlp.fc2")),
        )
        return BlockUnits(channel, qkvo_heads(f"{prefix}.attention", submodule(block, "attention")),
                          _SHARED)  # fmt: skip

    def layer_refusal(self, block: nn.Module) -> str | None:
        """None: a pre-norm block whose projections are zero adds zero to the residual."""
        return None

    def sync(self, block: nn.Module) -> None:
        """``num_attention_heads`` of the attention module."""
        attention = submodule(block, "attention")
        layout = head_layout("attention", attention)
        set_present(attention, {"num_attention_heads": layout.query, "num_heads": layout.query})

    def widths(self, block: nn.Module) -> dict[str, int]:
        """``intermediate_size``, ``num_attention_heads`` and ``head_dim``."""
        layout = head_layout("attention", submodule(block, "attention"))
        return {
            "intermediate_size": out_in(submodule(block, "mlp.fc1"))[0],
            "num_attention_heads": layout.query,
            "head_dim": layout.head_dim,
        }

    def unit_counts(self, widths: Mapping[str, int]) -> dict[str, int]:
        """Channels: ``intermediate_size``; heads: ``num_attention_heads``."""
        return {"channel": widths["intermediate_size"], "head": widths["num_attention_heads"]}


VIT = VitFamily()
"""The ViT family."""
