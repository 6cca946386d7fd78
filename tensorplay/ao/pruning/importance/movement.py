"""``importance="movement"``: movement pruning (Sanh, Wolf & Rush 2020).

The score of a weight is ``S = -sum_t w_t * dL/dw_t`` over the optimizer steps (the first-order
estimate of how much the loss falls when the weight moves away from zero): a weight that
training pushes towards zero gets a low score and is pruned first, whatever its magnitude. The
ranking is by the *signed* score (the lowest, most negative, first), not by ``|S|``.

Accumulated once per optimizer step and **never reset**: in Sanh et al.'s hard movement pruning
the scores ``S`` accumulate over the whole fine-tuning while the masks are recomputed from them
(their Eq. 5, ``S = -alpha_S * sum_t (dL/dW)^(t) W^(t)``), so a weight's history is not lost at a
pruning event.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(2, 1, bias=False)
    >>> targets = [Target(("weight",), ((layer, "weight"),))]
    >>> layer.weight.data = torch.tensor([[1.0, -2.0]])
    >>> layer.weight.grad = torch.tensor([[0.5, 0.5]])
    >>> score = Movement()
    >>> score.accumulate(targets)
    1
    >>> score.totals()["weight"].tolist()
    [[-0.5, 1.0]]
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from tensorplay.ao.pruning.importance.gradients import GradientScore
from tensorplay.ao.pruning.importance.order import ordered

__all__ = ["Movement"]


class Movement(GradientScore):
    """``-sum_t w_t * g_t``, ranked by its signed value, never reset (the module docstring)."""

    name: ClassVar[str] = "movement"
    resets: ClassVar[bool] = False

    def add(self, total: Tensor, weight: Tensor, grad: Tensor) -> None:
        """``total -= weight * grad``."""
        total.addcmul_(weight, grad, value=-1)

    def rank(self, total: Tensor) -> Tensor:
        """Keys ordered as the signed totals (:mod:`~tensorplay.ao.pruning.importance.order`)."""
        return ordered(total)
