"""GPT-NeoX blocks (Pythia): a per-head interleaved ``query_key_value``, parallel residual.

A block computes ``attention(input_layernorm(x))`` and ``mlp(post_attention_layernorm(.))``
either side by side (``use_parallel_residual``: ``x + attn + mlp``) or one after the other; in
both a block whose parameters are zero (biases included) adds zero, so whole layers can go.
``attention.query_key_value`` is viewed as ``(..., heads, 3 * head_size)``: head ``h`` is the
``3 * head_size`` contiguous rows at ``h * 3 * head_size`` (its query, key and value, with their
bias entries), and ``head_size`` columns of ``attention.dense``. Partial rotary embeddings act
within each head. An FFN channel is a row of ``mlp.dense_h_to_4h`` (and its bias entry) and a
column of ``mlp.dense_4h_to_h``.

GPT-NeoX derives the head size from ``hidden_size // num_attention_heads``, so a model with
fewer heads cannot be stated by its config: its heads are recorded per layer and a saved copy
loads with :func:`~tensorplay.ao.pruning.load_shrunk`
(:mod:`~tensorplay.ao.pruning.structured.shrinking.hf_config`). Channels alone keep plain loading.

Example:
    >>> import transformers
    >>> config = transformers.GPTNeoXConfig(
    ...     vocab_size=16, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
    ...     num_attention_heads=4)
    >>> block = transformers.GPTNeoXForCausalLM(config).gpt_neox.layers[0]
    >>> units = GPT_NEOX.units("gpt_neox.layers.0", block)
    >>> [(s.parameter.split(".", 3)[-1], s.width) for s in units.head.slices]
    [('attention.query_key_value.weight', 12), ('attention.query_key_value.bias', 12),
     ('attention.dense.weight', 4)]
    >>> GPT_NEOX.widths(block)
    {'intermediate_size': 24, 'num_attention_heads': 4}
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
    submodule,
)
from tensorplay.ao.pruning.structured.dependency.families.projections import (
    Rows,
    channel_group,
    projection_group,
)
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup

__all__ = ["GPT_NEOX", "GptNeoxFamily"]

_NORMS = ("input_layernorm", "post_attention_layernorm")
_SHARED = (
    *(f"{norm}.{kind}" for norm in _NORMS for kind in ("weight", "bias")),
    "attention.dense.bias",
    "mlp.dense_4h_to_h.bias",
)


class GptNeoxFamily:
    """GPT-NeoX blocks (see the module docstring)."""

    name = "gpt_neox"
    models = "GPT-NeoX, Pythia"
    submodules: tuple[str, ...] = (
        "attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h",
        *_NORMS,
    )  # fmt: skip

    def matches(self, block: nn.Module) -> bool:
        """The four Linears and exactly the two norms beside them."""
        return laid_out(block, self.submodules[:4], ("attention", "mlp", *_NORMS))

    def units(self, prefix: str, block: nn.Module) -> BlockUnits:
        """The block's FFN channels and attention heads."""
        mlp = join(prefix, "mlp")
        channel = channel_group(
            mlp,
            {join(mlp, "dense_h_to_4h"): submodule(block, "mlp.dense_h_to_4h")},
            (join(mlp, "dense_4h_to_h"), submodule(block, "mlp.dense_4h_to_h")),
        )
        return BlockUnits(channel, _heads(join(prefix, "attention"), block), _SHARED)

    def layer_refusal(self, block: nn.Module) -> str | None:
        """None: with or without the parallel residual, a block whose parameters are zero adds
        zero to the residual stream."""
        return None

    def sync(self, block: nn.Module) -> None:
        """Nothing: the attention reads its heads from ``query_key_value``'s outputs."""

    def widths(self, block: nn.Module) -> dict[str, int]:
        """``intermediate_size`` and ``num_attention_heads``."""
        return {
            "intermediate_size": out_in(submodule(block, "mlp.dense_h_to_4h"))[0],
            "num_attention_heads": _head_count("attention", block),
        }

    def unit_counts(self, widths: Mapping[str, int]) -> dict[str, int]:
        """Channels: ``intermediate_size``; heads: ``num_attention_heads``."""
        return {"channel": widths["intermediate_size"], "head": widths["num_attention_heads"]}


def _head_count(name: str, block: nn.Module) -> int:
    size = int_attribute(submodule(block, "attention"), "head_size", name)
    fused = out_in(submodule(block, "attention.query_key_value"))[0]
    inputs = out_in(submodule(block, "attention.dense"))[1]
    if inputs % size or fused != 3 * inputs or not inputs:
        raise UnanalysableError(
            f"Expected {name}.query_key_value to hold a query, key and value of head_size {size} "
            f"for each head of {name}.dense's {inputs} inputs, but it has {fused} outputs."
        )
    return inputs // size


def _heads(name: str, block: nn.Module) -> UnitGroup:
    count = _head_count(name, block)
    size = int_attribute(submodule(block, "attention"), "head_size", name)
    fused = Rows(join(name, "query_key_value"), submodule(block, "attention.query_key_value"),
                 3 * size)  # fmt: skip
    output = Rows(join(name, "dense"), submodule(block, "attention.dense"), size)
    return projection_group(name, "head", count, [fused], output)


GPT_NEOX = GptNeoxFamily()
"""The GPT-NeoX family."""
