"""Weight layouts: which axis of a target holds its output units (its rows).

``scope="row"`` compares the units of each output unit on their own, and Wanda scales each unit
by the norm of its *input* feature: both need to know how a layer stores its weight. This module
is the one place that knows:

* ``nn.Linear``, ``nn.Bilinear``, the convolutions ``nn.Conv1d/2d/3d``, ``nn.MultiheadAttention``'s
  projections: ``(out, in, ...)``, the output axis is 0;
* Hugging Face's ``Conv1D`` (GPT-2, matched by class name): ``(in, out)``, the output axis is 1
  (a "row" is a column of the stored tensor);
* the transposed convolutions ``nn.ConvTranspose1d/2d/3d``: ``(in, out / groups, ...)``, axis 1;
* anything else (an ``nn.Embedding`` tied to an LM head, a custom module): axis 0.

A tensor of fewer than two dimensions (a bias, a norm's weight) has no rows: it is one group.
A tied parameter takes the axis of the holders that compute with it (an embedding holder only
looks rows up, so it is skipped); holders that disagree are refused.

Example:
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(3, 2)
    >>> output_axis(Target(("weight",), ((layer, "weight"),)))
    0
"""

from __future__ import annotations

from torch import nn

from tensorplay.ao.pruning.pair import Pair
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["TRANSPOSED_CLASS_NAMES", "is_transposed", "output_axis"]

#: Modules whose weight is stored ``(in, out, ...)``, by class name (the core never imports
#: ``transformers``): Hugging Face's ``Conv1D`` and torch's transposed convolutions.
TRANSPOSED_CLASS_NAMES = ("Conv1D", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d")


def is_transposed(module: nn.Module) -> bool:
    """Whether ``module`` stores its weight ``(in, out, ...)`` (see :data:`TRANSPOSED_CLASS_NAMES`).

    Example:
        >>> from torch import nn
        >>> is_transposed(nn.Linear(2, 2)), is_transposed(nn.ConvTranspose2d(2, 2, 1))
        (False, True)
    """
    return any(cls.__name__ in TRANSPOSED_CLASS_NAMES for cls in type(module).__mro__)


def _axis(pair: Pair) -> int:
    module, name = pair
    return 1 if name == "weight" and is_transposed(module) else 0


def output_axis(target: Target) -> int | None:
    """The axis of ``target`` that holds its output units; ``None`` for a tensor of fewer than
    two dimensions (one group).

    Raises:
        ValueError: Holders of a tied parameter that store it in different layouts, naming them.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class Conv1D(nn.Module):  # Hugging Face's layout: (in, out)
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.weight = nn.Parameter(torch.zeros(4, 3))
        >>> layer = Conv1D()
        >>> output_axis(Target(("weight",), ((layer, "weight"),)))
        1
    """
    if target.parameter().dim() < 2:
        return None
    computing = [pair for pair in target.pairs if not isinstance(pair[0], nn.Embedding)]
    holders = computing or list(target.pairs)
    axes = {_axis(pair) for pair in holders}
    if len(axes) > 1:
        found = ", ".join(f"{type(m).__name__}.{n}: axis {_axis((m, n))}" for m, n in holders)
        raise ValueError(
            f"Expected the holders of the tied parameter {target.name!r} to store it in one "
            f"layout, but their output axes differ ({found}): scope='row' and Wanda cannot "
            "tell its rows."
        )
    return axes.pop()
