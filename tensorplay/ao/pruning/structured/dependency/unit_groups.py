"""What a structured unit is: the slices of every tensor that one unit spans.

A structured unit (an FFN channel, an attention head, a residual block) is not one weight but
the same index range in several tensors: an FFN neuron is a row of the gate and up projections
and a column of the down projection. A :class:`UnitGroup` holds ``size`` units that share one
layout: unit ``u`` spans, in each :class:`Slice`, the indices
``offset + u * width ... offset + (u + 1) * width - 1`` along ``dim`` of one parameter (of one
expert of a fused expert tensor, where :attr:`Slice.expert` says which). The
dependency analysis (:mod:`~tensorplay.ao.pruning.structured.dependency.graph`) finds the groups;
masking, scoring, counting and shrinking read them through the pure functions of this module, so
"what else goes if this unit goes" is answered once.

Example:
    >>> import torch
    >>> from torch import nn
    >>> mlp = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> group = UnitGroup(
    ...     "0", "channel", 3,
    ...     (Slice("0.weight", 0), Slice("0.bias", 0, scored=False), Slice("2.weight", 1)),
    ... )
    >>> keep = expand_keep(group, torch.tensor([True, False, True]), shapes_of(mlp))
    >>> keep["2.weight"].int().tolist()
    [[1, 0, 1], [1, 0, 1]]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.parity.aliases import ParameterTable

__all__ = [
    "Slice",
    "UnitGroup",
    "EXPERT_ALIGN_BYTES",
    "check_groups",
    "expand_keep",
    "expert_width_step",
    "pruned_from_slices",
    "pruned_units",
    "shapes_of",
    "unit_scores",
    "units_view",
]


@dataclass(frozen=True)
class Slice:
    """Where the units of a group sit in one parameter.

    Unit ``u`` spans the indices ``offset + u * width`` up to ``offset + (u + 1) * width - 1``
    along ``dim``; ``dim=None`` means the whole tensor belongs to the group's one unit (a
    residual block's parameters, a group of ``size`` 1). Where ``expert`` is set, the slice lies
    in that index along dim 0 alone: one expert's part of a mixture-of-experts layer's fused
    tensor (``gate_up_proj`` of shape ``(num_experts, 2 * inter, hidden)``), whose channels
    are indices along ``dim`` (1 or 2) within that expert.

    Args:
        parameter: The parameter's qualified name in the model (``"layers.0.mlp.up.weight"``).
        dim: The dimension the units index, or ``None`` for the whole tensor.
        offset: The first index of unit 0 along ``dim`` (a fused projection's section).
        width: Indices per unit (a head's ``head_dim``; ``H * W`` where a feature map is
            flattened into a Linear's inputs).
        scored: Whether the unit's score reads this slice (the weights of Linear, Conv and
            ``Conv1D`` layers); biases and norm entries go with the unit but are not scored.
        expert: The index along dim 0 the slice lies in (one expert of a fused expert tensor),
            or ``None``: every index.

    Example:
        >>> Slice("attn.q.weight", 0, offset=0, width=8).span(2)
        slice(16, 24, None)
        >>> Slice("mlp.experts.down_proj", 2, expert=3).index(5, 3)
        (3, slice(None, None, None), slice(5, 6, None))
    """

    parameter: str
    dim: int | None
    offset: int = 0
    width: int = 1
    scored: bool = True
    expert: int | None = None

    def span(self, unit: int) -> slice:
        """The index range of ``unit`` along :attr:`dim`."""
        start = self.offset + unit * self.width
        return slice(start, start + self.width)

    def index(self, unit: int, ndim: int) -> tuple[int | slice, ...]:
        """The full index of ``unit`` in a tensor of ``ndim`` dimensions.

        Example:
            >>> Slice("fc.weight", 1, width=2).index(1, 2)
            (slice(None, None, None), slice(2, 4, None))
        """
        if self.dim is None:
            return (slice(None),) * ndim
        if self.expert is not None:
            return (self.expert, *(slice(None),) * (self.dim - 1), self.span(unit))
        return (slice(None),) * self.dim + (self.span(unit),)

    def within(self, tensor: Tensor) -> tuple[Tensor, int | None]:
        """The part of ``tensor`` the slice lies in (a view: one expert's, where
        :attr:`expert` is set) and :attr:`dim` counted in that part.

        Example:
            >>> part, dim = Slice("w", 2, expert=1).within(torch.zeros(4, 3, 5))
            >>> tuple(part.shape), dim
            ((3, 5), 1)
        """
        if self.expert is None or self.dim is None:
            return tensor, self.dim
        return tensor.select(0, self.expert), self.dim - 1


@dataclass(frozen=True)
class UnitGroup:
    """``size`` units of one kind that share one layout of :class:`Slice` objects.

    Args:
        name: What a report calls the group: the module whose units these are
            (``"model.layers.0.mlp"``, ``"model.layers.3"``).
        kind: ``"channel"``, ``"head"``, ``"layer"`` or ``"expert"``.
        size: The number of units.
        slices: Every slice a unit spans; at least one is scored.
        min_kept: The fewest units the group can compute with (a mixture-of-experts layer
            routes each token to ``top_k`` experts; 1 elsewhere).

    Example:
        >>> group = UnitGroup("fc", "channel", 4, (Slice("fc.weight", 0),))
        >>> group.parameters()
        ('fc.weight',)
    """

    name: str
    kind: str
    size: int
    slices: tuple[Slice, ...]
    min_kept: int = 1

    def parameters(self) -> tuple[str, ...]:
        """The names of the parameters the group's slices lie in, each once, in order."""
        return tuple(dict.fromkeys(piece.parameter for piece in self.slices))

    def scored_parameters(self) -> tuple[str, ...]:
        """The names of the parameters its scored slices lie in, each once, in order."""
        return tuple(dict.fromkeys(piece.parameter for piece in self.slices if piece.scored))

    def distinct_slices(self, canonical: Mapping[str, str]) -> list[tuple[str, Slice]]:
        """Each slice with the canonical name of its tensor (``canonical``: by any name of a
        tied tensor; a name not in it is its own), a slice that a tie repeats once: what a
        unit frees, counted once per tensor.

        Example:
            >>> group = UnitGroup("fc", "channel", 4, (Slice("a", 0), Slice("b", 0)))
            >>> [(name, piece.parameter) for name, piece in group.distinct_slices({"b": "a"})]
            [('a', 'a')]
        """
        found: dict[tuple[str, int | None, int, int | None], tuple[str, Slice]] = {}
        for piece in self.slices:
            name = canonical.get(piece.parameter, piece.parameter)
            found.setdefault((name, piece.dim, piece.offset, piece.expert), (name, piece))
        return list(found.values())

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON: names, integers, booleans, lists), read back by :meth:`from_dict`.

        Example:
            >>> group = UnitGroup("fc", "channel", 4, (Slice("fc.weight", 0),))
            >>> UnitGroup.from_dict(group.to_dict()) == group
            True
        """
        data = dataclasses.asdict(self)
        data["slices"] = [dataclasses.asdict(piece) for piece in self.slices]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UnitGroup:
        """The group :meth:`to_dict` wrote.

        Raises:
            ValueError: ``data`` is not such a record (naming what is wrong).
        """
        try:
            slices = tuple(Slice(**piece) for piece in data["slices"])
            fields = {key: value for key, value in data.items() if key != "slices"}
            return cls(**fields, slices=slices)
        except (KeyError, TypeError) as error:
            raise ValueError(
                f"Expected a unit group written by UnitGroup.to_dict, but got {dict(data)!r} "
                f"({error})."
            ) from None


EXPERT_ALIGN_BYTES = 16
"""Bytes a fused expert tensor's width is a multiple of after shrinking: transformers' default
experts kernel (``grouped_mm``) refuses rows that are not 16-byte aligned."""


def expert_width_step(
    group: UnitGroup,
    element_sizes: Mapping[str, int],
    shapes: Mapping[str, torch.Size] | None = None,
) -> int:
    """The multiple of units a group keeps after shrinking where its units lie in fused expert
    tensors (:data:`EXPERT_ALIGN_BYTES` over their bytes per element): one expert's channels
    and, given ``shapes``, any group with a slice across the rows of a 3-D fused tensor (the
    hidden size, in every expert); 1 for any other group (whole experts included).

    Example:
        >>> group = UnitGroup("e[0]", "channel", 16, (Slice("down", 2, expert=0),))
        >>> expert_width_step(group, {"down": 4}), expert_width_step(group, {"down": 2})
        (4, 8)
        >>> hidden = UnitGroup("", "hidden", 16, (Slice("gate_up", 2),))
        >>> expert_width_step(hidden, {"gate_up": 2}, {"gate_up": torch.Size([4, 8, 16])})
        8
    """
    sizes = [
        element_sizes[p.parameter]
        for p in group.slices
        if p.expert is not None
        or (shapes is not None and len(shapes[p.parameter]) == 3 and p.dim not in (None, 0))
    ]
    return max(1, EXPERT_ALIGN_BYTES // max(sizes)) if sizes else 1


def shapes_of(model: nn.Module) -> dict[str, torch.Size]:
    """Every parameter's shape by qualified name (tied parameters under each name; a pruned
    tensor under its own name, ``"fc.weight"``, not its ``"fc.weight_orig"``).

    Example:
        >>> shapes_of(nn.Linear(3, 2))
        {'weight': torch.Size([2, 3]), 'bias': torch.Size([2])}
    """
    return ParameterTable.of(model).shapes


def check_groups(groups: Iterable[UnitGroup], shapes: Mapping[str, torch.Size]) -> None:
    """Refuse groups that do not fit the model: unknown parameters, slices out of range, no
    scored slice, a whole-tensor slice in a group of more than one unit.

    Raises:
        ValueError: Naming the group, the parameter and the value at fault.

    Example:
        >>> group = UnitGroup("fc", "channel", 5, (Slice("weight", 0),))
        >>> check_groups([group], shapes_of(nn.Linear(3, 4)))
        Traceback (most recent call last):
        ...
        ValueError: Expected the 5 units of group 'fc' to fit dim 0 of 'weight' (size 4), ...
    """
    for group in groups:
        if group.size < 1:
            raise ValueError(f"Expected group {group.name!r} to hold units, but got {group.size}.")
        if not 1 <= group.min_kept <= group.size:
            raise ValueError(
                f"Expected group {group.name!r} to need between 1 and its {group.size} units, "
                f"but got min_kept={group.min_kept}."
            )
        if not any(piece.scored for piece in group.slices):
            raise ValueError(f"Expected group {group.name!r} to have a scored slice, but got none.")
        for piece in group.slices:
            _check_slice(group, piece, shapes)


def _check_slice(group: UnitGroup, piece: Slice, shapes: Mapping[str, torch.Size]) -> None:
    if piece.parameter not in shapes:
        raise ValueError(
            f"Expected group {group.name!r} to lie in the model's parameters, but "
            f"{piece.parameter!r} is not one."
        )
    shape = shapes[piece.parameter]
    if piece.dim is None:
        if group.size != 1:
            raise ValueError(
                f"Expected a whole-tensor slice ({piece.parameter!r}) only in a group of one "
                f"unit, but group {group.name!r} has {group.size}."
            )
        return
    if not 0 <= piece.dim < len(shape):
        raise ValueError(
            f"Expected dim {piece.dim} of {piece.parameter!r} (group {group.name!r}) to exist, "
            f"but the tensor has shape {tuple(shape)}."
        )
    if piece.expert is not None and not (piece.dim > 0 and 0 <= piece.expert < shape[0]):
        raise ValueError(
            f"Expected group {group.name!r} to lie in one expert of {piece.parameter!r} (an "
            f"index below {shape[0]} along dim 0, its units along another dim), but got expert "
            f"{piece.expert} with units along dim {piece.dim}."
        )
    end = piece.offset + group.size * piece.width
    if piece.offset < 0 or piece.width < 1 or end > shape[piece.dim]:
        raise ValueError(
            f"Expected the {group.size} units of group {group.name!r} to fit dim {piece.dim} of "
            f"{piece.parameter!r} (size {shape[piece.dim]}), but they span indices "
            f"{piece.offset} to {end - 1}."
        )


def units_view(tensor: Tensor, piece: Slice, size: int) -> Tensor:
    """A view of ``tensor`` whose first dimension is the group's unit (``size`` of them) and
    whose second is the index within the unit (``width``); the other dimensions follow.

    Example:
        >>> units_view(torch.arange(6).view(2, 3), Slice("w", 1), 3)[2].tolist()
        [[2, 5]]
    """
    if piece.dim is None:
        return tensor.unsqueeze(0)
    part, dim = piece.within(tensor)
    assert dim is not None  # a whole-tensor slice returned above
    section = part.narrow(dim, piece.offset, size * piece.width)
    moved = section.movedim(dim, 0)
    # Split the unit dimension into (unit, index within the unit), still a view of `tensor`.
    shape = (size, piece.width, *moved.shape[1:])
    return moved.as_strided(shape, (moved.stride(0) * piece.width, *moved.stride()))


def expand_keep(
    group: UnitGroup, keep: Tensor, shapes: Mapping[str, torch.Size]
) -> dict[str, Tensor]:
    """The element keep-masks (``True``: kept) that ``keep`` (one bool per unit) means for each
    parameter the group spans; entries outside the group's slices are kept.

    Raises:
        ValueError: ``keep`` has not one flag per unit.

    Example:
        >>> group = UnitGroup("fc", "channel", 2, (Slice("weight", 0),))
        >>> expand_keep(group, torch.tensor([False, True]), {"weight": torch.Size([2, 2])})
        {'weight': tensor([[False, False],
                [ True,  True]])}
    """
    if keep.shape != (group.size,):
        raise ValueError(
            f"Expected one keep flag per unit of group {group.name!r} ({group.size}), but got "
            f"shape {tuple(keep.shape)}."
        )
    masks: dict[str, Tensor] = {}
    dropped = ~keep.to(torch.bool).cpu()
    for piece in group.slices:
        mask = masks.setdefault(
            piece.parameter, torch.ones(shapes[piece.parameter], dtype=torch.bool)
        )
        units_view(mask, piece, group.size)[dropped] = False
    return masks


def pruned_units(
    group: UnitGroup, masks: Mapping[str, Tensor], *, partial: Literal["refuse", "keep"] = "refuse"
) -> Tensor:
    """One bool per unit, ``True`` where the unit is pruned: all of its slices are masked
    (``masks``: element keep-masks by parameter name, ``True``/nonzero: kept).

    Args:
        group: The units.
        masks: An element keep-mask for every parameter the group spans.
        partial: What a unit masked in some of its slices but not all is: refused
            (``"refuse"``: masks no structure made) or not pruned (``"keep"``: what removing
            units from a model whose elements were pruned needs, where such a unit must stay).

    Raises:
        ValueError: With ``partial="refuse"``, a unit masked in some of its slices but not all,
            naming the group, the unit and a slice that disagrees.

    Example:
        >>> group = UnitGroup("fc", "channel", 2, (Slice("weight", 0), Slice("bias", 0)))
        >>> masks = {"weight": torch.zeros(2, 2), "bias": torch.tensor([0.0, 1.0])}
        >>> pruned_units(group, masks, partial="keep")
        tensor([ True, False])
    """
    return pruned_from_slices(
        group,
        [~_kept_anywhere(masks[piece.parameter], piece, group.size) for piece in group.slices],
        partial=partial,
    )


def pruned_from_slices(
    group: UnitGroup, pruned: Sequence[Tensor], *, partial: Literal["refuse", "keep"] = "refuse"
) -> Tensor:
    """One bool per unit, ``True`` where it is pruned in every slice, from ``pruned``: per slice
    of ``group`` (in order), one bool per unit, ``True`` where the slice masks all of the
    unit's indices. The rule of :func:`pruned_units`, for flags found elsewhere (summed over the
    ranks that hold pieces of the slices,
    :mod:`~tensorplay.ao.pruning.structured.units.sharded_units`).

    Raises:
        ValueError: As :func:`pruned_units`.

    Example:
        >>> group = UnitGroup("fc", "channel", 2, (Slice("weight", 0), Slice("bias", 0)))
        >>> pruned_from_slices(group, [torch.tensor([True, False]), torch.tensor([True, False])])
        tensor([ True, False])
    """
    if partial not in ("refuse", "keep"):
        raise ValueError(f"Expected `partial` to be 'refuse' or 'keep', but got {partial!r}.")
    first: Tensor | None = None
    for piece, found in zip(group.slices, pruned, strict=True):
        if first is None:
            first = found
            first_piece = piece
            continue
        if partial == "keep":
            first = first & found
            continue
        disagree = torch.nonzero(found != first).flatten()
        if disagree.numel():
            unit = int(disagree[0])
            raise ValueError(
                f"Expected unit {unit} of group {group.name!r} to be pruned in all of its "
                f"slices or in none, but it is {_state(bool(found[unit]))} in "
                f"{piece.parameter!r} and {_state(bool(first[unit]))} in "
                f"{first_piece.parameter!r}."
            )
    if first is None:
        raise ValueError(f"Expected group {group.name!r} to have slices, but got none.")
    return first


def _kept_anywhere(mask: Tensor, piece: Slice, size: int) -> Tensor:
    """Per unit, whether ``mask`` keeps (is nonzero at) some index of the unit's slice.

    Reduces the other dimensions one at a time, in place of gathering each unit's indices (a
    column slice of a large weight would be copied unit by unit).
    """
    kept = mask if mask.dtype == torch.bool else mask != 0
    if piece.dim is None:
        return kept.any().reshape(1).cpu()
    kept, along = piece.within(kept)
    for dim in reversed(range(kept.dim())):
        if dim != along:
            kept = kept.any(dim=dim)
    return kept.narrow(0, piece.offset, size * piece.width).view(size, piece.width).any(1).cpu()


def _state(pruned: bool) -> str:
    return "pruned" if pruned else "kept"


def unit_scores(group: UnitGroup, scores: Mapping[str, Tensor]) -> Tensor:
    """One float64 score per unit: the root mean square of the element ``scores`` (by
    parameter name, each of its parameter's shape) over the unit's scored slices.

    The mean makes units of different sizes comparable when one budget ranks several groups
    (a conv filter of a 3x3 kernel against a Linear row); for magnitude scores (``|w|``) it is
    the unit's L2 norm over the square root of its size.

    Example:
        >>> group = UnitGroup("fc", "channel", 2, (Slice("weight", 0),))
        >>> unit_scores(group, {"weight": torch.tensor([[3.0, 4.0], [0.0, 1.0]])})
        tensor([3.5355, 0.7071], dtype=torch.float64)
    """
    total = torch.zeros(group.size, dtype=torch.float64)
    count = 0
    for piece in group.slices:
        if piece.scored:
            units = units_view(scores[piece.parameter].detach(), piece, group.size)
            flat = units.reshape(group.size, -1).to(device="cpu", dtype=torch.float64)
            total += flat.square().sum(dim=1)
            count += flat.shape[1]
    return (total / count).sqrt()
