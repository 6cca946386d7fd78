"""The unit space of structured units: one key per unit, masks over every slice it spans.

:class:`StructuredSpace` is the :class:`~tensorplay.ao.pruning.structured.units.space.UnitSpace` of
a pruning step under ``structure="channel"``, ``"head"`` or ``"layer"``. Its groups are
:class:`Ranked` sets of :class:`~tensorplay.ao.pruning.structured.dependency.unit_groups.UnitGroup`
(a module's channels or heads; all of a model's layers together), so the scopes rank units exactly
as they rank single weights:

* **Pruned units** are read from the masks
  (:func:`~tensorplay.ao.pruning.structured.dependency.unit_groups.pruned_units`): a unit is pruned
  when every slice it spans is masked.
* **Scores**: one per unit, given by the importance where it scores units itself
  (:meth:`~tensorplay.ao.pruning.importance.score.Importance.unit_scores`: ``"activation"``),
  else the root mean square of the element scores over the unit's scored
  slices (:func:`~tensorplay.ao.pruning.structured.dependency.unit_groups.unit_scores`); for
  magnitude the unit's L2 norm over the square root of its size, so groups of different sizes
  compete fairly. Entries a mask already prunes (another unit's slices) score 0
  (:func:`effective_scores`): the scores are those of the weights the model computes with, so both
  masking modes prune the same units.
* **Selection**: the exact engine of single weights
  (:func:`~tensorplay.ao.pruning.parity.method_selection.select_in_place`) over the unit scores,
  with its tie rule and seeded random draws.
* **At least one unit stays** in every group (``multiple_of`` of them with ``multiple_of > 1``,
  and with ``min_density`` the scope's floor; a mixture-of-experts layer keeps its ``top_k``
  experts, :attr:`~tensorplay.ao.pruning.structured.dependency.unit_groups.UnitGroup.min_kept`): a
  count that would take more is refused before anything changes.
* **Widths as multiples**: with ``multiple_of = n > 1`` the width each group keeps after a step
  is rounded to the nearest multiple of ``n`` (half up; at least ``n`` and ``min_density``'s
  floor, raised to a multiple; never more than it kept), its lowest-scored units pruned to reach
  it. The total then differs from the count asked by at most ``n // 2`` per group, and the
  pruner's history records the real count. A count beyond every group's floor by at most
  ``n // 2`` per group is what that rounding gives back (every group stops at its floor); only
  a larger one is refused, so a schedule whose final target the rounding reaches runs to its
  end.
* **Masks**: the chosen units expand to element masks of every slice
  (:func:`~tensorplay.ao.pruning.structured.dependency.unit_groups.expand_keep`), combined with the
  masks held, and the masking mode holds them (either mode).
* **FSDP2**: where the targets are ``DTensor`` shards, the pruned units and the scores come from
  one ``all_reduce`` of per-unit partial sums
  (:class:`~tensorplay.ao.pruning.structured.units.sharded_units.ShardedUnits`), every rank selects
  the same units on the same numbers (random methods with rank zero's draw), and each writes its own
  rows of the masks.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.masking import masking_mode
    >>> from tensorplay.ao.pruning.parity.methods import L1Unstructured
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import (
    ...     Slice, UnitGroup, shapes_of
    ... )
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> mlp = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> group = UnitGroup("0", "channel", 3, (Slice("0.weight", 0), Slice("2.weight", 1)))
    >>> targets = {"0.weight": Target(("0.weight",), ((mlp[0], "weight"),)),
    ...            "2.weight": Target(("2.weight",), ((mlp[2], "weight"),))}
    >>> scores = lambda chosen: [t.parameter().detach() for t in chosen]
    >>> space = StructuredSpace([Ranked("0", (group,))], targets, shapes_of(mlp),
    ...                         masking_mode("inplace"), L1Unstructured, scores)
    >>> space.prune(2), space.pruned(), space.numels()
    (None, [2], [3])
    >>> mlp[2].weight_mask.any(dim=0).sum().item()  # one input column of the consumer kept
    1
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from tensorplay.ao.pruning.masking.mode import MaskingMode
from tensorplay.ao.pruning.parity.amount import kept_multiple
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.method_selection import select_in_place
from tensorplay.ao.pruning.selection.shards import Sharding, placed_like
from tensorplay.ao.pruning.structured.dependency.unit_groups import (
    UnitGroup,
    expand_keep,
    pruned_units,
    unit_scores,
)
from tensorplay.ao.pruning.structured.units.sharded_units import ShardedUnits, mesh_of
from tensorplay.ao.pruning.structured.units.structure import Scores, UnitScores
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["Ranked", "StructuredSpace", "effective_scores", "held_masks", "pruned_of"]


@dataclass(frozen=True)
class Ranked:
    """Unit groups a scope ranks as one group, their units in order.

    Args:
        name: The name reports and messages give it (the module, or the blocks' container).
        groups: The unit groups, each a slice of the units.

    Example:
        >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
        >>> layers = [UnitGroup(f"h.{i}", "layer", 1, (Slice(f"h.{i}.w", None),)) for i in (0, 1)]
        >>> Ranked("h", tuple(layers)).size
        2
    """

    name: str
    groups: tuple[UnitGroup, ...]

    @property
    def size(self) -> int:
        """Its units."""
        return sum(group.size for group in self.groups)

    @property
    def min_kept(self) -> int:
        """The fewest units its groups compute with (an expert layer's ``top_k``; else 1)."""
        return max(group.min_kept for group in self.groups)

    def parameters(self) -> tuple[str, ...]:
        """The names of the parameters its groups span, each once (see the class example)."""
        return tuple(dict.fromkeys(name for group in self.groups for name in group.parameters()))


def held_masks(
    names: Sequence[str],
    targets: Mapping[str, Target],
    shapes: Mapping[str, torch.Size],
    mode: MaskingMode | None,
) -> dict[str, Tensor]:
    """The keep mask of each parameter in ``names`` as ``mode`` holds it (an all-kept view where
    it holds none); ``mode=None``: the parameter's nonzero entries (masks made permanent).

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.masking import masking_mode
        >>> layer = nn.Linear(2, 1)
        >>> targets = {"weight": Target(("weight",), ((layer, "weight"),))}
        >>> held_masks(["weight"], targets, {"weight": torch.Size([1, 2])},
        ...            masking_mode("inplace"))["weight"].tolist()
        [[True, True]]
    """
    masks: dict[str, Tensor] = {}
    for name in names:
        target = targets[name]
        if mode is None:
            masks[name] = target.parameter().detach() != 0
            continue
        mask = mode.mask(*target.pair)
        masks[name] = (
            torch.ones((), dtype=torch.bool).expand(shapes[name]) if mask is None else mask
        )
    return masks


def effective_scores(scores: Tensor, mask: Tensor | None) -> Tensor:
    """``scores`` where ``mask`` keeps (nonzero), 0 where it prunes: the scores of the weights
    the model computes with, whichever way the mask is held (a reparametrization's ``_orig``
    keeps the pruned values, a lean weight is zero there), so the masking mode never changes
    which units go.

    Example:
        >>> effective_scores(torch.tensor([3.0, -2.0]), torch.tensor([0.0, 1.0]))
        tensor([ 0., -2.])
    """
    if mask is None:
        return scores
    keep = mask if mask.dtype == torch.bool else mask != 0
    return scores.masked_fill(~keep, 0)


def pruned_of(
    ranked: Ranked, masks: Mapping[str, Tensor], partial: Literal["refuse", "keep"] = "refuse"
) -> Tensor:
    """One bool per unit of ``ranked``, ``True`` where all its slices are masked
    (:func:`~tensorplay.ao.pruning.structured.dependency.unit_groups.pruned_units` of each group, in
    order).

    Example:
        >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
        >>> group = UnitGroup("fc", "channel", 2, (Slice("weight", 0),))
        >>> pruned_of(Ranked("fc", (group,)), {"weight": torch.tensor([[0.0], [1.0]])})
        tensor([ True, False])
    """
    return torch.cat([pruned_units(group, masks, partial=partial) for group in ranked.groups])


class StructuredSpace:
    """Structured units in :class:`Ranked` groups (see the module).

    Args:
        ranked: The groups the scopes rank.
        targets: The target holding each parameter the groups span, by every name of it.
        shapes: Each parameter's shape by name.
        mode: The masking mode that holds the masks.
        method: ``l1_unstructured`` (lowest unit score first) or ``random_unstructured``.
        scores: ``targets -> element scores``, called once, on first use, with ``scored``.
        scored: The targets whose element scores the unit scores read.
        multiple_of: Kept widths are multiples of it (1: any width).
        units: ``group -> its unit scores`` where the importance gives them itself (``None``
            from it, or no ``units``: the root mean square of the element scores).
    """

    def __init__(
        self,
        ranked: Sequence[Ranked],
        targets: Mapping[str, Target],
        shapes: Mapping[str, torch.Size],
        mode: MaskingMode,
        method: type[BasePruningMethod],
        scores: Scores,
        scored: Sequence[Target] | None = None,
        multiple_of: int = 1,
        units: UnitScores | None = None,
    ) -> None:
        self._ranked = list(ranked)
        self._targets = targets
        self._shapes = shapes
        self._mode = mode
        self._method = method
        self._score = scores
        self._scored = list(dict.fromkeys(targets.values())) if scored is None else list(scored)
        self._element_scores: dict[str, Tensor] | None = None
        self._multiple = multiple_of
        self._units = units
        self.names = [ranked.name for ranked in self._ranked]
        group = mesh_of(list(dict.fromkeys(targets.values())))
        self._sharded = None
        if group is not None:  # FSDP2: one all_reduce of per-unit sums (sharded_units)
            found = [ranked.groups for ranked in self._ranked]
            self._sharded = ShardedUnits(found, targets, shapes, mode, scores, self._scored, group)
        self._selection = Sharding(None, group)  # the same units on every rank (random: rank 0's)
        self.collapse_share = 0.1  # a group keeps a unit: warn when it is nearly gone
        self.has_floors = True

    @classmethod
    def joined(cls, spaces: Sequence[StructuredSpace]) -> StructuredSpace:
        """One space ranking the groups of all ``spaces`` (built with one mode, method, scores
        and ``multiple_of``): the groups of several kinds in one list."""
        first = spaces[0]
        targets: dict[str, Target] = {}
        shapes: dict[str, torch.Size] = {}
        for space in spaces:
            targets.update(space._targets)
            shapes.update(space._shapes)
        scored = list(dict.fromkeys(target for space in spaces for target in space._scored))
        ranked = [group for space in spaces for group in space._ranked]
        mode, method, score = first._mode, first._method, first._score
        return cls(
            ranked, targets, shapes, mode, method, score, scored, first._multiple, first._units
        )

    @property
    def multiple(self) -> int:
        """Every group's kept width is a multiple of it (``multiple_of``, or the structure's
        own step)."""
        return self._multiple

    @property
    def ranked(self) -> list[Ranked]:
        """The groups the scopes rank, in order."""
        return list(self._ranked)

    def units(self, index: int) -> tuple[Tensor, Tensor]:
        """Group ``index``'s units: which are pruned (as the masks hold them) and their scores."""
        return self._pruned(index), self._unit_scores(index)

    def numels(self) -> list[int]:
        """Per group, its units."""
        return [ranked.size for ranked in self._ranked]

    def pruned(self) -> list[int]:
        """Per group, its pruned units as the masks hold them."""
        return [int(self._pruned(index).sum()) for index in range(len(self._ranked))]

    @property
    def bytes_reduced(self) -> int:
        """The bytes this rank all-reduced to find the units of a sharded model's step (0 on
        plain tensors)."""
        return 0 if self._sharded is None else self._sharded.bytes_reduced

    def _pruned(self, index: int) -> Tensor:
        if self._sharded is not None:
            return self._sharded.pruned(index)
        ranked = self._ranked[index]
        return pruned_of(
            ranked, held_masks(ranked.parameters(), self._targets, self._shapes, self._mode)
        )

    def _unit_scores(self, index: int) -> Tensor:
        groups = self._ranked[index].groups
        given = [None if self._units is None else self._units(group) for group in groups]
        if all(found is not None for found in given):
            return torch.cat([found.to(torch.float64) for found in given if found is not None])
        if self._sharded is not None:
            return self._sharded.scores(index)
        if self._element_scores is None:
            found = self._score(self._scored)
            self._element_scores = {
                name: effective_scores(score, self._mode.mask(*target.pair))
                for target, score in zip(self._scored, found, strict=True)
                for name in target.names
            }
        scores = self._element_scores
        return torch.cat(
            [
                unit_scores(group, scores) if found is None else found.to(torch.float64)
                for group, found in zip(groups, given, strict=True)
            ]
        )

    def prune(
        self, count: int, groups: Sequence[int] | None = None, caps: Sequence[int] | None = None
    ) -> None:
        """Prune ``count`` more units over ``groups`` (all: ``None``), lowest score first, each
        group keeping at least ``multiple_of`` units (one without it); with ``caps``, at most
        ``caps[i]`` more from ``groups[i]``. With ``multiple_of = n > 1`` up to ``n // 2`` units
        per group beyond those floors are absorbed by the rounding (see the module).

        Raises:
            ValueError: ``count`` would leave some group fewer units than it must keep.
        """
        chosen = list(range(len(self._ranked))) if groups is None else list(groups)
        kept = [~self._pruned(index) for index in chosen]
        least, limits = self._limits(chosen, [int(keep.sum()) for keep in kept], caps)
        if count > sum(limits):
            self._refuse_beyond(count, limits, chosen)
            count = sum(limits)  # every group at its floor: the rounding's width
        if count <= 0:
            return
        scores = [self._unit_scores(index) for index in chosen]
        labels = [self._ranked[index].name for index in chosen]
        keeps = [keep.clone() for keep in kept]
        select_in_place(self._method, count, scores, keeps, labels, limits, self._selection)
        if self._multiple > 1:
            keeps = [
                self._to_multiple(*row)
                for row in zip(kept, keeps, scores, labels, least, strict=True)
            ]
        self._write(chosen, kept, keeps)

    def check_reach(
        self, count: int, groups: Sequence[int] | None = None, caps: Sequence[int] | None = None
    ) -> None:
        """Raise what :meth:`prune` would refuse for ``count`` units of ``groups`` with none
        of them pruned yet, reading no mask and no score.

        Raises:
            ValueError: ``count`` would leave some group fewer units than it must keep.
        """
        chosen = list(range(len(self._ranked))) if groups is None else list(groups)
        _, limits = self._limits(chosen, [self._ranked[index].size for index in chosen], caps)
        if count > sum(limits):
            self._refuse_beyond(count, limits, chosen)

    def _limits(
        self, chosen: Sequence[int], widths: Sequence[int], caps: Sequence[int] | None
    ) -> tuple[list[int], list[int]]:
        """Per chosen group (of ``widths`` units unpruned), the fewest units it keeps and the
        most it can lose."""
        least = [max(self._multiple, self._ranked[index].min_kept) for index in chosen]
        if caps is not None:
            pairs = zip(widths, caps, least, strict=True)
            least = [max(floor, width - cap) for width, cap, floor in pairs]
        limits = [max(0, width - floor) for width, floor in zip(widths, least, strict=True)]
        return least, limits

    def _refuse_beyond(self, count: int, limits: Sequence[int], chosen: Sequence[int]) -> None:
        """Refuse ``count`` beyond ``limits`` unless the rounding to multiples absorbs it."""
        absorbed = (self._multiple // 2) * len(chosen)
        if count > sum(limits) + absorbed:
            self._refuse(count, sum(limits), absorbed, chosen)

    def _to_multiple(
        self, kept: Tensor, chosen: Tensor, scores: Tensor, label: str, least: int
    ) -> Tensor:
        """``chosen`` with its width rounded to a multiple, at least ``least``: the lowest units
        of ``kept`` pruned to the rounded width (see the module)."""
        width = kept_multiple(int(chosen.sum()), int(kept.sum()), self._multiple, least)
        if width == int(chosen.sum()):
            return chosen
        keep = kept.clone()
        count = int(kept.sum()) - width
        select_in_place(self._method, count, [scores], [keep], [label], None, self._selection)
        return keep

    def _refuse(self, count: int, most: int, absorbed: int, chosen: Sequence[int]) -> None:
        where = (
            f"group {self._ranked[chosen[0]].name!r} ({self._ranked[chosen[0]].size} units)"
            if len(chosen) == 1
            else f"{len(chosen)} groups of {sum(self._ranked[i].size for i in chosen)} units"
        )
        top_k = max(self._ranked[index].min_kept for index in chosen)
        if top_k > 1:
            raise ValueError(
                f"Expected a pruning step that leaves every mixture-of-experts layer its top_k "
                f"experts ({top_k}; at most {most} more from {where}), but the target asks for "
                f"{count} more: lower the target sparsity."
            )
        if self._multiple == 1:
            raise ValueError(
                f"Expected a pruning step that leaves every group at least 1 unit (at most "
                f"{most} more from {where}), but the target asks for {count} more: a group with "
                "no units left would cut the model; lower the target sparsity."
            )
        raise ValueError(
            f"Expected a pruning step that leaves every group at least {self._multiple} units "
            f"(multiple_of={self._multiple}: at most {most} more from {where}, and {absorbed} "
            f"more that rounding to multiples of {self._multiple} gives back), but the target asks "
            f"for {count} more: lower the target sparsity or `multiple_of`."
        )

    def _write(
        self, indices: Sequence[int], before: Sequence[Tensor], after: Sequence[Tensor]
    ) -> None:
        """Give the masking mode the element masks of the units newly pruned (under FSDP2 this
        rank's pieces, placed as the parameters are)."""
        masks: dict[str, Tensor] = {}
        for index, old, new in zip(indices, before, after, strict=True):
            if torch.equal(old, new):
                continue
            if self._sharded is not None:
                self._sharded.kept(index, new)
            offset = 0
            for group in self._ranked[index].groups:
                keep = new[offset : offset + group.size]
                offset += group.size
                for name, mask in self._expand(group, keep).items():
                    masks[name] = masks[name] & mask if name in masks else mask
        by_target: dict[str, tuple[Target, Tensor]] = {}
        for name, mask in masks.items():
            target = self._targets[name]
            held = by_target.get(target.name)
            by_target[target.name] = (target, mask if held is None else held[1] & mask)
        if not by_target:
            return
        targets = [target for target, _ in by_target.values()]
        keeps = [placed_like(mask, target.parameter()) for target, mask in by_target.values()]
        self._mode.prune_each(targets, keeps, _restrict)

    def _expand(self, group: UnitGroup, keep: Tensor) -> dict[str, Tensor]:
        """The element keep masks ``keep`` means (this rank's pieces under FSDP2)."""
        if self._sharded is not None:
            return self._sharded.keep_masks(group, keep)
        return expand_keep(group, keep, self._shapes)


def _restrict(index: int, new: Tensor, keep: Tensor) -> None:
    """The masking mode's clear step: keep only what both the held mask and ``new`` keep."""
    keep.logical_and_(new)
