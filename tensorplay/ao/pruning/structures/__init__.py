"""Structures: what one unit is, as the scopes rank it (:mod:`~tensorplay.ao.pruning.scopes`).

* :mod:`~tensorplay.ao.pruning.structures.element`: a single weight (today's only structure):
  the targets are the groups, the importance scores the keys, the masking mode the masks.

A structured unit (a channel with every slice that depends on it, a head, a layer) would be
one more module here: a :class:`~tensorplay.ao.pruning.scopes.units.UnitSpace` whose groups,
counts and scores come from a dependency description of the model, and whose ``prune`` expands
the chosen units back to the slices' masks. The scopes need no change for it.
"""

from __future__ import annotations

from tensorplay.ao.pruning.structures.element import ElementSpace

__all__ = ["ElementSpace"]
