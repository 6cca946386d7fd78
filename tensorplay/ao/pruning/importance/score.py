"""What an importance score is to the pruner: the :class:`Importance` protocol's base class.

The pruner asks its importance four things, always with its targets
(:class:`~tensorplay.ao.pruning.targets.tied.Target`, each parameter once):

* :meth:`Importance.bind` once, when the pruner is made: check the targets and install what
  the score observes (Wanda's forward hooks), raising before anything is installed; with a
  structure of units (``"channel"``, ``"head"``) it is also given the unit groups
  (:class:`UnitLayout`: a score that ranks units by what it observes of them needs to know
  where they are);
* :meth:`Importance.accumulate` once per optimizer step, from the gradients the optimizer is
  about to use (``Pruner.accumulate``, called by the hooks of ``Pruner.attach`` or by an
  adapter);
* :meth:`Importance.check_ready` then :meth:`Importance.scores` on a pruning step, the first
  raising before anything changes (no batch observed, no gradient seen);
* :meth:`Importance.after_pruning` after each pruning step (the score's reset rule).

A unit's score is the root mean square of the element scores over its slices, unless the score
gives the unit scores itself (:meth:`Importance.unit_scores`: ``"activation"`` does, from the
activations its units produce, which no element score can express exactly).

Its state (:meth:`Importance.state_dict`) is part of the pruner's, so a resumed run continues
its accumulation bit for bit.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(2, 1)
    >>> targets = [Target(("weight",), ((layer, "weight"),))]
    >>> score = Importance()
    >>> score.bind(targets)
    >>> score.scores(targets)[0].equal(layer.weight)
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["Importance", "UnitLayout", "UnitSlice"]


class UnitSlice(Protocol):
    """What a score reads of one slice of a unit group: unit ``u`` spans the indices
    ``offset + u * width`` up to ``offset + (u + 1) * width - 1`` along ``dim`` of the parameter
    named ``parameter`` (the structure's
    :class:`~tensorplay.ao.pruning.structured.dependency.unit_groups.Slice`)."""

    @property
    def parameter(self) -> str:
        """The parameter's qualified name."""

    @property
    def dim(self) -> int | None:
        """The dimension the units index (``None``: the whole tensor, one unit)."""

    @property
    def offset(self) -> int:
        """The first index of unit 0 along :attr:`dim`."""

    @property
    def width(self) -> int:
        """Indices per unit."""


class UnitLayout(Protocol):
    """What a score reads of a group of units (the structure's
    :class:`~tensorplay.ao.pruning.structured.dependency.unit_groups.UnitGroup`)."""

    @property
    def name(self) -> str:
        """The group's name (the module whose units these are)."""

    @property
    def kind(self) -> str:
        """``"channel"``, ``"head"``, ``"layer"`` or ``"expert"``."""

    @property
    def size(self) -> int:
        """Its units."""

    @property
    def slices(self) -> Sequence[UnitSlice]:
        """Every slice a unit spans."""


class Importance:
    """An importance score: by default a target's current unpruned values (magnitude).

    Subclasses set :attr:`name` (the ``importance=`` value) and override what they need.

    Args:
        dtype: The dtype of the score's accumulators (``torch.float32`` or ``torch.bfloat16``).

    Attributes:
        name: The ``importance=`` value that chooses the score.
        needs_gradients: Whether :meth:`accumulate` reads gradients (``Pruner.attach`` then
            hooks the optimizers for it, in either masking mode).
        structures: The ``structure=`` values the score ranks units of (``None``: any).
    """

    name: ClassVar[str] = "magnitude"
    needs_gradients: ClassVar[bool] = False
    structures: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype

    def bind(self, targets: Sequence[Target], units: Sequence[UnitLayout] = ()) -> None:
        """Check ``targets`` (and the unit groups ``units`` of a structure of units, none for
        single weights) and install what the score observes; raise before installing."""

    def accumulate(self, targets: Sequence[Target]) -> int:
        """Add one optimizer step's gradients of ``targets``; return how many had one."""
        del targets
        return 0

    def check_ready(self, targets: Sequence[Target]) -> None:
        """Raise, before a pruning step changes anything, if the scores cannot be computed."""

    def scores(self, targets: Sequence[Target]) -> list[Tensor]:
        """Each target's scores, of its shape (placed like it if sharded); the lowest are
        pruned first. Magnitude: the current unpruned values (the method takes ``|.|``)."""
        return [target.parameter().detach() for target in targets]

    def unit_scores(self, group: UnitLayout) -> Tensor | None:
        """One ``float64`` score per unit of ``group`` (one of the groups :meth:`bind` was
        given), lowest pruned first; ``None`` (the default): the unit's score is the root mean
        square of :meth:`scores` over its slices."""
        del group
        return None

    def after_pruning(self) -> None:
        """Called after each pruning step: reset what the score resets then."""

    def state_dict(self) -> dict[str, Any]:
        """The score's state as plain data and tensors by target name (``{}``: none)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any], targets: Sequence[Target]) -> None:
        """Restore :meth:`state_dict` (checked against ``targets``).

        Raises:
            ValueError: A state this score did not write.
        """
        if state:
            raise ValueError(
                f"Expected no importance state for importance={self.name!r}, but got keys "
                f"{sorted(state)}."
            )

    def close(self) -> None:
        """Remove what :meth:`bind` installed (the pruning is made permanent)."""
