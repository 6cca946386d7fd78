"""How a calibration batch runs through a model, for every one-shot pass that runs batches.

Example:
    >>> import torch
    >>> from torch import nn
    >>> run_batch(nn.Bilinear(2, 3, 1), (torch.ones(1, 2), torch.ones(1, 3))).shape
    torch.Size([1, 1])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

__all__ = ["Forward", "run_batch"]

Forward = Callable[[nn.Module, Any], Any]


def run_batch(model: nn.Module, batch: Any) -> Any:
    """``model(batch)``; ``model(*batch)`` for a tuple or list, ``model(**batch)`` for a mapping
    (see the module example)."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)
