"""The channels of a plain PyTorch model, found by tracing its forward.

:func:`traced_groups` traces the forward with ``torch.fx`` (shapes from the example inputs,
run on the meta device), follows every channel a Linear or Conv produces through the graph
and returns one :class:`~.units.UnitGroup` per run of channels removed alike: a channel is the
producer's weight row and bias entry, the BatchNorm entries that normalise it, and the input
columns of every Linear or Conv that consumes it, directly or through activations, dropout,
pooling, flattening (a feature map's ``H * W`` columns per channel), concatenation (at its
offset) and elementwise operations. Channels that meet in an elementwise operation (a residual
addition, a gate) are one unit: removed together or not at all. Chunks of a fused projection
(``gate, up = fc(x).chunk(2, -1)``) lose the same positions. A grouped convolution loses
whole groups (a depthwise one: an input channel with its output channel).

What the analysis cannot follow leaves the channels reaching it unprunable, never removed
wrongly: the model's outputs (a classifier's), widths joined with the model's input (a
residual stream fed from it), a norm across channels (LayerNorm), a reshape that splits them,
a reduction over them, an operation it does not know. :func:`trace_channels` also says why
each such module's channels were left out. Scores read the Linear and Conv weights only.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(
    ...     nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4, 2)
    ... )
    >>> [group] = traced_groups(model, torch.randn(2, 3, 4, 4))["channel"]
    >>> group.name, group.size
    ('0', 8)
    >>> for piece in group.slices:
    ...     print(piece.parameter, piece.dim, piece.width, piece.scored)
    0.weight 0 1 True
    0.bias 0 1 False
    1.weight 0 1 False
    1.bias 0 1 False
    4.weight 1 4 True
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from tensorplay.ao.pruning.parity.aliases import ParameterTable
from tensorplay.ao.pruning.structured.dependency.channel_flow import follow
from tensorplay.ao.pruning.structured.dependency.channel_groups import unit_groups
from tensorplay.ao.pruning.structured.dependency.fx_capture import capture
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup, check_groups

__all__ = ["ChannelTrace", "trace_channels", "traced_groups"]


@dataclass(frozen=True)
class ChannelTrace:
    """What tracing found: the groups of removable channels, and why others are not.

    Args:
        groups: The channel groups, in the order of their producing modules in the model.
        unprunable: For each module whose output channels (some or all) cannot be removed,
            the first reason found.

    Example:
        >>> from torch import nn
        >>> trace = trace_channels(nn.Sequential(nn.Linear(2, 2)))
        >>> trace.groups, trace.unprunable
        ([], {'0': "they reach the model's output"})
    """

    groups: list[UnitGroup]
    unprunable: dict[str, str]


def traced_groups(
    model: nn.Module, example_inputs: Tensor | tuple[Any, ...] | None
) -> dict[str, list[UnitGroup]]:
    """The structured units of a plain PyTorch model by kind: only ``"channel"`` (heads and
    layers are found in the Hugging Face families, not by tracing).

    Args:
        model: The model; nothing of it changes.
        example_inputs: The forward's positional inputs (a tensor or a tuple), or ``None``.
            Their shapes (not their values) let the analysis follow reshapes, flattening into
            a Linear, concatenation along a positive dimension and broadcasting against
            tensors it does not follow; without them those channels are unprunable. Give a
            batch of at least 2: reshapes are read from the shapes, and a batch of 1 cannot
            tell one that keeps the channels whole from one that merges them with the batch.

    Raises:
        TypeError: ``example_inputs`` is neither a tensor nor a tuple.
        ValueError: The forward cannot be traced by torch.fx (naming the submodule whose
            forward failed) or the example inputs do not run through it.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
        >>> [(g.name, g.size, g.parameters()) for g in traced_groups(model, None)["channel"]]
        [('0', 6, ('0.weight', '0.bias', '2.weight'))]
    """
    return {"channel": trace_channels(model, example_inputs).groups}


def trace_channels(
    model: nn.Module,
    example_inputs: Tensor | tuple[Any, ...] | None = None,
    *,
    table: ParameterTable | None = None,
) -> ChannelTrace:
    """:func:`traced_groups`' channel groups, with the reasons other channels are left out
    (``table``: ``model``'s parameters, where they were read already).

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 2))
        >>> trace = trace_channels(model)
        >>> trace.groups, trace.unprunable["0"]
        ([], "they reach module '1' (LayerNorm), which normalises across them")
    """
    graph, shapes = capture(model, example_inputs)
    table = ParameterTable.of(model) if table is None else table
    with _collector_paused():
        classes = follow(model, graph, shapes, table=table).classes()
        canonical = list(dict.fromkeys(table.canonical.values()))
        groups = unit_groups(classes, _model_order(model, canonical))
    check_groups(groups, table.shapes)
    unprunable: dict[str, str] = {}
    for channel in classes:
        if channel.reason is not None:
            for producer in channel.producers():
                unprunable.setdefault(producer.rpartition(".")[0], channel.reason)
    return ChannelTrace(groups, unprunable)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's garbage collector off for a moment: the analysis allocates tens of thousands
    of small objects, and each collection they set off scans every object torch keeps alive
    (on a ResNet-18, twice the time of the analysis itself)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _model_order(model: nn.Module, names: list[str]) -> dict[str, int]:
    """Each parameter's rank in the model: by module, a module's weight before its bias
    (whether or not a pruning reparametrization registered them in another order)."""
    modules = {name: index for index, (name, _) in enumerate(model.named_modules())}

    def key(name: str) -> tuple[int, int, str]:
        owner, _, leaf = name.rpartition(".")
        return modules.get(owner, -1), 0 if leaf == "weight" else 1, leaf

    return {name: rank for rank, name in enumerate(sorted(names, key=key))}
