"""The optimizer hooks that keep the lean masks' pruned weights zero through every step.

A pruner's ``attach`` puts an :class:`OptimizerHooks` on each optimizer: a step pre-hook that
masks the gradients, a step post-hook that zeroes the pruned weights again unless the step
provably kept them zero (:func:`keeps_zeros`), and a load-state post-hook that zeroes the pruned
entries of a loaded state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.utils.hooks import RemovableHandle

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking.gradient_masks import GradientMasks
from tensorplay.ao.pruning.masking.lean_masks import apply_masks, mask_gradients, zero_state

__all__ = ["OptimizerAttachment", "OptimizerHooks", "keeps_zeros"]


# The optimizers whose step maps (zero gradient, zero state entries, zero weight) to a zero
# weight, by exact class (a subclass may change the update):
# * SGD: d = g + wd * p = 0; buf = mu * buf + (1 - dampening) * d = 0; nesterov d + mu * buf = 0;
#   p -= lr * d leaves 0 (with or without momentum, maximize, foreach or fused).
# * Adam, AdamW: g + wd * p = 0 (L2) or p *= 1 - lr * wd (decoupled) leave 0; m = lerp(m, g) = 0,
#   v = b2 * v + (1 - b2) * g^2 = 0, max(v_max, v) = 0 (amsgrad); p -= lr * m / (sqrt(v) + eps)
#   is 0 when eps > 0 (eps = 0 would divide 0 by 0).
_KEEP_ZEROS: dict[type[Optimizer], bool] = {
    torch.optim.SGD: False,
    torch.optim.Adam: True,
    torch.optim.AdamW: True,
}


def keeps_zeros(optimizer: Optimizer) -> bool:
    """Whether a step of ``optimizer`` provably keeps a weight zero when its gradient and its
    state entries are zero (so no pass over the weights is needed after the step).

    ``torch.optim.SGD`` (momentum, nesterov, weight decay, dampening, maximize), ``Adam`` and
    ``AdamW`` (weight decay, amsgrad) with ``eps > 0`` in every group; by exact class.

    Example:
        >>> import torch
        >>> weight = torch.nn.Parameter(torch.ones(2))
        >>> keeps_zeros(torch.optim.SGD([weight], lr=0.1, momentum=0.9, nesterov=True))
        True
        >>> keeps_zeros(torch.optim.Adagrad([weight]))
        False
    """
    needs_eps = _KEEP_ZEROS.get(type(optimizer))
    if needs_eps is None:
        return False
    return not needs_eps or all(float(group["eps"]) > 0 for group in optimizer.param_groups)


# -- optimizer hooks ---------------------------------------------------------------------------


class OptimizerHooks:
    """The hooks that keep pruned weights zero through the steps of one optimizer; made by a
    pruner's ``attach``. :meth:`remove` takes them off.

    Before each step, unless the gradients were masked since the last step (a call of the
    owner's ``mask_gradients`` before clipping), the gradients of the targets the optimizer
    holds are masked (``mask_gradients=True``), those that ``gradient_masks``' hooks provably
    masked already excepted
    (:meth:`~tensorplay.ao.pruning.masking.gradient_masks.GradientMasks.unmasked`). After the step,
    the pruned weights are zeroed again unless :func:`keeps_zeros` proves the step kept them zero; a
    step that ran on unmasked gradients also gets its state entries zeroed, so the next steps need
    no weight pass again. After ``optimizer.load_state_dict`` the pruned entries of the loaded state
    are zeroed.

    Args:
        optimizer: The optimizer.
        targets: ``() -> (params, masks)`` of the pruned targets the optimizer holds, read at
            each call (masks may be replaced, e.g. by ``model.to()``).
        mask_gradients: Whether the pre-step hook masks the gradients.
        generation: ``() -> int`` that changes each time the owner masked all gradients.
        gradient_masks: The post-accumulate-grad hooks on the targets' parameters, if any.

    Example:
        >>> import torch
        >>> weight = torch.nn.Parameter(torch.ones(2))
        >>> mask = torch.tensor([False, True])
        >>> optimizer = torch.optim.SGD([weight], lr=0.5, momentum=0.9)
        >>> hooks = OptimizerHooks(optimizer, lambda: ([weight], [mask]), True, lambda: 0)
        >>> weight.grad = torch.ones(2)
        >>> optimizer.step()
        >>> weight.detach().tolist()
        [1.0, 0.5]
        >>> hooks.remove()
    """

    def __init__(
        self,
        optimizer: Optimizer,
        targets: Callable[[], tuple[list[Tensor], list[Tensor]]],
        mask_gradients: bool,
        generation: Callable[[], int],
        gradient_masks: GradientMasks | None = None,
    ) -> None:
        self.optimizer = optimizer
        self._gradient_masks = gradient_masks
        self._targets = targets
        self._mask_gradients = mask_gradients
        self._generation = generation
        self._seen = generation()
        self._unmasked = False
        self._handles: list[RemovableHandle] = [
            changes.hook(optimizer.register_step_pre_hook, self._before_step),
            changes.hook(optimizer.register_step_post_hook, self._after_step),
            changes.hook(optimizer.register_load_state_dict_post_hook, self._after_load),
        ]

    def held(self) -> tuple[list[Tensor], list[Tensor]]:
        """The parameters and masks of the pruned targets the optimizer holds."""
        return self._targets()

    def _before_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        generation = self._generation()
        masked_already = generation != self._seen
        self._seen = generation
        if masked_already:
            self._unmasked = False
        elif self._mask_gradients:
            held = self.held()
            if self._gradient_masks is not None:
                held = self._gradient_masks.unmasked(*held)
            mask_gradients(*held)
            self._unmasked = False
        else:
            self._unmasked = True

    def _after_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        if self._unmasked:
            params, masks = self.held()
            zero_state(optimizer, params, masks)
            apply_masks(params, masks)
        elif not keeps_zeros(optimizer):
            apply_masks(*self.held())
        self._unmasked = False

    def _after_load(self, optimizer: Optimizer) -> None:
        zero_state(optimizer, *self.held())

    def zero_state(self) -> None:
        """Zero the pruned entries of the optimizer's state (after a pruning event)."""
        zero_state(self.optimizer, *self.held())

    def remove(self) -> None:
        """Take the hooks off the optimizer."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def active(self) -> bool:
        """Whether the hooks are on the optimizer."""
        return bool(self._handles)


class OptimizerAttachment:
    """The hooks of one ``Pruner.attach`` call; :meth:`remove` takes them all off.

    Example:
        >>> import torch
        >>> weight = torch.nn.Parameter(torch.ones(2))
        >>> optimizer = torch.optim.SGD([weight], lr=0.1)
        >>> hooks = OptimizerHooks(optimizer, lambda: ([], []), True, lambda: 0)
        >>> attachment = OptimizerAttachment([hooks])
        >>> attachment.remove()
        >>> hooks.active
        False
    """

    def __init__(self, hooks: Sequence[OptimizerHooks]) -> None:
        self.hooks = list(hooks)

    def remove(self) -> None:
        """Take every hook off its optimizer."""
        for hooks in self.hooks:
            hooks.remove()
