"""Scopes: where a pruning step's units compete, one module each behind one protocol.

* :mod:`~tensorplay.ao.pruning.pruner.scopes.scope`: the :class:`PruningScope` protocol, what the
  pruner asks of a scope;
* :mod:`~tensorplay.ao.pruning.structured.units.space`: the :class:`UnitSpace` it ranks (what a unit
  is is the structure's business, not the scope's);
* :mod:`~tensorplay.ao.pruning.pruner.scopes.global_`,
  :mod:`~tensorplay.ao.pruning.pruner.scopes.layerwise`,
  :mod:`~tensorplay.ao.pruning.pruner.scopes.row`: ``"global"``, ``"layerwise"``, ``"row"``.

:data:`SCOPES` is the one table a ``scope=`` string is looked up in: the configuration checks
names and methods against it and :func:`make_scope` builds the pruner's. A new scope is one
module and one line here.

Example:
    >>> sorted(SCOPES), type(make_scope("global", 0.1)).__name__
    (['global', 'layerwise', 'row'], 'GlobalScope')
"""

from __future__ import annotations

from tensorplay.ao.pruning.pruner.scopes.global_ import GlobalScope
from tensorplay.ao.pruning.pruner.scopes.layerwise import LayerwiseScope
from tensorplay.ao.pruning.pruner.scopes.row import RowScope
from tensorplay.ao.pruning.pruner.scopes.scope import PruningScope
from tensorplay.ao.pruning.structured.units.space import RowSpace, UnitSpace

__all__ = [
    "SCOPES",
    "GlobalScope",
    "LayerwiseScope",
    "PruningScope",
    "RowScope",
    "RowSpace",
    "UnitSpace",
    "make_scope",
    "scope_choices",
]

SCOPES: dict[str, type[PruningScope]] = {
    GlobalScope.name: GlobalScope,
    LayerwiseScope.name: LayerwiseScope,
    RowScope.name: RowScope,
}
"""Each ``scope=`` value and its class; a new scope is one more entry."""


def scope_choices() -> str:
    """The ``scope=`` values as an error lists them: ``'global', 'layerwise' or 'row'``.

    Example:
        >>> scope_choices()
        "'global', 'layerwise' or 'row'"
    """
    names = [repr(name) for name in SCOPES]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def make_scope(name: str, min_density: float) -> PruningScope:
    """A new scope object for ``scope=name`` (checked by ``PrunerConfig``).

    Raises:
        ValueError: An unknown name.
    """
    kind = SCOPES.get(name)
    if kind is None:
        raise ValueError(f"Expected `scope` to be {scope_choices()}, but got {name!r}.")
    return kind(min_density)
