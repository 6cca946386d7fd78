"""The structure protocol: what one unit is, asked by the pruner, never string-tested.

A structure is made once per :class:`~tensorplay.ao.pruning.pruner.Pruner` from the model and the
tensors its selection chose. It says which tensors the pruner masks (:attr:`targets`), which of
them the importance scores (:attr:`scored`), hands a scope the unit space of a pruning step
(:meth:`PruningStructure.space`) and counts the units for reports. Each structure is one module of
this package and one line of :data:`~tensorplay.ao.pruning.structured.units.STRUCTURES`; the
configuration validates its options against it (:meth:`PruningStructure.check_options`).

Example:
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.structured.units import make_structure
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(4, 2)
    >>> structure = make_structure("element", layer, [Target(("weight",), ((layer, "weight"),))])
    >>> isinstance(structure, PruningStructure), [t.name for t in structure.targets]
    (True, ['weight'])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from torch import Tensor, nn

from tensorplay.ao.pruning.masking.mode import MaskingMode
from tensorplay.ao.pruning.masking.stats import TensorSparsity
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup
from tensorplay.ao.pruning.structured.units.space import UnitSpace
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["PruningStructure", "Scores", "UnitScores"]

Scores = Callable[[Sequence[Target]], list[Tensor]]
"""``targets -> one element score tensor each`` (the pruner's importance or ``importance_fn``)."""

UnitScores = Callable[[UnitGroup], Tensor | None]
"""``group -> one float64 score per unit``, or ``None`` where the unit's score is the root mean
square of its element scores
(:meth:`~tensorplay.ao.pruning.importance.score.Importance.unit_scores`)."""


@runtime_checkable
class PruningStructure(Protocol):
    """What a unit is, for one pruner.

    Attributes:
        name: The ``structure=`` value that chooses it.
        one_shot_scope: The scope :func:`~tensorplay.ao.pruning.pruner.one_shot.prune_one_shot` uses
            when none is given.
        targets: Every tensor the pruner masks, each parameter once.
        scored: The targets the importance observes and scores (a subset of :attr:`targets`).
        row_label: What one of :meth:`rows` is, heading the report's first column.
        notes: Lines the report shows under its table: the selected tensors the structure
            leaves dense (:mod:`~tensorplay.ao.pruning.structured.units.coverage`).
        groups: The unit groups it ranks, given to the importance when it is bound (none for
            single weights).
    """

    name: ClassVar[str]
    one_shot_scope: ClassVar[str]
    row_label: ClassVar[str]
    targets: list[Target]
    scored: list[Target]
    notes: tuple[str, ...]
    groups: tuple[UnitGroup, ...]

    def __init__(
        self,
        model: nn.Module,
        selected: Sequence[Target],
        example_inputs: Any = None,
        multiple_of: int = 1,
    ) -> None:
        """Find the units of ``model`` over the tensors the pruner's selection chose.

        Args:
            model: The model.
            selected: The tensors the selection chose.
            example_inputs: Inputs of a plain model's forward, for tracing.
            multiple_of: Kept widths are multiples of it.
        """

    @classmethod
    def check_options(
        cls, method: type[BasePruningMethod], scope: str, importance: str, multiple_of: int
    ) -> None:
        """Refuse, when the configuration is made, options this structure cannot prune with.

        Raises:
            ValueError: Naming the option and the value at fault.
        """

    def space(
        self,
        mode: MaskingMode,
        method: type[BasePruningMethod],
        scores: Scores,
        units: UnitScores | None = None,
    ) -> UnitSpace:
        """The units of one pruning step, as a scope ranks them (``units``: the scores of the
        groups' units where the importance gives them itself)."""

    def prune_own_count(
        self, mode: MaskingMode, method: type[BasePruningMethod], scores: Scores
    ) -> int:
        """Apply a method that decides its own count (an N:M method); the units newly pruned."""

    def rows(self, mode: MaskingMode, *, permanent: bool) -> list[TensorSparsity]:
        """One report row per group of units: its size and its pruned units, read now
        (``permanent``: from the zeros of the tensors, whose masks are gone)."""
