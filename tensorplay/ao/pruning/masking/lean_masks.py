"""Lean masks: one ``torch.bool`` buffer per pruned tensor, pruned weights zeroed in place.

The lean way to hold pruning (``Pruner(..., masking="inplace")``): the parameter
``module.<name>`` stays the same :class:`~torch.nn.Parameter`, its mask is a buffer
``module.<name>_mask`` of dtype ``torch.bool`` (``True``: kept), and the pruned entries of the
parameter are zero. There is no ``<name>_orig`` and no forward pre-hook, so nothing is
recomputed per forward and the only extra state is one byte per unit; that is also how a lean
tensor is told apart from a reparametrized one (which has ``<name>_orig``). Holders of one tied
parameter register the same mask tensor.

The invariant ``param[~mask] == 0`` holds right after pruning and after every step of an attached
optimizer (:mod:`~tensorplay.ao.pruning.masking.optimizer_hooks`). It costs one pass over the
weights' gradients per optimizer step and nothing else for the optimizers whose update provably
keeps a zero weight zero (:func:`~tensorplay.ao.pruning.masking.optimizer_hooks.keeps_zeros`): their
gradients are masked before the step (one fused multiply over all targets), and the pruned entries
of their per-parameter state (momentum, Adam moments) are zeroed once at each pruning event
(:func:`zero_state`), so the step maps zero gradient, zero state and zero weight to zero weight.
Every other optimizer gets one more pass after its step that zeroes the pruned weights again.

The values of pruned weights are gone once pruned: there is no ``<name>_orig`` to recover them
from. Rewinding keeps its own snapshot.

Two functions are the only places that know how a mask is made and how a tensor's local values
are reached (:func:`mask_like`, :func:`local_tensor`). Under FSDP2 a parameter, its gradient and
its optimizer state are ``DTensor`` shards: its mask is a bool ``DTensor`` sharded like it, and
every pass works on the local tensors only (:mod:`~tensorplay.ao.pruning.selection.shards`).

Example:
    >>> import torch
    >>> from torch import nn
    >>> layer = nn.Linear(3, 2)
    >>> mask = torch.tensor([[True, False, True], [False, True, True]])
    >>> install_mask([(layer, "weight")], mask)
    >>> apply_masks([layer.weight], [layer.weight_mask])
    >>> int((layer.weight == 0).sum()), sorted(layer.state_dict())
    (2, ['bias', 'weight', 'weight_mask'])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.pair import Pair
from tensorplay.ao.pruning.selection import local_part
from tensorplay.ao.pruning.selection.checks import count_true
from tensorplay.ao.pruning.selection.shards import placed_like

__all__ = [
    "MASK_SUFFIX",
    "apply_masks",
    "install_mask",
    "is_lean_tensor",
    "lean_mask",
    "lean_names",
    "local_tensor",
    "mask_gradients",
    "mask_like",
    "pruned_zero_counts",
    "remove_mask",
    "revived_counts",
    "zero_state",
]

MASK_SUFFIX = "_mask"


# -- where a lean mask lives -------------------------------------------------------------------


def lean_mask(module: nn.Module, name: str) -> Tensor | None:
    """The lean mask of ``module.<name>``: the bool buffer ``<name>_mask`` next to the parameter
    ``<name>`` (no ``<name>_orig``), else ``None``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> lean_mask(layer, "weight") is None
        True
        >>> install_mask([(layer, "weight")], torch.ones(2, 2, dtype=torch.bool))
        >>> lean_mask(layer, "weight") is layer.weight_mask
        True
    """
    mask = module._buffers.get(name + MASK_SUFFIX)
    if mask is None or mask.dtype != torch.bool:
        return None
    if name not in module._parameters or name + "_orig" in module._parameters:
        return None
    return mask


def is_lean_tensor(module: nn.Module, name: str) -> bool:
    """Whether ``module.<name>`` carries a lean mask (see :func:`lean_mask`).

    Example:
        >>> from torch import nn
        >>> is_lean_tensor(nn.Linear(2, 2), "weight")
        False
    """
    return lean_mask(module, name) is not None


def lean_names(state_dict: Mapping[str, object]) -> list[str]:
    """The names saved with a lean mask in ``state_dict``: a bool ``<name>_mask`` next to
    ``<name>`` and no ``<name>_orig``, in key order.

    Example:
        >>> import torch
        >>> state = {"fc.weight": torch.zeros(2), "fc.weight_mask": torch.ones(2, dtype=torch.bool)}
        >>> lean_names(state), lean_names({"w_orig": 0, "w_mask": torch.ones(1)})
        (['fc.weight'], [])
    """
    names = []
    for key, value in state_dict.items():
        if not key.endswith(MASK_SUFFIX) or not isinstance(value, Tensor):
            continue
        fq_name = key[: -len(MASK_SUFFIX)]
        lean = value.dtype == torch.bool and fq_name + "_orig" not in state_dict
        if lean and fq_name in state_dict:
            names.append(fq_name)
    return names


def mask_like(param: Tensor) -> Tensor:
    """An all-``True`` bool mask of ``param``'s shape and device (the one place a mask is made).

    For a ``DTensor`` parameter (FSDP2) the mask is a bool ``DTensor`` of the same device
    mesh, placements, shape and stride, built from the local shape: no rank ever holds the
    full mask.

    Example:
        >>> import torch
        >>> mask_like(torch.zeros(2, 3)).dtype, mask_like(torch.zeros(2, 3)).shape
        (torch.bool, torch.Size([2, 3]))
    """
    local = local_part(param)
    return placed_like(torch.ones(local.shape, dtype=torch.bool, device=local.device), param)


def local_tensor(tensor: Tensor) -> Tensor:
    """The values this process holds of ``tensor``: a ``DTensor``'s local tensor (sharing its
    storage, so writes reach the shard), a plain tensor itself (the one place to reach a
    shard's local values).

    Example:
        >>> import torch
        >>> t = torch.zeros(2)
        >>> local_tensor(t) is t
        True
    """
    return local_part(tensor)


def install_mask(pairs: Iterable[Pair], mask: Tensor) -> None:
    """Register ``mask`` (bool, the parameter's shape) as the buffer ``<name>_mask`` of every
    pair of one parameter: one tensor shared by all holders. The parameter is not changed.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> a, b = nn.Linear(2, 2), nn.Linear(2, 2)
        >>> b.weight = a.weight
        >>> install_mask([(a, "weight"), (b, "weight")], torch.ones(2, 2, dtype=torch.bool))
        >>> a.weight_mask is b.weight_mask
        True
    """
    for module, name in pairs:
        changes.register_buffer(module, name + MASK_SUFFIX, mask)


def remove_mask(pairs: Iterable[Pair]) -> None:
    """Drop the buffer ``<name>_mask`` of every pair; the (zeroed) parameter stays.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> install_mask([(layer, "weight")], torch.ones(2, 2, dtype=torch.bool))
        >>> remove_mask([(layer, "weight")])
        >>> sorted(layer.state_dict())
        ['bias', 'weight']
    """
    for module, name in pairs:
        changes.pop_buffer(module, name + MASK_SUFFIX)


# -- the passes --------------------------------------------------------------------------------


def _multiply(tensors: list[Tensor], masks: list[Tensor]) -> None:
    """``tensor *= mask`` for every pair, fused over all of them where torch can."""
    if tensors:
        torch._foreach_mul_(tensors, masks)


def apply_masks(params: Sequence[Tensor], masks: Sequence[Tensor]) -> None:
    """Zero the pruned entries of every parameter in place (one pass over each).

    Example:
        >>> import torch
        >>> weight = torch.nn.Parameter(torch.ones(3))
        >>> apply_masks([weight], [torch.tensor([True, False, True])])
        >>> weight.detach().tolist()
        [1.0, 0.0, 1.0]
    """
    for param in params:
        changes.keep_values(param)  # a one-shot call that may still refuse gives them back
    with torch.no_grad():
        _multiply([local_tensor(p.detach()) for p in params], [local_tensor(m) for m in masks])


def mask_gradients(params: Sequence[Tensor], masks: Sequence[Tensor]) -> None:
    """Zero the pruned entries of every parameter's ``.grad`` in place; parameters without a
    gradient are skipped.

    Example:
        >>> import torch
        >>> weight = torch.nn.Parameter(torch.ones(2))
        >>> weight.grad = torch.ones(2)
        >>> mask_gradients([weight], [torch.tensor([False, True])])
        >>> weight.grad.tolist()
        [0.0, 1.0]
    """
    grads, kept = [], []
    for param, mask in zip(params, masks, strict=True):
        if param.grad is not None:
            grads.append(local_tensor(param.grad))
            kept.append(local_tensor(mask))
    with torch.no_grad():
        _multiply(grads, kept)


def zero_state(optimizer: Optimizer, params: Sequence[Tensor], masks: Sequence[Tensor]) -> None:
    """Zero the pruned entries of ``optimizer``'s per-parameter state tensors of the parameter's
    shape (``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``, ...); scalars such as ``step``
    are left alone.

    Example:
        >>> import torch
        >>> weight = torch.nn.Parameter(torch.ones(2))
        >>> optimizer = torch.optim.SGD([weight], lr=0.1, momentum=0.9)
        >>> weight.grad = torch.ones(2)
        >>> optimizer.step()
        >>> zero_state(optimizer, [weight], [torch.tensor([False, True])])
        >>> optimizer.state[weight]["momentum_buffer"].tolist()
        [0.0, 1.0]
    """
    tensors, kept = [], []
    for param, mask in zip(params, masks, strict=True):
        local_mask = local_tensor(mask)
        for value in optimizer.state.get(param, {}).values():
            if not isinstance(value, Tensor) or value.shape != param.shape:
                continue
            local = local_tensor(value)  # FSDP2: a DTensor sharded like the parameter
            if local.shape == local_mask.shape:
                tensors.append(local)
                kept.append(local_mask)
    with torch.no_grad():
        _multiply(tensors, kept)


_COUNT_CHUNK = 1 << 20  # units per piece: a temporary that stays in cache


def _kept_or_nonzero(param: Tensor, mask: Tensor) -> int:
    """This process's units of ``param`` that are kept by ``mask`` or not zero (``-0.0`` is
    zero, NaN is not), read piece by piece into one small bool buffer."""
    values = local_tensor(param.detach()).reshape(-1)
    kept = local_tensor(mask).reshape(-1)
    buffer = torch.empty(min(values.numel(), _COUNT_CHUNK), dtype=torch.bool, device=values.device)
    total = 0
    with torch.no_grad():
        for start in range(0, values.numel(), _COUNT_CHUNK):
            piece = values[start : start + _COUNT_CHUNK]
            out = buffer[: piece.numel()]
            torch.ne(piece, 0, out=out)
            out.logical_or_(kept[start : start + _COUNT_CHUNK])
            total += count_true(out)
    return total


def pruned_zero_counts(params: Sequence[Tensor], masks: Sequence[Tensor]) -> list[int]:
    """Per parameter, its units that are pruned and zero (this process's values): the pruning
    the weights really hold.

    Example:
        >>> import torch
        >>> weight = torch.tensor([0.0, 2.0, 3.0, -0.0])
        >>> pruned_zero_counts([weight], [torch.tensor([False, False, True, False])])
        [2]
    """
    return [
        local_tensor(param).numel() - _kept_or_nonzero(param, mask)
        for param, mask in zip(params, masks, strict=True)
    ]


def revived_counts(params: Sequence[Tensor], masks: Sequence[Tensor]) -> list[int]:
    """Per parameter, its pruned entries that are not zero (this process's values): what an
    unattached optimizer step or a hand edit brought back.

    Example:
        >>> import torch
        >>> weight = torch.tensor([0.0, 2.0, 3.0])
        >>> revived_counts([weight], [torch.tensor([False, False, True])])
        [1]
    """
    return [
        _kept_or_nonzero(param, mask) - count_true(local_tensor(mask).reshape(-1))
        for param, mask in zip(params, masks, strict=True)
    ]
