"""The optimizer step pre-hook that accumulates a gradient score once per optimizer step.

``Pruner.attach`` wraps the masking mode's hooks (or none: the reparametrization needs none) in
a :class:`GradientHooks` when the pruner's importance reads gradients: before each step of the
optimizer, after the mode's own pre-hook has masked the gradients, it calls the pruner's
accumulation for the targets that optimizer holds. A step is counted once whatever the number of
backward passes before it (gradient accumulation), and a step an AMP ``GradScaler`` skips is not
counted (its ``optimizer.step()`` never runs); the scaler unscales the gradients before calling
it.

Not for a loop whose ``optimizer.step(closure)`` runs the backward inside the step (Lightning's
automatic optimization): there the hook would see the previous gradients; such an adapter
attaches with ``accumulate=False`` and calls ``Pruner.accumulate()`` itself once the gradients
are final (the Lightning callback does, in ``on_before_optimizer_step``).

Example:
    >>> import torch
    >>> weight = torch.nn.Parameter(torch.ones(2))
    >>> optimizer = torch.optim.SGD([weight], lr=0.1)
    >>> steps = []
    >>> hooks = GradientHooks(optimizer, None, lambda: ([], []), lambda: steps.append(1))
    >>> weight.grad = torch.ones(2)
    >>> optimizer.step()
    >>> len(steps)
    1
    >>> hooks.remove()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor
from torch.optim import Optimizer

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking.optimizer_hooks import OptimizerHooks

__all__ = ["GradientHooks"]


class GradientHooks(OptimizerHooks):
    """The masking mode's hooks of one optimizer (``inner``, or none) plus the accumulation.

    Args:
        optimizer: The optimizer.
        inner: The masking mode's hooks on it, or ``None``.
        targets: ``() -> (params, masks)`` of its pruned targets (as the mode's hooks take).
        accumulate: Called before each of its steps, after ``inner``'s pre-hook.
    """

    def __init__(  # the mode's hooks are made apart: nothing of OptimizerHooks' own to set up
        self,
        optimizer: Optimizer,
        inner: OptimizerHooks | None,
        targets: Callable[[], tuple[list[Tensor], list[Tensor]]],
        accumulate: Callable[[], Any],
    ) -> None:
        self.optimizer = optimizer
        self._inner = inner
        self._targets = targets
        self._accumulate = accumulate
        self._active = True
        self._handle = changes.hook(optimizer.register_step_pre_hook, self._before)

    def _before(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        self._accumulate()

    def zero_state(self) -> None:
        """The mode's hooks zero the pruned entries of the optimizer's state."""
        if self._inner is not None:
            self._inner.zero_state()

    def remove(self) -> None:
        """Take every hook off the optimizer."""
        if self._inner is not None:
            self._inner.remove()
        self._handle.remove()
        self._inner = None
        self._active = False

    @property
    def active(self) -> bool:
        """Whether the hooks are on the optimizer."""
        return self._active
