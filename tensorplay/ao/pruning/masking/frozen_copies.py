"""Frozen copies of a model's tensors, each masked tensor as its masked values.

A dense copy of a model under pruning (the default distillation teacher) is ``copy.deepcopy``
given a memo that says how to copy what pruning changed: :class:`FrozenCopies` fills that memo.
Every plain parameter and buffer gets a frozen copy (``requires_grad=False``, its own memory,
optionally in a lower dtype); a lean-masked parameter gets its masked values; a module holding a
reparametrized tensor gets a clone whose ``<name>`` is a plain parameter of ``mask * orig``,
without the ``<name>_orig`` parameter, the ``<name>_mask`` buffer or any lean mask. A tensor
shared in the model (a tie) stays one tensor in the copy.

Example:
    >>> import copy
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.masking.module_masks import read_masks
    >>> from tensorplay.ao.pruning.parity.methods import l1_unstructured
    >>> model = nn.Sequential(l1_unstructured(nn.Linear(3, 2), "weight", amount=2))
    >>> memo: dict = {}
    >>> FrozenCopies(read_masks(model), None, memo).fill(model)
    >>> clone = copy.deepcopy(model, memo)
    >>> sorted(clone.state_dict()), int((clone[0].weight == 0).sum()), clone[0].weight.requires_grad
    (['0.bias', '0.weight'], 2, False)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.masking.module_masks import ModuleMasks
from tensorplay.ao.pruning.masking.permanent import masked_tensor

__all__ = ["FrozenCopies"]


class FrozenCopies:
    """Puts in ``memo`` a frozen copy of each of a model's tensors and an unmasked clone of each
    module that holds a reparametrized or lean mask.

    Args:
        masks: What each module holds, by ``id``
            (:func:`~tensorplay.ao.pruning.masking.module_masks.read_masks`).
        dtype: The dtype of the copies of floating-point tensors (``None``: each its own).
        memo: The memo ``copy.deepcopy`` will be given; entries already in it stay.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.masking.module_masks import read_masks
        >>> layer, memo = nn.Linear(2, 2), {}
        >>> FrozenCopies(read_masks(layer), torch.bfloat16, memo).fill(layer)
        >>> memo[id(layer.weight)].dtype, memo[id(layer.weight)].requires_grad
        (torch.bfloat16, False)
    """

    def __init__(
        self, masks: Mapping[int, ModuleMasks], dtype: torch.dtype | None, memo: dict[int, Any]
    ) -> None:
        self.masks = masks
        self.dtype = dtype
        self.memo = memo
        self._copies: dict[tuple[int, int], Tensor] = {}

    def fill(self, model: nn.Module) -> None:
        """Every tensor of ``model`` frozen, then every masked module cloned without its masks,
        children before parents (a clone deep-copies its children from the memo)."""
        for module in model.modules():
            self._freeze_tensors(module, self.masks[id(module)])
        for module in reversed(list(model.modules())):
            if self.masks[id(module)].is_masked:
                self._clone_unmasked(module, self.masks[id(module)])

    def _freeze_tensors(self, module: nn.Module, masks: ModuleMasks) -> None:
        """The module's plain parameters and buffers, each a frozen copy (a lean-masked one of
        its masked values); a reparametrized tensor's ``_orig`` and a mask get no entry, since
        only :meth:`_clone_unmasked` reads them."""
        for key, param in module._parameters.items():
            if param is not None and key not in masks.reparametrized_origs:
                self.memo[id(param)] = self._parameter(param, masks.lean.get(key))
        for key, buffer in module._buffers.items():
            if buffer is not None and key not in masks.hidden_keys:
                self.memo[id(buffer)] = self._buffer(buffer)

    def _clone_unmasked(self, module: nn.Module, masks: ModuleMasks) -> None:
        """A clone of ``module`` whose masked tensors are plain frozen parameters of their
        masked values, in the order the unpruned module had them, with no masks.

        ``copy.deepcopy`` of a reparametrized module would copy ``<name>`` (``mask * orig``)
        and then the copy would still have to be taken apart; this builds the clone's
        parameters and buffers directly and deep-copies the rest of its state (children,
        hooks, attributes)."""
        getstate: Callable[[], Any] | None = getattr(module, "__getstate__", None)
        state = dict(getstate() if getstate is not None else vars(module))
        for key in ("_parameters", "_buffers", "__deepcopy__", *masks.reparametrized):
            state.pop(key, None)
        clone = type(module).__new__(type(module))
        self.memo[id(module)] = clone  # a reference back to the module in its state is the clone
        state = copy.deepcopy(state, self.memo)
        parameters = type(module._parameters)()
        for name in masks.order:
            parts = masks.reparametrized.get(name)
            if parts is not None:
                parameters[name] = self._parameter(parts.orig, parts.mask)
            else:
                parameters[name] = self.memo[id(module._parameters[name])]
        # the order lists the parameters that exist; a registered None (a Linear's absent
        # bias) keeps its key, at the end as the unpruned module has it after its parameters
        parameters.update((key, None) for key, param in module._parameters.items() if param is None)
        state["_parameters"] = parameters
        state["_buffers"] = type(module._buffers)(
            (key, None if buffer is None else self.memo[id(buffer)])
            for key, buffer in module._buffers.items()
            if key not in masks.hidden_keys
        )
        persistent = set(state["_non_persistent_buffers_set"]) - masks.hidden_keys
        state["_non_persistent_buffers_set"] = persistent
        clone.__setstate__(state)  # type: ignore[no-untyped-call]  # torch leaves it untyped

    def _parameter(self, values: Tensor, mask: Tensor | None = None) -> nn.Parameter:
        key = (id(values), id(mask))
        if key not in self._copies:
            tensor = values.detach() if mask is None else masked_tensor(values, mask)
            self._copies[key] = nn.Parameter(self._converted(tensor), requires_grad=False)
        found = self._copies[key]
        assert isinstance(found, nn.Parameter)  # for mypy: only parameters are kept under keys
        return found

    def _buffer(self, tensor: Tensor) -> Tensor:
        key = (id(tensor), -1)
        if key not in self._copies:
            self._copies[key] = self._converted(tensor.detach())
        return self._copies[key]

    def _converted(self, tensor: Tensor) -> Tensor:
        dtype = self.dtype if self.dtype is not None and tensor.is_floating_point() else None
        return tensor.to(dtype=dtype, copy=True)
