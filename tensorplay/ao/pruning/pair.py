"""``Pair``: a tensor as ``torch.nn.utils.prune`` names it, the ``(module, name)`` that holds it.

The one alias every module of the core uses for it.

Example:
    >>> from torch import nn
    >>> layer = nn.Linear(2, 2)
    >>> pair: Pair = (layer, "weight")
    >>> getattr(*pair) is layer.weight
    True
"""

from __future__ import annotations

from torch import nn

__all__ = ["Pair"]

Pair = tuple[nn.Module, str]
"""``(module, name)``: the tensor ``module.<name>``."""
