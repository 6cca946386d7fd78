"""The unit layouts Hugging Face blocks share: separate q/k/v/o projections and two-layer FFNs.

Llama-style and ViT attention hold four ``nn.Linear`` layers ``q_proj``, ``k_proj``, ``v_proj``
and ``o_proj`` and read ``head_dim`` from the module. Under grouped-query attention query head
``h`` reads key/value head ``h // g`` (``g`` query heads per key/value head), so a head unit is a
key/value head with its ``g`` query heads: ``g * head_dim`` rows of ``q_proj``, ``head_dim`` rows
of ``k_proj`` and ``v_proj``, ``g * head_dim`` columns of ``o_proj``, and their biases. A per-head
norm over ``head_dim`` (Qwen3's ``q_norm``/``k_norm``) is shared by all heads and stays whole.

An FFN channel is one intermediate neuron: a row of each input projection (and its bias entry)
and a column of the output projection; the output projection's bias is the residual stream's.

Example:
    >>> from torch import nn
    >>> attention = nn.Module()
    >>> attention.head_dim = 2
    >>> for name, (inputs, outputs) in {"q_proj": (8, 8), "k_proj": (8, 4), "v_proj": (8, 4),
    ...                                 "o_proj": (8, 8)}.items():
    ...     setattr(attention, name, nn.Linear(inputs, outputs))
    >>> heads = qkvo_heads("attn", attention)  # 4 query heads sharing 2 key/value heads
    >>> heads.size, [(s.parameter, s.dim, s.width) for s in heads.slices if s.scored]
    (2, [('attn.q_proj.weight', 0, 4), ('attn.k_proj.weight', 0, 2),
         ('attn.v_proj.weight', 0, 2), ('attn.o_proj.weight', 1, 4)])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import nn

from tensorplay.ao.pruning.structured.dependency.families.family import (
    UnanalysableError,
    child,
    int_attribute,
    join,
    out_in,
    set_present,
    weight_of,
)
from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup

__all__ = [
    "QKVO",
    "HeadLayout",
    "Rows",
    "channel_group",
    "decoder_counts",
    "decoder_widths",
    "head_layout",
    "norm_over_heads",
    "output_slices",
    "projection_group",
    "qkvo_heads",
    "row_slices",
    "sync_head_counts",
]

QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class HeadLayout:
    """How many query and key/value heads a q/k/v/o attention holds, and their width.

    Example:
        >>> HeadLayout(query=8, key_value=2, head_dim=16).group
        4
    """

    query: int
    key_value: int
    head_dim: int

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.query // self.key_value


def decoder_widths(intermediate_size: int, layout: HeadLayout) -> dict[str, int]:
    """A decoder block's widths under the config keys Llama-style configs use.

    Example:
        >>> decoder_widths(24, HeadLayout(query=4, key_value=2, head_dim=8))
        {'intermediate_size': 24, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': 8}
    """
    return {
        "intermediate_size": intermediate_size,
        "num_attention_heads": layout.query,
        "num_key_value_heads": layout.key_value,
        "head_dim": layout.head_dim,
    }


def decoder_counts(widths: Mapping[str, int]) -> dict[str, int]:
    """The units :func:`decoder_widths` mean: channels ``intermediate_size``, heads (key/value
    groups) ``num_key_value_heads``.

    Example:
        >>> decoder_counts({"intermediate_size": 24, "num_key_value_heads": 2})
        {'channel': 24, 'head': 2}
    """
    return {"channel": widths["intermediate_size"], "head": widths["num_key_value_heads"]}


def row_slices(name: str, module: nn.Module, width: int, offset: int = 0) -> tuple[Slice, ...]:
    """The slices of a unit's outputs of a Linear (rows of its weight, entries of its bias) or
    of a ``Conv1D`` (columns of its ``(in, out)`` weight).

    Example:
        >>> [(s.parameter, s.dim, s.scored) for s in row_slices("fc", nn.Linear(2, 4), 1)]
        [('fc.weight', 0, True), ('fc.bias', 0, False)]
    """
    weight_dim = 1 if _is_in_out(module) else 0
    slices = [Slice(join(name, "weight"), weight_dim, offset, width)]
    if weight_of(module, "bias") is not None:
        slices.append(Slice(join(name, "bias"), 0, offset, width, scored=False))
    return tuple(slices)


def output_slices(name: str, module: nn.Module, width: int) -> tuple[Slice, ...]:
    """The slice of a unit's inputs of the layer that consumes it (columns of a Linear's
    weight, rows of a ``Conv1D``'s); its bias is the residual stream's and stays whole.

    Example:
        >>> output_slices("fc", nn.Linear(4, 2), 1)
        (Slice(parameter='fc.weight', dim=1, offset=0, width=1, scored=True, expert=None),)
    """
    return (Slice(join(name, "weight"), 0 if _is_in_out(module) else 1, 0, width),)


@dataclass(frozen=True)
class Rows:
    """Where the units of a group sit in one projection: ``width`` outputs per unit from
    ``offset`` (a section of a fused projection), or, for the layer consuming them, ``width``
    inputs per unit.

    Example:
        >>> Rows("attn.qkv", nn.Linear(4, 12), width=2, offset=4).offset
        4
    """

    name: str
    module: nn.Module
    width: int
    offset: int = 0


def projection_group(
    name: str, kind: str, size: int, rows: Sequence[Rows], output: Rows
) -> UnitGroup:
    """``size`` units of ``kind``: their outputs in each of ``rows`` (weights and bias
    entries) and their inputs of ``output`` (the layer consuming them; its bias stays whole).

    Example:
        >>> fused, out = nn.Linear(4, 12), nn.Linear(6, 4)  # q, k, v sections of 6 heads of 1
        >>> group = projection_group(
        ...     "attn", "head", 6, [Rows("attn.qkv", fused, 1, offset) for offset in (0, 6)],
        ...     Rows("attn.out", out, 1))
        >>> [(s.parameter, s.dim, s.offset) for s in group.slices if s.scored]
        [('attn.qkv.weight', 0, 0), ('attn.qkv.weight', 0, 6), ('attn.out.weight', 1, 0)]
    """
    slices = [piece for part in rows for piece in row_slices(part.name, part.module, part.width,
                                                             part.offset)]  # fmt: skip
    slices.extend(output_slices(output.name, output.module, output.width))
    return UnitGroup(name, kind, size, tuple(slices))


def _is_in_out(module: nn.Module) -> bool:
    return type(module).__name__ == "Conv1D"


def channel_group(
    name: str, inputs: dict[str, nn.Module], output: tuple[str, nn.Module]
) -> UnitGroup:
    """The FFN channels of input projections ``inputs`` (name -> layer, each with the same
    outputs) feeding the output projection ``output``.

    Raises:
        UnanalysableError: Widths that disagree, naming the layers.

    Example:
        >>> group = channel_group("mlp", {"mlp.up": nn.Linear(4, 6)}, ("mlp.down", nn.Linear(6, 4)))
        >>> group.size, group.parameters()
        (6, ('mlp.up.weight', 'mlp.up.bias', 'mlp.down.weight'))
    """
    output_name, output_module = output
    width = out_in(output_module)[1]
    for input_name, module in inputs.items():
        if out_in(module)[0] != width:
            raise UnanalysableError(
                f"Expected {input_name!r} to have as many outputs as {output_name!r} has inputs "
                f"({width}), but got {out_in(module)[0]}."
            )
    rows = [Rows(key, module, 1) for key, module in inputs.items()]
    return projection_group(name, "channel", width, rows, Rows(output_name, output_module, 1))


def head_layout(name: str, attention: nn.Module) -> HeadLayout:
    """The heads of a q/k/v/o attention module, checked against its projections' shapes.

    Raises:
        UnanalysableError: A missing ``head_dim``, or shapes that do not make whole heads,
            naming the module.

    Example:
        >>> attention = nn.Module()
        >>> attention.head_dim = 2
        >>> for key, outputs in zip(QKVO, (8, 4, 4, 8)):
        ...     setattr(attention, key, nn.Linear(8, outputs))
        >>> head_layout("attn", attention)
        HeadLayout(query=4, key_value=2, head_dim=2)
    """
    head_dim = int_attribute(attention, "head_dim", name)
    q, k, v, o = (child(attention, key) for key in QKVO)
    assert q is not None and k is not None and v is not None and o is not None  # matched
    q_out, k_out, v_out, o_in = out_in(q)[0], out_in(k)[0], out_in(v)[0], out_in(o)[1]
    if q_out % head_dim or k_out % head_dim or k_out != v_out or o_in != q_out or not k_out:
        raise UnanalysableError(
            f"Expected the projections of {name!r} to hold whole heads of head_dim {head_dim} "
            f"(q_proj and o_proj alike, k_proj and v_proj alike), but got q_proj {q_out}, "
            f"k_proj {k_out}, v_proj {v_out} outputs and o_proj {o_in} inputs."
        )
    layout = HeadLayout(q_out // head_dim, k_out // head_dim, head_dim)
    groups = getattr(attention, "num_key_value_groups", layout.group)
    if layout.query % layout.key_value or groups != layout.group:
        raise UnanalysableError(
            f"Expected the {layout.query} query heads of {name!r} to share its "
            f"{layout.key_value} key/value heads evenly (num_key_value_groups {groups}), but "
            "they do not."
        )
    return layout


def sync_head_counts(name: str, attention: nn.Module) -> None:
    """Set the head counts an attention module keeps (``num_heads``,
    ``num_attention_heads``, ``num_key_value_heads``, ``num_key_value_groups``, whichever it
    has) from its projections' shapes, after heads were removed.

    Example:
        >>> attention = nn.Module()
        >>> attention.head_dim, attention.num_key_value_heads = 2, 4
        >>> for key, outputs in zip(QKVO, (8, 4, 4, 8)):
        ...     setattr(attention, key, nn.Linear(8, outputs))
        >>> sync_head_counts("attn", attention)
        >>> attention.num_key_value_heads
        2
    """
    layout = head_layout(name, attention)
    set_present(
        attention,
        {
            "num_heads": layout.query,
            "num_attention_heads": layout.query,
            "num_key_value_heads": layout.key_value,
            "num_key_value_groups": layout.group,
        },
    )


def norm_over_heads(name: str, attention: nn.Module) -> str | None:
    """Why the heads of a q/k/v/o attention cannot be removed exactly, or ``None``: a
    ``q_norm``/``k_norm`` whose weight spans the whole projection (OLMo 2) normalises all heads
    together, so its root mean square changes when one head goes.

    Example:
        >>> attention = nn.Module()
        >>> attention.head_dim = 2
        >>> for key, outputs in zip(QKVO, (4, 4, 4, 4)):
        ...     setattr(attention, key, nn.Linear(4, outputs))
        >>> attention.q_norm = nn.RMSNorm(4)
        >>> print(norm_over_heads("attn", attention))
        'attn.q_norm' normalises the queries of all heads together (a weight of 4 entries, ...
    """
    layout = head_layout(name, attention)
    for norm_name, role in (("q_norm", "queries"), ("k_norm", "keys")):
        norm = child(attention, norm_name)
        weight = None if norm is None else weight_of(norm)
        if weight is not None and weight.numel() != layout.head_dim:
            return (
                f"{join(name, norm_name)!r} normalises the {role} of all heads together (a "
                f"weight of {weight.numel()} entries, not one head's {layout.head_dim}): its "
                "root mean square over every head changes when one head goes"
            )
    return None


def qkvo_heads(name: str, attention: nn.Module) -> UnitGroup:
    """The head units of a q/k/v/o attention module (see the module docstring); whether they
    can be removed exactly is :func:`norm_over_heads`'s to say.

    Raises:
        UnanalysableError: As :func:`head_layout`.
    """
    layout = head_layout(name, attention)
    query_width = layout.group * layout.head_dim
    modules = {key: _present(child(attention, key)) for key in QKVO}
    rows = [
        Rows(join(name, "q_proj"), modules["q_proj"], query_width),
        Rows(join(name, "k_proj"), modules["k_proj"], layout.head_dim),
        Rows(join(name, "v_proj"), modules["v_proj"], layout.head_dim),
    ]
    output = Rows(join(name, "o_proj"), modules["o_proj"], query_width)
    return projection_group(name, "head", layout.key_value, rows, output)


def _present(module: nn.Module | None) -> nn.Module:
    assert module is not None  # the family matched these names
    return module
