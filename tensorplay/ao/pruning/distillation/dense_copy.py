"""A frozen, dense, plain copy of a model as it computes now: the default distillation teacher.

:func:`dense_copy` copies a model, pruned or not, into one that computes the same outputs but
carries no pruning: a tensor masked by the reparametrization (``<name>_orig``, ``<name>_mask``
and a forward pre-hook) or by a lean mask (a bool ``<name>_mask`` beside the weight) becomes a
plain parameter ``<name>`` holding its masked values, and the masks, the ``_orig`` parameters
and the pruning hooks are left out. Every parameter is frozen (``requires_grad=False``), holds
its own memory (nothing is shared with the model, so training the model never changes the
copy) and is optionally converted to a lower ``dtype``; a tie (one parameter held by several
modules) stays one parameter. Anything else (the modules' other attributes, the user's own
hooks) is deep-copied.

The copy is made without a transient copy of what it leaves out: masks and ``_orig`` values are
never copied, and each tensor is converted to ``dtype`` as it is copied, so a bfloat16 copy of a
float32 model needs 2 bytes per parameter at every moment (plus one tensor's float32 product of
a mask and its values while that tensor is copied).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.methods import l1_unstructured
    >>> model = l1_unstructured(nn.Linear(4, 2), "weight", amount=3)
    >>> teacher = dense_copy(model)
    >>> sorted(teacher.state_dict()), teacher._forward_pre_hooks
    (['bias', 'weight'], OrderedDict())
    >>> x = torch.randn(5, 4)
    >>> torch.equal(teacher(x), model(x).detach()), teacher.weight.requires_grad
    (True, False)
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.distillation.left_out import (
    LEFT_OUT,
    drop_left_out_hooks,
    hook_dicts,
    is_left_out,
)
from tensorplay.ao.pruning.distillation.sharded_copy import sharded_copy
from tensorplay.ao.pruning.masking.lean_masks import MASK_SUFFIX, lean_mask
from tensorplay.ao.pruning.masking.permanent import dense_order, masked_tensor
from tensorplay.ao.pruning.parity.reparametrization import pruned_parts, pruned_tensor_names
from tensorplay.ao.pruning.selection import is_dtensor
from tensorplay.ao.pruning.selection.sharding import first_sharded

__all__ = ["dense_copy"]


def dense_copy(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A frozen copy of ``model`` that computes what ``model`` computes now, with every masked
    tensor made a plain parameter of its masked values and no pruning state (the module).

    A model sharded with FSDP2 (``DTensor`` parameters) is copied shard by shard into a copy
    sharded like it (:func:`~tensorplay.ao.pruning.distillation.sharded_copy.sharded_copy`;
    collective).

    Args:
        model: Any module, under pruning (either masking mode) or not, on any device.
        dtype: The floating-point dtype of the copy's floating-point parameters and buffers
            (as ``model.to(dtype)`` converts them), e.g. ``torch.bfloat16`` to halve a float32
            model's memory; ``None`` keeps each tensor's dtype.

    Returns:
        The copy, in eval mode, on the model's devices; none of its parameters requires a
        gradient or shares memory with the model. The model is not changed.

    Raises:
        TypeError: ``model`` is not a module, or ``dtype`` is not a floating-point dtype.
        ValueError: ``model`` holds ``DTensor`` buffers but no ``DTensor`` parameter (naming
            one), or is sharded in a way
            :func:`~tensorplay.ao.pruning.distillation.sharded_copy.sharded_copy` refuses.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning import Pruner, OneShotSchedule
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> _ = Pruner(model, OneShotSchedule(0.5), masking="inplace").step()
        >>> sorted(model.state_dict())[:3]
        ['0.bias', '0.weight', '0.weight_mask']
        >>> teacher = dense_copy(model, dtype=torch.bfloat16)
        >>> sorted(teacher.state_dict()), teacher[0].weight.dtype
        (['0.bias', '0.weight', '2.bias', '2.weight'], torch.bfloat16)
        >>> sum(int((teacher[i].weight == 0).sum()) for i in (0, 2))  # half of 48, as pruned
        24
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"Expected `model` to be a torch.nn.Module, but got {model!r}.")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(
            f"Expected `dtype` to be a floating-point torch.dtype or None, but got {dtype!r}."
        )
    if first_sharded(model) is not None:
        return sharded_copy(model, dtype)
    _refuse_dtensors(model)
    freeze = _Freezer(dtype)
    memo: dict[int, Any] = {}
    for module in model.modules():
        _plan_module(module, memo, freeze)
    # Children before parents: a masked module's clone deep-copies its children from the memo.
    for module in reversed(list(model.modules())):
        if _masked_names(module) != ([], []):
            _clone_masked(module, memo, freeze)
    clone: nn.Module = copy.deepcopy(model, memo)
    for module in clone.modules():
        drop_left_out_hooks(module)
    return clone.eval()


class _Freezer:
    """One frozen copy per tensor of the model (per values and mask for a masked one), so
    tensors shared in the model stay shared in the copy."""

    def __init__(self, dtype: torch.dtype | None) -> None:
        self.dtype = dtype
        self.copies: dict[tuple[int, int], Tensor] = {}

    def parameter(self, values: Tensor, mask: Tensor | None = None) -> nn.Parameter:
        key = (id(values), id(mask))
        if key not in self.copies:
            tensor = values.detach() if mask is None else masked_tensor(values, mask)
            self.copies[key] = nn.Parameter(self._converted(tensor), requires_grad=False)
        found = self.copies[key]
        assert isinstance(found, nn.Parameter)  # for mypy: only parameters are kept under keys
        return found

    def buffer(self, tensor: Tensor) -> Tensor:
        key = (id(tensor), -1)
        if key not in self.copies:
            self.copies[key] = self._converted(tensor.detach())
        return self.copies[key]

    def _converted(self, tensor: Tensor) -> Tensor:
        dtype = self.dtype if self.dtype is not None and tensor.is_floating_point() else None
        return tensor.to(dtype=dtype, copy=True)


def _refuse_dtensors(model: nn.Module) -> None:
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if is_dtensor(tensor):
            raise ValueError(
                f"Expected a model whose DTensors include its parameters (sharded with FSDP2, "
                f"copied shard by shard) or plain tensors only, but {name} is a DTensor and no "
                "parameter is: pass a teacher you built yourself."
            )


def _masked_names(module: nn.Module) -> tuple[list[str], list[str]]:
    """The module's own reparametrized names and lean names."""
    reparametrized = [n for n in pruned_tensor_names(module) if pruned_parts(module, n)]
    lean = [n for n in module._parameters if lean_mask(module, n) is not None]
    return reparametrized, lean


def _plan_module(module: nn.Module, memo: dict[int, Any], freeze: _Freezer) -> None:
    """Put in ``memo`` what ``copy.deepcopy`` must copy differently in ``module``: its plain
    parameters and buffers become frozen copies, left-out hooks a marker; a masked tensor's
    ``_orig`` and mask get no entry, since only :func:`_clone_masked` reads them."""
    reparametrized, lean = _masked_names(module)
    origs = {name + "_orig" for name in reparametrized}
    masks = {name + MASK_SUFFIX for name in reparametrized + lean}
    for key, param in module._parameters.items():
        if param is not None and key not in origs:
            memo[id(param)] = freeze.parameter(param, lean_mask(module, key))
    for key, buffer in module._buffers.items():
        if buffer is not None and key not in masks:
            memo[id(buffer)] = freeze.buffer(buffer)
    for hooks in hook_dicts(module):
        for hook in hooks.values():
            if is_left_out(hook):
                memo[id(hook)] = LEFT_OUT


def _clone_masked(module: nn.Module, memo: dict[int, Any], freeze: _Freezer) -> None:
    """Put in ``memo`` a copy of ``module`` whose masked tensors are plain frozen parameters of
    their masked values, in the order the unpruned module had them, and that has no masks.

    ``copy.deepcopy`` of a reparametrized module would copy ``<name>`` (``mask * orig``) and
    then the copy would still have to be taken apart; this builds the copy's parameters and
    buffers directly and deep-copies the rest of its state (children, hooks, attributes)."""
    reparametrized, lean = _masked_names(module)
    masks = {name + MASK_SUFFIX for name in reparametrized + lean}
    getstate: Callable[[], Any] | None = getattr(module, "__getstate__", None)
    state = dict(getstate() if getstate is not None else vars(module))
    for key in ("_parameters", "_buffers", "__deepcopy__", *reparametrized):
        state.pop(key, None)
    clone = type(module).__new__(type(module))
    memo[id(module)] = clone  # a reference back to the module inside its state is the clone
    state = copy.deepcopy(state, memo)
    parameters = type(module._parameters)()
    for name in dense_order(module, reparametrized):
        parts = pruned_parts(module, name) if name in reparametrized else None
        if parts is not None:
            parameters[name] = freeze.parameter(parts.orig, parts.mask)
        else:
            parameters[name] = memo[id(module._parameters[name])]
    # dense_order lists the parameters that exist; a registered None (a Linear's absent bias)
    # keeps its key, at the end as the unpruned module has it after its parameters
    parameters.update((key, None) for key, param in module._parameters.items() if param is None)
    state["_parameters"] = parameters
    state["_buffers"] = type(module._buffers)(
        (key, None if buffer is None else memo[id(buffer)])
        for key, buffer in module._buffers.items()
        if key not in masks
    )
    state["_non_persistent_buffers_set"] = set(state["_non_persistent_buffers_set"]) - masks
    clone.__setstate__(state)  # type: ignore[no-untyped-call]  # torch leaves it untyped
