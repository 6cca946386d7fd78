"""The score a one-shot pruning ranks a structure's units by when none is given.

Each structure may name its own (activations for the hidden size, REAP for experts); channels
are ranked by Wanda, except in a model with routed experts, where magnitude ranks them: Wanda
scales each weight by its layer's input norms, and the inputs of a fused experts tensor differ
per expert.

Example:
    >>> one_shot_importance("expert")
    'reap'
"""

from __future__ import annotations

from torch import nn

from tensorplay.ao.pruning.structured.units import STRUCTURES
from tensorplay.ao.pruning.structured.units.measures import routed_experts

__all__ = ["one_shot_importance"]


def one_shot_importance(structure: str | tuple[str, ...], model: nn.Module | None = None) -> str:
    """The score :func:`prune_one_shot` ranks ``structure``'s units by when none is given:
    the structure's own (activations for ``"hidden"``, REAP for ``"expert"``); magnitude for
    channels of a ``model`` with routed experts (Wanda scales by a layer's input norms, and
    the inputs of a fused experts tensor differ per expert); else Wanda.

    Example:
        >>> import sys; sys.path.insert(0, "tests")
        >>> from moe_models import tiny_qwen3_moe
        >>> one_shot_importance("hidden"), one_shot_importance("channel")
        ('activation', 'wanda')
        >>> one_shot_importance("channel", tiny_qwen3_moe())
        'magnitude'
    """
    kind = STRUCTURES.get(structure) if isinstance(structure, str) else STRUCTURES["channel"]
    own = getattr(kind, "one_shot_importance", None)
    if own is not None:
        return str(own)
    kinds = structure if isinstance(structure, tuple) else (structure,)
    if model is not None and "channel" in kinds and _has_routed_experts(model):
        return "magnitude"
    return "wanda"


def _has_routed_experts(model: nn.Module) -> bool:
    try:
        return bool(routed_experts(model))
    except ValueError:  # experts named but not found: the pruner says so when it is built
        return False
