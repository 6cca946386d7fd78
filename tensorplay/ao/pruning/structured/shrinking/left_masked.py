"""Refusing to shrink where a masked structured unit would stay in the model.

Shrinking removes what the masks hold, or refuses before changing anything. Element pruning
leaves masks that are no structure (a unit masked in some slices only stays, with its zeros:
see :mod:`~tensorplay.ao.pruning.structured.shrinking.shrink`); what must not stay is a *structured*
unit, masked whole, that the shrink would keep. Two rules find one, both before any change:

* **A known unit kept.** A unit of a group a structured pruner recorded on the model
  (:mod:`~tensorplay.ao.pruning.structured.dependency.recorded`), or of a group the dependency graph
  finds that overlaps a recorded one (set aside for it), is masked when every slice it spans is
  pruned and at least one of its tensors is held under a mask (either masking mode). If the groups
  being shrunk span one of its tensors (whose masks shrinking makes permanent) but leave such a unit
  in place, shrinking is refused, naming the group, the unit's index and a tensor it would stay in.
  A recorded group none of whose tensors the shrink spans keeps its masks and its pruner goes on
  (heads pruned by one pruner, channels by another, only the channels shrunk). A recorded group that
  is shrunk decides for itself: where all of its units are pruned, its first stays, zero, by design.
* **Channels tracing could not follow.** A plain model shrunk without ``example_inputs`` is
  traced without shapes, and tracing then leaves out the channels a reshape, a flattening or a
  concatenation reaches
  (:data:`~tensorplay.ao.pruning.structured.dependency.channel_values.NEEDS_SHAPES`). Where such a
  ``Linear``'s or ``Conv``'s output channel is masked whole (its weight row, held under a mask, and
  its bias entry where it has one) and no recorded group spans it, shrinking is refused, naming the
  module, the channel and what is missing: the ``example_inputs``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
    >>> group = UnitGroup("0", "channel", 2, (Slice("0.weight", 0), Slice("1.weight", 1)))
    >>> kept = {"0.weight": torch.tensor([[1.0], [0.0]]), "1.weight": torch.tensor([[1.0, 0.0]])}
    >>> left = LeftMasked(kept, held={"0.weight"}, removed={})
    >>> left.first_kept(group)
    (1, '0.weight')
    >>> LeftMasked(kept, {"0.weight"}, removed={("0.weight", 0): {1}}).first_kept(group)
    (1, '1.weight')
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.modules.conv import _ConvNd

from tensorplay.ao.pruning.structured.dependency.channel_values import NEEDS_SHAPES
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup, pruned_units

__all__ = [
    "OVERLAP_FIX",
    "RECORDED_FIX",
    "LeftMasked",
    "refuse_untraced_channels",
    "untraced_tensors",
]


@dataclass(frozen=True)
class LeftMasked:
    """What the shrink will leave: reads masks and the planned removals, changes nothing.

    Args:
        kept: Per tensor name, its element keep-mask (``True``/nonzero: kept).
        held: The names of the tensors held under a mask.
        removed: Per ``(tensor name, dim)`` the indices the shrink removes; per ``(tensor name,
            dim, expert)`` those it removes from one expert of a fused expert tensor.
        gone: The tensors removed whole (with their block).
    """

    kept: Mapping[str, Tensor]
    held: Collection[str]
    removed: Mapping[tuple[str, int | None] | tuple[str, int | None, int], Collection[int]]
    gone: Collection[str] = ()

    def first_kept(self, group: UnitGroup) -> tuple[int, str] | None:
        """The first unit of ``group`` masked whole (under a mask) that would stay, and a
        tensor it stays in; ``None`` if there is none (see the module example)."""
        if not any(piece.parameter in self.held for piece in group.slices):
            return None
        pruned = pruned_units(group, self.kept, partial="keep")
        for unit in torch.nonzero(pruned).flatten().tolist():
            for piece in group.slices:
                if piece.parameter in self.gone:
                    continue
                if piece.expert is not None:
                    if piece.expert in self.removed.get((piece.parameter, 0), ()):
                        continue  # its expert goes whole
                    cut = self.removed.get((piece.parameter, piece.dim, piece.expert), ())
                else:
                    cut = self.removed.get((piece.parameter, piece.dim), ())
                span = range(1) if piece.dim is None else range(*_bounds(piece.span(unit)))
                if any(index not in cut for index in span):
                    return int(unit), piece.parameter
        return None

    def refuse(self, unshrunk: Sequence[tuple[UnitGroup, str]], spanned: Collection[str]) -> None:
        """Refuse if a masked unit of a group that is not shrunk, one of whose tensors is among
        ``spanned`` (the tensors the shrinking groups span), would stay.

        Args:
            unshrunk: Each group known but not shrunk, with what it is and how to shrink it
                (the end of the error).
            spanned: The names of the tensors the shrinking groups span.

        Raises:
            ValueError: Naming the group, the unit and the tensor, and how to fix it.
        """
        for group, fix in unshrunk:
            if not any(name in spanned for name in group.parameters()):
                continue
            left = self.first_kept(group)
            if left is not None:
                unit, tensor = left
                raise ValueError(
                    f"Expected the groups to shrink to remove every structured unit masked "
                    f"whole, but unit {unit} of {group.kind} group {group.name!r} would stay in "
                    f"{tensor!r}: {fix}"
                )


RECORDED_FIX = (
    "a structured pruner recorded that group; include it in `groups=` (or omit `groups=`: "
    "shrink then removes the groups pruners recorded)."
)
"""The end of the error for a recorded group left out of ``groups=``."""

OVERLAP_FIX = (
    "the dependency graph finds that group, but it overlaps a group a structured pruner "
    "recorded, which shrink removes instead; pass `groups=` that hold both units."
)
"""The end of the error for a group the graph finds that overlaps a recorded one."""


def _bounds(span: slice) -> tuple[int, int]:
    return int(span.start), int(span.stop)


def refuse_untraced_channels(
    model: nn.Module,
    unprunable: Mapping[str, str],
    left: LeftMasked,
    spanned: Collection[tuple[str, int | None]],
) -> None:
    """Refuse if a ``Linear`` or ``Conv`` whose channels tracing without shapes left out has an
    output channel masked whole that no shrinking group spans (see the module docstring).

    Args:
        model: The model.
        unprunable: Tracing's reason per module it left (some) channels of out.
        left: The masks (``kept`` must hold the weight and bias of each such module).
        spanned: The ``(tensor, dim)`` pairs the groups being shrunk span.

    Raises:
        ValueError: Naming the module, the channel, the reason, and what to pass.
    """
    for name, reason in unprunable.items():
        module = model.get_submodule(name)
        if NEEDS_SHAPES not in reason or not _plain_producer(module):
            continue
        weight, bias = _join(name, "weight"), _join(name, "bias")
        if (weight, 0) in spanned or weight not in left.held:
            continue
        rows = ~left.kept[weight].flatten(1).bool().any(dim=1)
        if bias in left.kept:
            rows &= ~left.kept[bias].bool()
        masked = torch.nonzero(rows).flatten().tolist()
        if masked:
            raise ValueError(
                f"Expected `example_inputs` to shrink {type(model).__name__}, a plain model "
                f"traced without them, but output channel {masked[0]} of {name!r} is masked "
                f"whole in {weight!r} and tracing without shapes left its channels out ("
                f"{reason}): they would stay. Pass `example_inputs=` (inputs of the forward, as "
                "the pruner was given) or `groups=`."
            )


def untraced_tensors(model: nn.Module, unprunable: Mapping[str, str]) -> list[str]:
    """The weights and biases :func:`refuse_untraced_channels` reads.

    Example:
        >>> from torch import nn
        >>> untraced_tensors(nn.Sequential(nn.Linear(2, 2)), {"0": NEEDS_SHAPES})
        ['0.weight', '0.bias']
    """
    names = []
    for name, reason in unprunable.items():
        module = model.get_submodule(name)
        if NEEDS_SHAPES in reason and _plain_producer(module):
            names.append(_join(name, "weight"))
            if getattr(module, "bias", None) is not None:
                names.append(_join(name, "bias"))
    return names


def _plain_producer(module: nn.Module) -> bool:
    """A Linear or a (not transposed) convolution: its output channels are its weight's
    rows."""
    return isinstance(module, nn.Linear) or (isinstance(module, _ConvNd) and not module.transposed)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
