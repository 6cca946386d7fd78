"""Lean masks zero a pruned gradient as soon as autograd accumulates it, before any clipping.

With ``masking="inplace"`` nothing in the forward multiplies by the mask, so a backward pass
leaves gradients in the pruned entries. A training loop may read the gradients between the
backward and the optimizer step: gradient clipping (the Hugging Face ``Trainer`` clips before
``on_pre_optimizer_step``, Lightning's manual optimization before the callback's hook) and the
logged gradient norm. :class:`GradientMasks` puts a post-accumulate-grad hook
(:meth:`torch.Tensor.register_post_accumulate_grad_hook`) on each lean target's parameter that
multiplies its ``.grad`` by the mask right after each accumulation, so whatever reads the
gradients after the backward sees the pruned entries as zero. The optimizer hooks still mask the
gradients before each step (:mod:`~tensorplay.ao.pruning.masking.optimizer_hooks`): that keeps
the weights zero whatever changed a gradient in between.

Under DDP the hook runs before the gradient is copied into its all-reduce bucket, on every rank
with the same mask: the all-reduced sum of zeros is zero, so the gradients DDP writes back hold
zeros where pruned (a lossy communication hook, e.g. PowerSGD, may not keep them; the pre-step
masking still does). FSDP2 (``DTensor`` targets) writes its reduced gradient shards outside
autograd, where no such hook runs: sharded targets have their gradients masked before the
optimizer step only, so a norm computed before it includes the pruned entries.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.masking.lean_masks import install_mask
    >>> from tensorplay.ao.pruning.tied_targets import Target
    >>> layer = nn.Linear(2, 1, bias=False)
    >>> install_mask([(layer, "weight")], torch.tensor([[True, False]]))
    >>> hooks = GradientMasks()
    >>> hooks.install([Target(("weight",), ((layer, "weight"),))])
    >>> layer(torch.ones(3, 2)).sum().backward()
    >>> layer.weight.grad.tolist()
    [[3.0, 0.0]]
    >>> hooks.remove()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from tensorplay.ao.pruning.dtensor_targets import is_sharded
from tensorplay.ao.pruning.masking.lean_masks import lean_mask

if TYPE_CHECKING:
    from tensorplay.ao.pruning.tied_targets import Target

__all__ = ["GradientMasks"]


class GradientMasks:
    """One post-accumulate-grad hook per lean target's parameter (see the module)."""

    def __init__(self) -> None:
        self._handles: dict[int, RemovableHandle] = {}

    def install(self, targets: Sequence[Target]) -> None:
        """Hook each target's parameter once (again after :meth:`remove`); sharded
        (``DTensor``) parameters are left alone. The hook reads the mask at each call, so a
        mask installed, replaced or removed later is followed."""
        for target in targets:
            param = target.parameter()
            if id(param) in self._handles or is_sharded(param) or not param.requires_grad:
                continue
            register = param.register_post_accumulate_grad_hook
            self._handles[id(param)] = register(_zero_pruned_gradient(*target.pair))  # type: ignore[no-untyped-call]

    def remove(self) -> None:
        """Take every hook off."""
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()

    def __len__(self) -> int:
        return len(self._handles)


def _zero_pruned_gradient(module: nn.Module, name: str) -> Callable[[Tensor], None]:
    """The hook of ``module.<name>``: ``grad *= mask`` while it has a lean mask."""

    def zero_pruned(param: Tensor) -> None:
        mask = lean_mask(module, name)
        if mask is not None and param.grad is not None:
            with torch.no_grad():
                param.grad.mul_(mask)

    return zero_pruned
