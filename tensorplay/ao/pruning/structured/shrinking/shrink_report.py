"""What :func:`~tensorplay.ao.pruning.shrink` did: parameters and widths before and after.

One vocabulary with the dependency graph and the pruner's report: a channel group and a head
group are a module's channels or heads; the **layer group** is the blocks' container
(``model.layers``), its units the layers (blocks). A removed layer is one fewer unit of the
layer group (``model.layers  layer  3  2``), named in
:attr:`ShrinkReport.removed_layers`; the channels and heads it held leave with it and have no
row of their own.

Example:
    >>> report = ShrinkReport(
    ...     parameters_before=1000, parameters_after=750,
    ...     groups=(GroupWidth("model.layers.0.mlp", "channel", 48, 24),
    ...             GroupWidth("model.layers", "layer", 2, 1)),
    ...     partial_units=0, config="uniform", removed_layers=("model.layers.1",))
    >>> print(report)
    parameters: 1,000 -> 750 (75.0%)
    group               kind     before  after
    model.layers.0.mlp  channel      48     24
    model.layers        layer         2      1
    layers removed: model.layers.1
    config: uniform widths, plain from_pretrained loads a saved copy
    >>> report.removed
    250
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ConfigUpdate", "GroupWidth", "ShrinkReport"]

ConfigUpdate = Literal["none", "uniform", "per_layer"]

_CONFIG_LINES = {
    "none": "",
    "uniform": "config: uniform widths, plain from_pretrained loads a saved copy",
    "per_layer": (
        "config: widths per layer recorded (tensorplay_layer_widths): load a saved copy with "
        "tensorplay.ao.pruning.load_shrunk(model_class, directory)"
    ),
}


@dataclass(frozen=True)
class GroupWidth:
    """The units of one group before and after shrinking: a module's channels or heads, or
    the layer group (the blocks' container: its layers).

    Example:
        >>> GroupWidth("h.0.attn", "head", 4, 3).after
        3
    """

    name: str
    kind: str
    before: int
    after: int


@dataclass(frozen=True)
class ShrinkReport:
    """What shrinking removed.

    Args:
        parameters_before: Parameters of the model before (each tied parameter once).
        parameters_after: Parameters after.
        groups: Every group's width before and after, in model order: the channel and head
            groups of the layers that stay, and one row for the layer group (the blocks'
            container, its units the layers) where layers were asked for.
        partial_units: Units kept because only some of their slices were pruned (a weight
            slice fully masked, another not: what element pruning can leave).
        config: How the Hugging Face config now describes the model: ``"uniform"`` (plain
            ``from_pretrained`` rebuilds it), ``"per_layer"`` (widths recorded per layer: load
            with :func:`~tensorplay.ao.pruning.load_shrunk`), ``"none"`` (no config).
        removed_layers: The names (before shrinking) of the layers removed, in model order.
        padded_units: Pruned channels of routed experts kept, all zero, so that the experts of
            one fused tensor keep one width, where the experts of a layer kept different
            numbers (:mod:`~tensorplay.ao.pruning.structured.shrinking.expert_widths`).
    """

    parameters_before: int
    parameters_after: int
    groups: tuple[GroupWidth, ...]
    partial_units: int
    config: ConfigUpdate
    removed_layers: tuple[str, ...] = ()
    padded_units: int = 0

    @property
    def removed(self) -> int:
        """Parameters removed."""
        return self.parameters_before - self.parameters_after

    def __str__(self) -> str:
        kept = self.parameters_after / self.parameters_before if self.parameters_before else 1.0
        lines = [
            f"parameters: {self.parameters_before:,} -> {self.parameters_after:,} ({kept:.1%})"
        ]
        width = max([len("group"), *(len(group.name) for group in self.groups)])
        lines.append(f"{'group':<{width}}  {'kind':<7}  before  after")
        lines.extend(
            f"{g.name:<{width}}  {g.kind:<7}  {g.before:>6}  {g.after:>5}" for g in self.groups
        )
        if self.removed_layers:
            lines.append(f"layers removed: {', '.join(self.removed_layers)}")
        if self.partial_units:
            lines.append(f"units pruned in some of their slices only, kept: {self.partial_units}")
        if self.padded_units:
            lines.append(
                "pruned expert channels kept as zeros (a layer's experts share one width): "
                f"{self.padded_units}"
            )
        if self.config != "none":
            lines.append(_CONFIG_LINES[self.config])
        return "\n".join(lines)
