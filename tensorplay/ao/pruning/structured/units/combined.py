"""Several kinds of units at once: ``structure=("channel", "head")``.

:class:`CombinedStructure` builds the structure of each kind
(:mod:`~tensorplay.ao.pruning.structured.units.structured`) and hands the scopes one
:class:`~tensorplay.ao.pruning.structured.units.unit_space.StructuredSpace` holding the groups of
all of them. Units of different kinds hold different numbers of parameters and their scores have
different scales, so a combined structure prunes to a parameter budget only (``target_params=``),
which ranks them by standardised score per parameter removed
(:mod:`~tensorplay.ao.pruning.structured.units.budget`). Kinds whose units overlap (a ``"layer"``
holds its heads and channels) are refused.

Example:
    >>> import sys; sys.path.insert(0, "tests")
    >>> from hf_models import tiny_llama
    >>> from tensorplay.ao.pruning.parity.aliases import alias_map
    >>> from tensorplay.ao.pruning.masking import masking_mode
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> model = tiny_llama()
    >>> tied = alias_map(model)
    >>> selected = [Target(tied[n].names, tied[n].pairs) for n, _ in model.named_parameters()]
    >>> combined = CombinedStructure(("channel", "head"), model, selected)
    >>> rows = combined.rows(masking_mode("inplace"), permanent=False)
    >>> len(combined.targets), [row.name for row in rows][:2]
    (21, ['model.layers.0.mlp', 'model.layers.1.mlp'])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from torch import nn

from tensorplay.ao.pruning.masking.mode import MaskingMode
from tensorplay.ao.pruning.masking.stats import TensorSparsity
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.structured.units.structure import Scores, UnitScores
from tensorplay.ao.pruning.structured.units.structured import (
    ChannelStructure,
    HeadStructure,
    LayerStructure,
    UnitStructure,
)
from tensorplay.ao.pruning.structured.units.unit_space import StructuredSpace
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["COMBINABLE", "CombinedStructure", "check_kinds"]

COMBINABLE: dict[str, type[UnitStructure]] = {
    kind.name: kind for kind in (ChannelStructure, HeadStructure, LayerStructure)
}
"""The kinds a tuple may name."""


def check_kinds(kinds: Sequence[object]) -> tuple[str, ...]:
    """``kinds`` as a tuple of distinct combinable kinds, none overlapping another.

    Raises:
        ValueError: An empty tuple, an unknown or repeated kind, ``"layer"`` with another.

    Example:
        >>> check_kinds(["channel", "head"])
        ('channel', 'head')
    """
    found = tuple(kinds)
    if not found or any(kind not in COMBINABLE for kind in found) or len(set(found)) < len(found):
        raise ValueError(
            "Expected `structure` as a tuple to name distinct kinds among 'channel', 'head' "
            f"and 'layer', but got {found!r}."
        )
    if "layer" in found and len(found) > 1:
        raise ValueError(
            f"Expected kinds whose units are disjoint, but got {found!r}: a 'layer' holds its "
            "heads and channels."
        )
    return found  # type: ignore[return-value]  # every item is a checked str


class CombinedStructure:
    """The units of several kinds (see the module).

    Args:
        kinds: The kinds (:func:`check_kinds`).
        model: The model.
        selected: The tensors the pruner's selection chose.
        example_inputs: Inputs of a plain model's forward, for tracing.
        multiple_of: Kept widths are multiples of it.

    Raises:
        ValueError: As :func:`check_kinds` and each kind's structure.
    """

    name: ClassVar[str] = "combined"
    one_shot_scope: ClassVar[str] = "global"
    row_label: ClassVar[str] = "unit group"

    def __init__(
        self,
        kinds: Sequence[str],
        model: nn.Module,
        selected: Sequence[Target],
        example_inputs: Any = None,
        multiple_of: int = 1,
    ) -> None:
        self.kinds = check_kinds(kinds)
        self._parts = [
            COMBINABLE[kind](model, selected, example_inputs, multiple_of) for kind in self.kinds
        ]
        found = {target.name: target for part in self._parts for target in part.targets}
        self.targets = list(found.values())
        scored = {target.name: target for part in self._parts for target in part.scored}
        self.scored = list(scored.values())
        self.notes = tuple(note for part in self._parts for note in part.notes)
        self.groups = tuple(group for part in self._parts for group in part.groups)

    @classmethod
    def check_options(
        cls, method: type[BasePruningMethod], scope: str, importance: str, multiple_of: int
    ) -> None:
        """As every unit structure
        (:meth:`~tensorplay.ao.pruning.structured.units.structured.UnitStructure.check_options`)."""
        ChannelStructure.check_options(method, scope, importance, multiple_of)

    def space(
        self,
        mode: MaskingMode,
        method: type[BasePruningMethod],
        scores: Scores,
        units: UnitScores | None = None,
    ) -> StructuredSpace:
        """The groups of every kind in one space."""
        spaces = [part.space(mode, method, scores, units) for part in self._parts]
        return StructuredSpace.joined(spaces)

    def prune_own_count(
        self, mode: MaskingMode, method: type[BasePruningMethod], scores: Scores
    ) -> int:
        """Refused, as by every unit structure."""
        return self._parts[0].prune_own_count(mode, method, scores)

    def rows(self, mode: MaskingMode, *, permanent: bool) -> list[TensorSparsity]:
        """The rows of every kind, in the order of :attr:`kinds`."""
        return [row for part in self._parts for row in part.rows(mode, permanent=permanent)]
