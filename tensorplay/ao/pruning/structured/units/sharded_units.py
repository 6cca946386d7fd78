"""Structured units over FSDP2 shards: per-unit partial sums on each rank, one ``all_reduce``.

Under FSDP2 (``fully_shard`` on a 1-D mesh) every parameter is a ``DTensor`` placed ``Shard(0)``:
a rank holds a block of its rows. A
:class:`~tensorplay.ao.pruning.structured.dependency.unit_groups.Slice` along dim 0 has each unit's
rows on one rank (or on two, where a unit's rows straddle a shard boundary); a slice along another
dim, or a whole-tensor slice (a layer), has every unit's indices split by rows across the ranks.
Either way a rank sums, per unit, the part it holds (:func:`slice_sums`: zeros for units it holds
nothing of), and the sums over the ranks are the sums over the whole slices. No tensor is gathered.

:class:`ShardedUnits` is what a structured pruning step knows of its units under FSDP2, found
with **one** ``all_reduce`` (sum) of one ``float64`` vector, the first time the step asks:

* per slice of every group, the entries of each unit its held mask keeps: a unit is pruned
  where none are kept in every slice, by the rule of one process
  (:func:`~tensorplay.ao.pruning.structured.dependency.unit_groups.pruned_from_slices`);
* per unit, the sum of its squared element scores over its scored slices (those of the weights
  the model computes with: entries a mask prunes score 0): a unit's score is their root mean
  square, as :func:`~tensorplay.ao.pruning.structured.dependency.unit_groups.unit_scores` computes
  it on one process.

So a pruning step sends 8 bytes per unit for each slice it spans, and 8 more.

Every rank then runs the same selection on the same numbers, so the units chosen are the same
on every rank, and each rank writes the rows of the masks it holds (:func:`local_keep`). A
unit's sum is the ranks' partial sums added, in float64, in another order than one process adds
them: it may differ from one process's sum in the last bits, so units whose scores tie to about
``1e-15`` relative may be ordered otherwise than on one process; any others are chosen alike.

Example:
    >>> import torch
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
    >>> rows_2_to_4 = torch.ones(2, 3)  # this rank's rows 2 and 3 of a (4, 3) weight
    >>> slice_sums(rows_2_to_4, Slice("w", 0), 4, first_row=2).tolist()
    [0.0, 0.0, 3.0, 3.0]
    >>> slice_sums(rows_2_to_4, Slice("w", 1), 3, first_row=2).tolist()
    [2.0, 2.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor

from tensorplay.ao.pruning.masking.mode import MaskingMode
from tensorplay.ao.pruning.selection import local_part
from tensorplay.ao.pruning.selection.shards import local_rows, sharding_of
from tensorplay.ao.pruning.structured.dependency.unit_groups import (
    Slice,
    UnitGroup,
    pruned_from_slices,
    units_view,
)
from tensorplay.ao.pruning.structured.units.structure import Scores
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["ShardedUnits", "local_keep", "mesh_of", "slice_sums", "sum_over_mesh"]

ProcessGroup = dist.ProcessGroup


def slice_sums(local: Tensor, piece: Slice, size: int, first_row: int) -> Tensor:
    """Per unit of a group of ``size`` units, the sum (``float64``, on the CPU) of ``local``'s
    values over the unit's indices of ``piece`` that ``local`` holds; ``local`` is rows
    ``first_row ...`` of the full tensor (dim 0), all of its other dims (see the module). The
    sums are taken where ``local`` lies; only the ``size`` of them move to the CPU.

    Example:
        >>> slice_sums(torch.ones(0, 3), Slice("w", 0), 2, first_row=4).tolist()  # no rows
        [0.0, 0.0]
    """
    values = local.detach().to(dtype=torch.float64)
    if piece.dim != 0:  # every unit's indices along it are here, for the rows held
        return units_view(values, piece, size).flatten(1).sum(1).cpu()
    rows = values.flatten(1).sum(1) if values.dim() > 1 else values
    index = torch.arange(first_row, first_row + rows.shape[0], device=rows.device) - piece.offset
    inside = (index >= 0) & (index < size * piece.width)
    sums = torch.zeros(size, dtype=torch.float64, device=rows.device)
    return sums.index_add_(0, index[inside] // piece.width, rows[inside]).cpu()


def local_keep(
    group: UnitGroup, keep: Tensor, parameter: str, local: Tensor, first_row: int
) -> Tensor:
    """``local`` (this rank's piece of ``parameter``'s keep mask, rows ``first_row ...``) with
    every index of the units ``keep`` drops (one bool per unit of ``group``) cleared in each
    slice of ``group`` that lies in ``parameter``: the rows held of a dim-0 slice, those rows'
    indices of any other; ``local`` itself, changed in place.

    Example:
        >>> group = UnitGroup("fc", "channel", 4, (Slice("w", 0),))
        >>> mask = torch.ones(2, 2, dtype=torch.bool)  # rows 2 and 3
        >>> local_keep(group, torch.tensor([True, True, False, True]), "w", mask, 2).tolist()
        [[False, False], [True, True]]
    """
    dropped = ~keep.to(device=local.device, dtype=torch.bool)
    for piece in group.slices:
        if piece.parameter != parameter:
            continue
        if piece.dim != 0:
            units_view(local, piece, group.size)[dropped] = False
            continue
        index = torch.arange(first_row, first_row + local.shape[0], device=local.device)
        index = index - piece.offset
        inside = (index >= 0) & (index < group.size * piece.width)
        unit = torch.where(inside, index, 0) // piece.width
        local[inside & dropped[unit]] = False
    return local


def mesh_of(targets: Sequence[Target]) -> ProcessGroup | None:
    """The process group the targets are sharded over (FSDP2); ``None`` for plain tensors.

    Raises:
        ValueError: As :func:`~tensorplay.ao.pruning.selection.shards.sharding_of`: a mix of
            plain tensors and ``DTensor``\\ s, another placement, several meshes.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> mesh_of([Target(("weight",), ((layer, "weight"),))]) is None
        True
    """
    labels = [f"{target.label} ({target.name!r})" for target in targets]
    return sharding_of([target.parameter() for target in targets], labels).group


def sum_over_mesh(vector: Tensor, group: ProcessGroup | None) -> Tensor:
    """``vector`` (``float64``, on the CPU) summed over the ranks of ``group``: one
    ``all_reduce``, on the GPU for NCCL; ``vector`` itself without a group (one process).

    Example:
        >>> sum_over_mesh(torch.tensor([1.0, 2.0], dtype=torch.float64), None).tolist()
        [1.0, 2.0]
    """
    if group is None:
        return vector
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    sent = vector.to(device)
    dist.all_reduce(sent, group=group)
    return sent.cpu()


class ShardedUnits:
    """The units of one structured pruning step over FSDP2 shards (see the module).

    Args:
        groups: Per ranked group (as the scopes rank them), its unit groups, in order.
        targets: The target holding each parameter the groups span, by every name of it.
        shapes: Each parameter's (global) shape by name.
        mode: The masking mode that holds the masks; ``None``: the weights' zeros are the
            masks (a report after the masks were made permanent).
        scores: ``targets -> element scores`` (``DTensor``\\ s placed like their parameters),
            called once, with ``scored``; ``None``: only pruned units are asked for.
        scored: The targets whose element scores the unit scores read.
        group: The process group of the targets' mesh (``None``: one process, whose tensors
            are whole).
        partial: What a unit masked in some of its slices only is (as
            :func:`~tensorplay.ao.pruning.structured.dependency.unit_groups.pruned_units`).

    Attributes:
        bytes_reduced: The bytes this rank's ``all_reduce`` sent (0 until units are asked, and
            without a group).

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.masking import masking_mode
        >>> layer = nn.Linear(3, 2)
        >>> with torch.no_grad():
        ...     _ = layer.weight.copy_(torch.tensor([[1.0, 1.0, 1.0], [0.0, 3.0, 4.0]]))
        >>> target = Target(("weight",), ((layer, "weight"),))
        >>> fc = UnitGroup("fc", "channel", 2, (Slice("weight", 0),))
        >>> magnitude = lambda targets: [t.parameter().detach().abs() for t in targets]
        >>> units = ShardedUnits([[fc]], {"weight": target}, {"weight": layer.weight.shape},
        ...                      masking_mode("inplace"), magnitude, [target], None)
        >>> units.pruned(0), units.scores(0)
        (tensor([False, False]), tensor([1.0000, 2.8868], dtype=torch.float64))
    """

    def __init__(
        self,
        groups: Sequence[Sequence[UnitGroup]],
        targets: Mapping[str, Target],
        shapes: Mapping[str, torch.Size],
        mode: MaskingMode | None,
        scores: Scores | None,
        scored: Sequence[Target],
        group: ProcessGroup | None,
        partial: Literal["refuse", "keep"] = "refuse",
    ) -> None:
        self._groups = [list(found) for found in groups]
        self._targets = targets
        self._shapes = shapes
        self._mode = mode
        self._score = scores
        self._scored = list(scored)
        self._group = group
        self._partial: Literal["refuse", "keep"] = partial
        self._pruned: list[Tensor] | None = None
        self._scores: list[Tensor] = []
        self.bytes_reduced = 0

    def pruned(self, index: int) -> Tensor:
        """Ranked group ``index``'s units: ``True`` where pruned in every slice."""
        return self._load()[index]

    def scores(self, index: int) -> Tensor:
        """Ranked group ``index``'s unit scores (``float64``), as the step began."""
        self._load()
        return self._scores[index]

    def kept(self, index: int, keep: Tensor) -> None:
        """Ranked group ``index`` now keeps the units ``keep`` (its masks were just written)."""
        self._load()[index] = ~keep

    def keep_masks(self, unit_group: UnitGroup, keep: Tensor) -> dict[str, Tensor]:
        """Per parameter ``unit_group`` spans, this rank's piece of the keep mask (``True``
        elsewhere) that clears the units ``keep`` drops (:func:`local_keep`)."""
        masks = {}
        for name in unit_group.parameters():
            param = self._targets[name].parameter()
            piece = local_part(param)
            local = torch.ones(piece.shape, dtype=torch.bool, device=piece.device)
            row = _first_row(self._targets[name])
            masks[name] = local_keep(unit_group, keep, name, local, row)
        return masks

    def _load(self) -> list[Tensor]:
        if self._pruned is not None:
            return self._pruned
        kept = self._local_kept()
        squares = self._local_squares()
        sums = sum_over_mesh(torch.cat([kept, squares]), self._group)
        self.bytes_reduced = 0 if self._group is None else sums.numel() * sums.element_size()
        self._pruned = self._pruned_from(sums[: kept.numel()])
        self._scores = self._scores_from(sums[kept.numel() :])
        return self._pruned

    def _local_kept(self) -> Tensor:
        """Per slice of every unit group, in order: the entries of each unit kept here."""
        parts = [torch.zeros(0, dtype=torch.float64)]
        for found in self._groups:
            for unit_group in found:
                for piece in unit_group.slices:
                    mask = self._held(piece.parameter)
                    row = _first_row(self._targets[piece.parameter])
                    parts.append(slice_sums(mask, piece, unit_group.size, row))
        return torch.cat(parts)

    def _held(self, name: str) -> Tensor:
        """This rank's piece of the parameter's keep mask as held now."""
        target = self._targets[name]
        param = local_part(target.parameter().detach())
        if self._mode is None:
            return param != 0
        mask = self._mode.mask(*target.pair)
        if mask is None:
            return torch.ones(param.shape, dtype=torch.bool)
        return local_part(mask)

    def _local_squares(self) -> Tensor:
        """Per unit group, in order: each unit's sum of squared effective element scores held
        here, over its scored slices (nothing without scores)."""
        if self._score is None:
            return torch.zeros(0, dtype=torch.float64)
        found = self._score(self._scored)
        local: dict[str, Tensor] = {}  # effective scores: 0 where a mask prunes
        for target, score in zip(self._scored, found, strict=True):
            value = local_part(score.detach())
            mask = None if self._mode is None else self._mode.mask(*target.pair)
            if mask is not None:
                value = value.masked_fill(~local_part(mask).to(value.device), 0)
            for name in target.names:
                local[name] = value
        parts = [torch.zeros(0, dtype=torch.float64)]
        for groups in self._groups:
            for unit_group in groups:
                total = torch.zeros(unit_group.size, dtype=torch.float64)
                for piece in unit_group.slices:
                    if piece.scored:
                        row = _first_row(self._targets[piece.parameter])
                        squares = local[piece.parameter].to(torch.float64).square()
                        total += slice_sums(squares, piece, unit_group.size, row)
                parts.append(total)
        return torch.cat(parts)

    def _pruned_from(self, kept: Tensor) -> list[Tensor]:
        found, offset = [], 0
        for groups in self._groups:
            flags = []
            for unit_group in groups:
                slices = []
                for _ in unit_group.slices:
                    slices.append(kept[offset : offset + unit_group.size] == 0)
                    offset += unit_group.size
                flags.append(pruned_from_slices(unit_group, slices, partial=self._partial))
            found.append(torch.cat(flags))
        return found

    def _scores_from(self, squares: Tensor) -> list[Tensor]:
        if self._score is None:
            return []
        found, offset = [], 0
        for groups in self._groups:
            scores = []
            for unit_group in groups:
                total = squares[offset : offset + unit_group.size]
                offset += unit_group.size
                count = sum(
                    _unit_numel(self._shapes[piece.parameter], piece)
                    for piece in unit_group.slices
                    if piece.scored
                )
                scores.append((total / count).sqrt())
            found.append(torch.cat(scores))
        return found


def _first_row(target: Target) -> int:
    return int(local_rows(target.parameter(), target.label).start)


def _unit_numel(shape: torch.Size, piece: Slice) -> int:
    """The entries of one unit in ``piece`` of a tensor of ``shape``."""
    numel = shape.numel()
    if piece.dim is None:
        return numel
    return numel // shape[piece.dim] * piece.width
