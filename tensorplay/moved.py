"""Module paths of earlier tensorplay releases, still importable where the code now lives.

The library's modules were regrouped into packages, one per concept (see the contributors' map
in the docs). Every dotted path a user may have written (a LightningCLI ``class_path`` such as
``tensorplay.ao.pruning.schedules.CubicSchedule``, an import in a script, a pickled object in a
checkpoint) still imports: :data:`MOVED` maps each earlier module path to the module that holds
its code now, and :class:`MovedModuleFinder` answers an import of the earlier path with that
module itself, so both paths give the same objects.

Example:
    >>> import tensorplay.ao.pruning.schedules as earlier
    >>> from tensorplay.ao.pruning.pruner import schedules
    >>> earlier is schedules
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "MovedModuleFinder", "install"]

_P = "tensorplay.ao.pruning."
_C = "tensorplay.callbacks."

#: Each earlier module path and the module that holds its code now.
MOVED: dict[str, str] = {
    **{
        _P + old: _P + new
        for old, new in {
            "aliases": "parity.aliases",
            "amount": "parity.amount",
            "attached_optimizers": "pruner.attached_optimizers",
            "base": "parity.base",
            "batches": "calibration.batches",
            "checkpoint": "masking.restore",
            "collapse": "parity.collapse",
            "config": "pruner.config",
            "dense_copy": "distillation.dense_copy",
            "dependency": "structured.dependency",
            "dtensor_targets": "selection.shards",
            "global_pruning": "parity.global_unstructured",
            "layouts": "targets.layouts",
            "method_selection": "parity.method_selection",
            "methods": "parity.methods",
            "one_shot": "pruner.one_shot",
            "permanent_saves": "saving.permanent_saves",
            "pruner_optimizers": "pruner.optimizers",
            "pruner_state": "pruner.state",
            "pruner_targets": "pruner.selected_targets",
            "pruner.budget_target": "structured.units.budget_target",
            "reconstruction": "structured.reconstruction",
            "reparametrization": "parity.reparametrization",
            "rewind": "pruner.rewind",
            "row_pruning": "structured.units.row_pruning",
            "schedules": "pruner.schedules",
            "scopes": "pruner.scopes",
            "scopes.space": "structured.units.space",
            "scores": "importance.target_scores",
            "seeding": "pruner.seeding",
            "serialization": "masking.permanent",
            "sharded_copy": "distillation.sharded_copy",
            "shrinking": "structured.shrinking",
            "shrinking.saved_masks": "masking.saved_masks",
            "sparse_export": "saving.sparse_export",
            "spent": "edits.spent",
            "stats": "masking.stats",
            "structures": "structured.units",
            "tied_targets": "targets.tied",
        }.items()
    },
    _C + "_distilling": _C + "core.distilling",
    _C + "_example_inputs": _C + "core.example_inputs",
    _C + "_fsdp2_config": _C + "core.fsdp2_config",
    _C + "_hf_sharding": _C + "transformers.sharded_setups",
    _C + "_json_state": _C + "transformers.json_state",
    _C + "_lifecycle": _C + "core.lifecycle",
    _C + "_loading": _C + "lightning.loading",
    _C + "_metrics": _C + "core.metrics",
    _C + "_sharded_teacher": _C + "lightning.sharded_teacher",
    _C + "_state": _C + "core.state_keys",
    _C + "_strategies": _C + "lightning.strategies",
    _C + "pruning": _C + "lightning.gradual_pruning",
}


def new_name(name: str) -> str | None:
    """Where the earlier module ``name`` lives now, or ``None`` if it did not move.

    A module inside a moved package moved with it (``...dependency.graph`` is
    ``...structured.dependency.graph``) unless it has an entry of its own.

    Example:
        >>> new_name("tensorplay.ao.pruning.dependency.graph")
        'tensorplay.ao.pruning.structured.dependency.graph'
        >>> new_name("tensorplay.ao.pruning.masking.lean") is None
        True
    """
    head, tail = name, ""
    while head:
        if head in MOVED:
            return MOVED[head] + tail
        head, _, last = head.rpartition(".")
        tail = f".{last}{tail}"
    return None


class _Alias(importlib.abc.Loader):
    """Loads an earlier path as the module that holds its code now (one object, two names)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran under its own name."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds each earlier module path of :data:`MOVED` as the module that holds it now.

    Example:
        >>> spec = MovedModuleFinder().find_spec("tensorplay.callbacks.pruning", None)
        >>> spec.name, spec.loader.target
        ('tensorplay.callbacks.pruning', 'tensorplay.callbacks.lightning.gradual_pruning')
    """

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec whose loader gives the module's new home, for a moved path; else ``None``."""
        moved = new_name(fullname) if fullname.startswith("tensorplay.") else None
        if moved is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(moved))


def install() -> None:
    """Put :class:`MovedModuleFinder` on ``sys.meta_path`` once (``import tensorplay`` does).

    Example:
        >>> install()
        >>> sum(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path)
        1
    """
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        # First: a module inside a moved package must not be found again, as a second module
        # object, through the new package's path.
        sys.meta_path.insert(0, MovedModuleFinder())
