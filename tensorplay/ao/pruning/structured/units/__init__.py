"""Structures: what one unit is, as the scopes rank it
(:mod:`~tensorplay.ao.pruning.pruner.scopes`).

* :mod:`~tensorplay.ao.pruning.structured.units.structure`: the :class:`PruningStructure` protocol,
  what the pruner asks of a structure;
* :mod:`~tensorplay.ao.pruning.structured.units.element`: ``"element"``, a single weight (the
  default): the targets are the groups, the importance scores the keys;
* :mod:`~tensorplay.ao.pruning.structured.units.structured`: ``"channel"``, ``"head"`` and
  ``"layer"``, one implementation over the dependency graph's units, three lines below; their
  unit space is :mod:`~tensorplay.ao.pruning.structured.units.unit_space`;
* :mod:`~tensorplay.ao.pruning.structured.units.combined`: a tuple of kinds,
  ``structure=("channel", "head")``, ranked together against a parameter budget
  (:mod:`~tensorplay.ao.pruning.structured.units.budget`);
* :mod:`~tensorplay.ao.pruning.structured.units.experts`: ``"expert"``, one expert of a
  mixture-of-experts layer, never routed to once masked
  (:mod:`~tensorplay.ao.pruning.structured.units.routing`);
* :mod:`~tensorplay.ao.pruning.structured.units.hidden`: ``"hidden"``, one channel of the
  residual stream, its norms normalising the kept channels while masked
  (:mod:`~tensorplay.ao.pruning.structured.units.stream_norms`).

:data:`STRUCTURES` is the one table a ``structure=`` string is looked up in: the configuration
checks names and options against it and :func:`make_structure` builds the pruner's. A new
structure is one module and one line here.

Example:
    >>> sorted(STRUCTURES)
    ['channel', 'element', 'expert', 'head', 'hidden', 'layer']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from tensorplay.ao.pruning.structured.units.combined import CombinedStructure
from tensorplay.ao.pruning.structured.units.element import ElementSpace, ElementStructure
from tensorplay.ao.pruning.structured.units.experts import ExpertStructure
from tensorplay.ao.pruning.structured.units.hidden import HiddenStructure
from tensorplay.ao.pruning.structured.units.structure import PruningStructure
from tensorplay.ao.pruning.structured.units.structured import (
    ChannelStructure,
    HeadStructure,
    LayerStructure,
)
from tensorplay.ao.pruning.targets.tied import Target

__all__ = [
    "STRUCTURES",
    "ElementSpace",
    "ElementStructure",
    "PruningStructure",
    "make_structure",
    "structure_choices",
]

STRUCTURES: dict[str, type[PruningStructure]] = {
    ElementStructure.name: ElementStructure,
    ChannelStructure.name: ChannelStructure,
    HeadStructure.name: HeadStructure,
    LayerStructure.name: LayerStructure,
    ExpertStructure.name: ExpertStructure,
    HiddenStructure.name: HiddenStructure,
}
"""Each ``structure=`` value and its class; a new structure is one more entry."""


def structure_choices() -> str:
    """The ``structure=`` values as an error lists them.

    Example:
        >>> structure_choices()
        "'element', 'channel', 'head', 'layer', 'expert' or 'hidden'"
    """
    names = [repr(name) for name in STRUCTURES]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def make_structure(
    name: str | tuple[str, ...],
    model: nn.Module,
    selected: Sequence[Target],
    example_inputs: Any = None,
    multiple_of: int = 1,
) -> PruningStructure:
    """The structure ``name`` of ``model`` over the ``selected`` tensors (see each class); a
    tuple of kinds: their
    :class:`~tensorplay.ao.pruning.structured.units.combined.CombinedStructure`.

    Raises:
        ValueError: An unknown name; as the structure.
    """
    if isinstance(name, tuple):
        return CombinedStructure(name, model, selected, example_inputs, multiple_of)
    kind = STRUCTURES.get(name)
    if kind is None:
        raise ValueError(f"Expected `structure` to be {structure_choices()}, but got {name!r}.")
    return kind(model, selected, example_inputs, multiple_of)
