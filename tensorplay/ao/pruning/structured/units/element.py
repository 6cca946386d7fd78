"""The element structure: one unit per weight, one group per target.

:class:`ElementStructure` (``structure="element"``, the default) masks the tensors the selection
chose, scores them all and counts their weights. :class:`ElementSpace` is the
:class:`~tensorplay.ao.pruning.structured.units.space.UnitSpace` (and
:class:`~tensorplay.ao.pruning.structured.units.space.RowSpace`) of a pruning step: its groups are
the pruner's targets, its keys the targets' scores (computed once per step, on first use, by the
pruner's importance or ``importance_fn``), and pruning goes to the masking mode, which holds the
masks. It also applies a method that decides its own count (an N:M method) to each target.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.masking import masking_mode
    >>> from tensorplay.ao.pruning.parity.methods import L1Unstructured
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> first, second = nn.Linear(4, 2), nn.Linear(2, 2)
    >>> targets = [Target(("a",), ((first, "weight"),)), Target(("b",), ((second, "weight"),))]
    >>> scores = lambda chosen: [t.parameter().detach() for t in chosen]
    >>> space = ElementSpace(targets, masking_mode("reparametrize"), L1Unstructured, scores)
    >>> space.prune(3, groups=[1]), space.pruned()
    (None, [0, 3])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from torch import Tensor, nn

from tensorplay.ao.pruning.masking.mode import MaskingMode
from tensorplay.ao.pruning.masking.stats import TensorSparsity
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.selection.shards import global_zeros
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup
from tensorplay.ao.pruning.structured.units.row_pruning import prune_rows
from tensorplay.ao.pruning.structured.units.structure import Scores, UnitScores
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["ElementSpace", "ElementStructure"]


class ElementStructure:
    """``structure="element"``: every selected tensor is a group of single weights.

    Args:
        model: The model (unused: the selection found the tensors).
        selected: The tensors the pruner's selection chose.
        example_inputs: Must be ``None``: single weights need no tracing.
        multiple_of: Must be 1: single weights have no widths.

    Raises:
        ValueError: ``example_inputs`` given.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.masking import masking_mode
        >>> layer = nn.Linear(4, 2)
        >>> structure = ElementStructure(layer, [Target(("weight",), ((layer, "weight"),))])
        >>> [(row.name, row.numel, row.pruned) for row in structure.rows(
        ...     masking_mode("inplace"), permanent=False)]
        [('weight', 8, 0)]
    """

    name: ClassVar[str] = "element"
    one_shot_scope: ClassVar[str] = "row"
    row_label: ClassVar[str] = "tensor"

    def __init__(
        self,
        model: nn.Module,
        selected: Sequence[Target],
        example_inputs: Any = None,
        multiple_of: int = 1,
    ) -> None:
        if example_inputs is not None:
            raise ValueError(
                "Expected `example_inputs` only with a structure of channels, heads or layers "
                "(they trace a plain model), but got them with structure='element', which "
                "needs none."
            )
        self.targets = list(selected)
        self.scored = self.targets
        self.notes: tuple[str, ...] = ()  # every selected tensor is pruned
        self.groups: tuple[UnitGroup, ...] = ()

    @classmethod
    def check_options(
        cls, method: type[BasePruningMethod], scope: str, importance: str, multiple_of: int
    ) -> None:
        """Refuse ``multiple_of`` other than 1.

        Raises:
            ValueError: ``multiple_of`` > 1.
        """
        if multiple_of != 1:
            raise ValueError(
                f"Expected `multiple_of` to be 1 with structure='element', but got {multiple_of}: "
                "kept widths are multiples with structure='channel' or 'head'."
            )

    def space(
        self,
        mode: MaskingMode,
        method: type[BasePruningMethod],
        scores: Scores,
        units: UnitScores | None = None,
    ) -> ElementSpace:
        """The targets as :class:`ElementSpace` (single weights: no unit scores)."""
        del units
        return ElementSpace(self.targets, mode, method, scores)

    def prune_own_count(
        self, mode: MaskingMode, method: type[BasePruningMethod], scores: Scores
    ) -> int:
        """:meth:`ElementSpace.prune_own_count`."""
        return self.space(mode, method, scores).prune_own_count()

    def rows(self, mode: MaskingMode, *, permanent: bool) -> list[TensorSparsity]:
        """Per target, its weights and those pruned as the weights hold them (once permanent,
        the zeros of the tensor itself)."""
        params = [target.parameter() for target in self.targets]
        pruned = global_zeros(params) if permanent else mode.pruned_counts(self.targets)
        return [
            TensorSparsity(target.name, tuple(param.shape), param.numel(), count)
            for target, param, count in zip(self.targets, params, pruned, strict=True)
        ]


class ElementSpace:
    """The targets as groups of single weights (see the module).

    Args:
        targets: The pruner's targets.
        mode: The masking mode that holds their masks.
        method: The pruning method whose keys order the units.
        scores: ``targets -> one score tensor each``, called once, on first use.
    """

    def __init__(
        self,
        targets: Sequence[Target],
        mode: MaskingMode,
        method: type[BasePruningMethod],
        scores: Scores,
    ) -> None:
        self._targets = list(targets)
        self._mode = mode
        self._method = method
        self._score = scores
        self._scores: list[Tensor] | None = None
        self.names = [target.name for target in self._targets]
        self.collapse_share = 0.0  # a target can be emptied: warn when it is
        self.has_floors = False

    def numels(self) -> list[int]:
        """Per target, its weights."""
        return [target.parameter().numel() for target in self._targets]

    def pruned(self) -> list[int]:
        """Per target, the zeros of its mask (within a step, whose weights were just checked)."""
        return self._mode.pruned_counts(self._targets, read_weights=False)

    def scores(self) -> list[Tensor]:
        """The targets' scores, computed on the first call of this step."""
        if self._scores is None:
            self._scores = self._score(self._targets)
        return self._scores

    def prune(
        self, count: int, groups: Sequence[int] | None = None, caps: Sequence[int] | None = None
    ) -> None:
        """Prune ``count`` more weights over the targets ``groups`` (all: ``None``)."""
        chosen = range(len(self._targets)) if groups is None else groups
        targets = [self._targets[i] for i in chosen]
        scores = [self.scores()[i] for i in chosen]
        self._mode.prune(targets, scores, self._method, count, caps)

    def check_reach(
        self, count: int, groups: Sequence[int] | None = None, caps: Sequence[int] | None = None
    ) -> None:
        """Nothing to refuse: a tensor of single weights may be pruned whole (a global step
        warns of it: :mod:`~tensorplay.ao.pruning.parity.collapse`)."""

    def prune_rows(self, target: float, min_density: float) -> None:
        """Prune every output row of every target to ``target`` sparsity
        (:func:`~tensorplay.ao.pruning.structured.units.row_pruning.prune_rows`)."""
        prune_rows(self._mode, self._targets, self.scores(), self._method, target, min_density)

    def prune_own_count(self) -> int:
        """Apply a method that decides its own count to each target on its own (the units
        already pruned stay pruned); the units newly pruned."""
        before = sum(self.pruned())
        self._mode.prune_own_count(self._targets, self.scores(), self._method)
        return sum(self.pruned()) - before
