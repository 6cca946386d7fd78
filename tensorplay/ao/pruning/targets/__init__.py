"""What is pruned: parameters chosen by module type and name, each once with all its holders.

:mod:`~tensorplay.ao.pruning.targets.parameters` chooses the parameters (and resolves a pruning
method by name), :mod:`~tensorplay.ao.pruning.targets.tied` is one parameter with every
``(module, name)`` that reaches it, :mod:`~tensorplay.ao.pruning.targets.layouts` says which axis
holds a target's output units.
"""

from tensorplay.ao.pruning.targets.parameters import (
    DEFAULT_MODULE_TYPES,
    DEFAULT_NAMES,
    KEEP_DENSE,
    KeepDense,
    ModuleType,
    SelectionWarning,
    check_exclusive,
    check_selection_args,
    method_name,
    owner,
    resolve_method,
    resolve_parameters,
    select_parameters,
)

__all__ = [
    "DEFAULT_MODULE_TYPES",
    "DEFAULT_NAMES",
    "KEEP_DENSE",
    "KeepDense",
    "ModuleType",
    "SelectionWarning",
    "check_exclusive",
    "check_selection_args",
    "method_name",
    "owner",
    "resolve_method",
    "resolve_parameters",
    "select_parameters",
]
