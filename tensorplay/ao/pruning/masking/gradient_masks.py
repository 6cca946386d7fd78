"""Lean masks zero a pruned gradient as soon as autograd accumulates it, before any clipping.

With ``masking="inplace"`` nothing in the forward multiplies by the mask, so a backward pass
leaves gradients in the pruned entries. A training loop may read the gradients between the
backward and the optimizer step: gradient clipping (the Hugging Face ``Trainer`` clips before
``on_pre_optimizer_step``, Lightning's manual optimization before the callback's hook) and the
logged gradient norm. :class:`GradientMasks` puts a post-accumulate-grad hook
(:meth:`torch.Tensor.register_post_accumulate_grad_hook`) on each lean target's parameter that
multiplies its ``.grad`` by the mask right after each accumulation, so whatever reads the
gradients after the backward sees the pruned entries as zero.

The optimizer hooks mask the gradients again before each step
(:mod:`~tensorplay.ao.pruning.masking.optimizer_hooks`), so the weights stay zero whatever
changed a gradient in between, but only the gradients the hook has not provably masked
(:meth:`GradientMasks.unmasked`): a gradient is skipped when it is the very tensor the hook
last masked, unchanged since (its version counter, which every in-place write through torch
bumps: accumulation, clipping, unscaling, ``zero_()``), under the very mask the hook read,
unchanged since (a pruning step between the backward and the step changes it). Everything
else is masked again: a gradient set by hand (``p.grad = g`` fires no hook), one written in
place after the backward, one that no hook masked (a sharded parameter, a parameter the last
backward did not reach). Under ``torch.distributed`` with more than one rank nothing is
skipped: DDP writes the all-reduced gradients from its buckets outside autograd (a collective
writing into a gradient that is a view of its bucket need not bump the version counter), and a
communication hook may not keep the zeros. Writes
that bypass the version counter in one process (``p.grad.data.add_(...)``) are not seen: write
to ``p.grad`` itself.

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
    >>> from tensorplay.ao.pruning.targets.tied import Target
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

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking.lean_masks import lean_mask
from tensorplay.ao.pruning.selection.shards import is_sharded

if TYPE_CHECKING:
    from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["GradientMasks"]


class _Masked(NamedTuple):
    """What the hook left: the gradient and the mask it multiplied, with their versions."""

    grad: weakref.ref[Tensor]
    grad_version: int
    mask: weakref.ref[Tensor]
    mask_version: int

    def holds(self, grad: Tensor | None, mask: Tensor) -> bool:
        """Whether ``grad`` is still that gradient, masked by ``mask``: both the same tensors,
        neither written since."""
        return (
            grad is not None
            and self.grad() is grad
            and grad._version == self.grad_version
            and self.mask() is mask
            and mask._version == self.mask_version
        )


class GradientMasks:
    """One post-accumulate-grad hook per lean target's parameter (see the module)."""

    def __init__(self) -> None:
        self._handles: dict[int, RemovableHandle] = {}
        self._masked: dict[int, _Masked] = {}

    def install(self, targets: Sequence[Target]) -> None:
        """Hook each target's parameter once (again after :meth:`remove`); sharded
        (``DTensor``) parameters are left alone. The hook reads the mask at each call, so a
        mask installed, replaced or removed later is followed."""
        for target in targets:
            param = target.parameter()
            held = self._handles.get(id(param))
            if held is not None and changes.is_registered(held):
                continue
            if is_sharded(param) or not param.requires_grad:
                continue
            hook = _zero_pruned_gradient(*target.pair, self._masked)
            self._handles[id(param)] = changes.hook(param.register_post_accumulate_grad_hook, hook)

    def unmasked(
        self, params: Sequence[Tensor], masks: Sequence[Tensor]
    ) -> tuple[list[Tensor], list[Tensor]]:
        """The ``params`` (with their ``masks``) whose gradient the hooks have not provably
        masked, read now: all of them under ``torch.distributed`` with several ranks (see the
        module).

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.masking.lean_masks import install_mask, lean_mask
            >>> from tensorplay.ao.pruning.targets.tied import Target
            >>> layer = nn.Linear(2, 1, bias=False)
            >>> install_mask([(layer, "weight")], torch.tensor([[True, False]]))
            >>> hooks = GradientMasks()
            >>> hooks.install([Target(("weight",), ((layer, "weight"),))])
            >>> layer(torch.ones(3, 2)).sum().backward()
            >>> mask = lean_mask(layer, "weight")
            >>> len(hooks.unmasked([layer.weight], [mask])[0])  # masked by the hook
            0
            >>> layer.weight.grad = torch.ones(1, 2)  # set by hand: no hook ran
            >>> len(hooks.unmasked([layer.weight], [mask])[0])
            1
        """
        if _several_ranks():
            return list(params), list(masks)
        left = [
            (param, mask)
            for param, mask in zip(params, masks, strict=True)
            if not ((done := self._masked.get(id(param))) and done.holds(param.grad, mask))
        ]
        return [param for param, _ in left], [mask for _, mask in left]

    def remove(self) -> None:
        """Take every hook off."""
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()
        self._masked.clear()

    def __len__(self) -> int:
        return len(self._handles)


def _zero_pruned_gradient(
    module: nn.Module, name: str, masked: dict[int, _Masked]
) -> Callable[[Tensor], None]:
    """The hook of ``module.<name>``: ``grad *= mask`` while it has a lean mask, recorded in
    ``masked``."""

    def zero_pruned(param: Tensor) -> None:
        mask = lean_mask(module, name)
        grad = param.grad
        if mask is None or grad is None:
            masked.pop(id(param), None)
            return
        with torch.no_grad():
            grad.mul_(mask)
        masked[id(param)] = _Masked(
            weakref.ref(grad), grad._version, weakref.ref(mask), mask._version
        )

    return zero_pruned


def _several_ranks() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
