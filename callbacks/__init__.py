"""Training-framework plugins for tensorplay, imported as ``tensorplay.callbacks``.

Each plugin needs only its own framework, so this package imports them lazily (PEP 562):
``from tensorplay.callbacks import GradualPruning`` imports Lightning (the ``lightning`` extra,
``pip install "tensorplay[lightning]"``), ``import tensorplay.callbacks.transformers`` imports
only ``transformers`` (the ``transformers`` extra).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core.lifecycle import PruningRollbackWarning
    from .lightning.gradual_pruning import GradualPruning
    from .lightning.loading import PrunableMixin
    from .transformers.gradual_pruning_callback import GradualPruningCallback

__all__ = [
    # training: Lightning
    "GradualPruning",
    # training: the Hugging Face Trainer
    "GradualPruningCallback",
    # loading
    "PrunableMixin",
    "PruningRollbackWarning",
]

# The module of each name, imported on first use.
_MODULES = {
    "GradualPruning": "tensorplay.callbacks.lightning.gradual_pruning",
    "GradualPruningCallback": "tensorplay.callbacks.transformers",
    "PrunableMixin": "tensorplay.callbacks.lightning.loading",
    "PruningRollbackWarning": "tensorplay.callbacks.core.lifecycle",
}


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULES[name]), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
