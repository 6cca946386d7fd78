"""``importance="taylor"``: first-order Taylor importance (Molchanov et al. 2019).

The score of a weight is ``sum_t |w_t * dL/dw_t|`` over the optimizer steps since the last
pruning step: the first-order estimate of the change in loss if the weight were removed, taken
in absolute value **per step** and summed (so steps whose terms have opposite signs do not
cancel). Molchanov et al. ("Importance Estimation for Neural Network Pruning", CVPR 2019) score a
parameter by ``(g_m w_m)^2`` per minibatch and average over the minibatches between pruning
iterations; ``|g w|`` orders a single step's units exactly as ``(g w)^2``, and its sum weighs
the steps linearly instead of quadratically (a different, stated, ranking over several steps).

**Reset after each pruning step**, as in Molchanov et al.'s iterative procedure (importance
accumulated over the minibatches between pruning iterations, then pruned, then accumulated
afresh on the pruned network).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(2, 1, bias=False)
    >>> targets = [Target(("weight",), ((layer, "weight"),))]
    >>> layer.weight.data = torch.tensor([[1.0, -2.0]])
    >>> score = Taylor()
    >>> for grad in ([[0.5, 0.5]], [[-0.5, 0.25]]):
    ...     layer.weight.grad = torch.tensor(grad)
    ...     _ = score.accumulate(targets)
    >>> score.scores(targets)[0].tolist()
    [[1.0, 1.5]]
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from tensorplay.ao.pruning.importance.gradients import GradientScore

__all__ = ["Taylor"]


class Taylor(GradientScore):
    """``sum_t |w_t * g_t|``, reset after each pruning step (the module docstring)."""

    name: ClassVar[str] = "taylor"
    resets: ClassVar[bool] = True

    def add(self, total: Tensor, weight: Tensor, grad: Tensor) -> None:
        """``total += |weight * grad|``."""
        total.add_(torch.mul(weight, grad).abs_())
