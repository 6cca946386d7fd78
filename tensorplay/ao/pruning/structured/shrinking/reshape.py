"""A shrunk model's shapes as plain data, and a freshly built model reshaped to them.

A checkpoint of a shrunk model (a Lightning checkpoint saved after the callback shrank the model
at the end of training) holds tensors that the model's class no longer builds: the class builds
the full widths. :class:`ShrunkShapes` records what shrinking did to the model's layout, in plain
data a checkpoint can carry: which residual blocks went, and the shape of every parameter after.
:func:`reshape` gives a freshly built model those shapes (blocks removed, parameters cut to their
first indices, modules and a Hugging Face config updated as :func:`~tensorplay.ao.pruning.shrink`
updates them), so the checkpoint's weights then load strictly and fill it.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning import shrink
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
    >>> def mlp():
    ...     return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> group = UnitGroup("0", "channel", 3, (Slice("0.weight", 0), Slice("0.bias", 0),
    ...                                      Slice("2.weight", 1)))
    >>> model = mlp()
    >>> with torch.no_grad():
    ...     _ = model[0].weight[1].zero_(), model[0].bias[1].zero_(), model[2].weight[:, 1].zero_()
    >>> record = ShrunkShapes.of(model, shrink(model, groups=[group]), layers=[])
    >>> fresh = mlp()
    >>> reshape(fresh, ShrunkShapes.from_dict(record.to_dict()))
    >>> fresh.load_state_dict(model.state_dict())
    <All keys matched successfully>
    >>> fresh[0]
    Linear(in_features=4, out_features=2, bias=True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tensorplay.ao.pruning.parity.aliases import alias_map
from tensorplay.ao.pruning.structured.dependency.blocks import find_blocks
from tensorplay.ao.pruning.structured.dependency.unit_groups import shapes_of
from tensorplay.ao.pruning.structured.shrinking.hf_config import update_config
from tensorplay.ao.pruning.structured.shrinking.removal import Cut, apply_cuts, remove_blocks
from tensorplay.ao.pruning.structured.shrinking.shrink_report import ShrinkReport

__all__ = ["ShrunkShapes", "reshape"]


@dataclass(frozen=True)
class ShrunkShapes:
    """What shrinking did to a model's layout.

    Args:
        layers_before: The residual blocks the model had before (0: no blocks of a known
            family).
        dropped_layers: The indices, before shrinking, of the blocks removed.
        shapes: Every parameter's shape after shrinking, by qualified name (names after the
            blocks were renumbered).
    """

    layers_before: int
    dropped_layers: tuple[int, ...]
    shapes: Mapping[str, tuple[int, ...]]

    @classmethod
    def of(cls, model: nn.Module, report: ShrinkReport, layers: Sequence[str]) -> ShrunkShapes:
        """The record of ``model`` just shrunk with ``report``; ``layers`` are the names of its
        blocks before shrinking (``find_blocks(model).block_names()``; empty: none)."""
        gone = set(report.removed_layers)
        dropped = tuple(index for index, name in enumerate(layers) if name in gone)
        return cls(len(layers), dropped, shapes_of(model))

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists and ints), for a checkpoint."""
        return {
            "layers_before": self.layers_before,
            "dropped_layers": list(self.dropped_layers),
            "shapes": {name: list(shape) for name, shape in self.shapes.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShrunkShapes:
        """The record :meth:`to_dict` wrote.

        Raises:
            ValueError: A mapping that is not such a record, naming what is missing.
        """
        missing = sorted({"layers_before", "dropped_layers", "shapes"} - set(data))
        if missing:
            raise ValueError(
                f"Expected a record of a shrunk model's shapes, but it lacks {missing}."
            )
        shapes = {
            name: tuple(int(size) for size in shape) for name, shape in data["shapes"].items()
        }
        return cls(int(data["layers_before"]), tuple(data["dropped_layers"]), shapes)


def reshape(model: nn.Module, record: ShrunkShapes) -> None:
    """Give a freshly built ``model`` (the class the shrunk model was built from) the shrunk
    model's layout: remove the recorded blocks, cut every parameter that is larger than
    recorded to its first indices, resize the modules and update the Hugging Face config. The
    weights are placeholders until a state_dict of the shrunk model is loaded. A model that
    already has the recorded shapes is left as it is.

    Raises:
        ValueError: Before anything changes: the model does not fit the record (another number
            of blocks, a parameter it lacks or holds smaller or under a mask), naming it.
    """
    found = find_blocks(model)
    if record.dropped_layers or record.layers_before:
        count = 0 if found is None else len(found.blocks)
        if count not in (record.layers_before, record.layers_before - len(record.dropped_layers)):
            raise ValueError(
                f"Expected {type(model).__name__} to have {record.layers_before} blocks, as the "
                f"shrunk model had before shrinking, but it has {count}."
            )
    dropping = found is not None and bool(record.dropped_layers)
    dropping = dropping and len(found.blocks) == record.layers_before  # type: ignore[union-attr]
    blocks = found.block_names() if found is not None else []
    cuts = _cuts(model, record, _renamed(blocks, record.dropped_layers if dropping else ()))
    kept = list(range(len(blocks)))
    if dropping:
        kept = [index for index in kept if index not in record.dropped_layers]
        remove_blocks(found.blocks, record.dropped_layers)  # type: ignore[union-attr]
    apply_cuts(cuts)
    if found is not None:
        if found.config is not None and (cuts or record.dropped_layers):
            update_config(found, kept)
        for block in found.blocks:
            found.family.sync(block)


def _renamed(blocks: Sequence[str], dropped: Sequence[int]) -> dict[str, str | None]:
    """Block prefix before shrinking -> after (``None``: the block goes)."""
    kept = [name for index, name in enumerate(blocks) if index not in dropped]
    renamed: dict[str, str | None] = {f"{name}.": None for name in blocks}
    renamed.update({f"{old}.": f"{new}." for old, new in zip(kept, blocks, strict=False)})
    return renamed


def _new_name(name: str, renamed: Mapping[str, str | None]) -> str | None:
    for old, new in renamed.items():
        if name.startswith(old):
            return None if new is None else new + name[len(old) :]
    return name


def _cuts(model: nn.Module, record: ShrunkShapes, renamed: Mapping[str, str | None]) -> list[Cut]:
    """The cuts, by the names the parameters have now (checked before any change)."""
    aliases = alias_map(model)
    by_new_name = {new: name for name in aliases if (new := _new_name(name, renamed)) is not None}
    cuts: list[Cut] = []
    for new, shape in record.shapes.items():
        name = by_new_name.get(new)
        if name is None:
            raise ValueError(
                f"Expected {type(model).__name__} to have the parameter {new!r} of the shrunk "
                "model, but it has none."
            )
        tied = aliases[name]
        if tied.pairs[0][1] not in tied.pairs[0][0]._parameters:
            raise ValueError(
                f"Expected {name!r} to be a plain parameter, but it is held under a mask: "
                "reshape a freshly built model, before pruning it."
            )
        current = tuple(tied.parameter.shape)
        if len(current) != len(shape) or any(a < b for a, b in zip(current, shape, strict=True)):
            raise ValueError(
                f"Expected {name!r} to be at least as large as the shrunk model's {shape}, but "
                f"it has {current}."
            )
        kept = {dim: torch.arange(size) for dim, size in enumerate(shape) if size < current[dim]}
        if kept and all(cut.name != tied.name for cut in cuts):  # a tied tensor once
            cuts.append(Cut(tied.name, tied.pairs, kept))
    return cuts
