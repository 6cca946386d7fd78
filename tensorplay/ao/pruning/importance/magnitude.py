"""``importance="magnitude"`` (the default): rank by the current unpruned values.

The pruning method orders them (``l1_unstructured``: by ``|w|``), exactly as before importance
scores existed: no state, no hooks.

Example:
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(2, 1)
    >>> targets = [Target(("weight",), ((layer, "weight"),))]
    >>> Magnitude().scores(targets)[0].equal(layer.weight)
    True
"""

from __future__ import annotations

from typing import ClassVar

from tensorplay.ao.pruning.importance.score import Importance

__all__ = ["Magnitude"]


class Magnitude(Importance):
    """The weights themselves (see the module docstring)."""

    name: ClassVar[str] = "magnitude"
