"""Where the pruning of one tensor lives: its ``_orig`` parameter, its ``_mask`` buffer, its hook.

The one place that answers "is ``module.<name>`` pruned, and where are its parts" for the whole
package. A tensor ``name`` is pruned when its module holds all three parts that
``torch.nn.utils.prune`` puts in place:

* the parameter ``name + '_orig'``,
* the buffer ``name + '_mask'``,
* a forward pre-hook with ``_tensor_name == name`` (a pruning method or a container of them).

A module that holds only some of them (a hand-edited or half-loaded one) is not pruned, and
:func:`pruned_parts` says which part is missing. The hook is recognised by its ``_tensor_name``
and ``apply_mask``, so a tensor pruned by ``torch.nn.utils.prune`` itself is found too
(:attr:`PrunedParts.is_torch` tells it apart).

Example:
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.methods import l1_unstructured
    >>> module = l1_unstructured(nn.Linear(3, 2), "weight", amount=2)
    >>> parts = pruned_parts(module, "weight")
    >>> parts.orig is module.weight_orig, parts.mask is module.weight_mask, count_pruned(parts)
    (True, True, 2)
    >>> is_pruned_tensor(module, "bias"), pruned_parts(module, "bias")
    (False, None)
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.selection.checks import count_zeros

__all__ = [
    "PrunedParts",
    "count_pruned",
    "count_zeros",
    "find_hook",
    "install",
    "is_pruned_tensor",
    "parameter_of",
    "pruned_parts",
    "pruned_tensor_names",
    "remove_parts",
    "reparametrized_names",
]


@dataclass(frozen=True)
class PrunedParts:
    """The three parts of one pruned tensor.

    Args:
        orig: The parameter ``<name>_orig`` (still trained).
        mask: The buffer ``<name>_mask`` (0 where a unit is pruned), the module's current one.
        hook: The forward pre-hook recomputing ``<name>``.
        key: The hook's key in ``module._forward_pre_hooks``.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.parity.methods import identity
        >>> parts = pruned_parts(identity(nn.Linear(2, 2), "weight"), "weight")
        >>> type(parts.hook).__name__, parts.is_torch
        ('Identity', False)
    """

    orig: nn.Parameter
    mask: Tensor
    hook: Any
    key: int

    @property
    def is_torch(self) -> bool:
        """Whether the hook is ``torch.nn.utils.prune``'s, not tensorplay's."""
        return isinstance(self.hook, torch_prune.BasePruningMethod)


def _is_pruning_hook(hook: object, name: str) -> bool:
    return getattr(hook, "_tensor_name", None) == name and callable(
        getattr(hook, "apply_mask", None)
    )


def find_hook(module: nn.Module, name: str) -> tuple[int | None, Any]:
    """``(key, hook)`` of the pruning hook of ``module.<name>``, or ``(None, None)``.

    Raises:
        AssertionError: if the tensor has more than one pruning hook (torch's type).

    Example:
        >>> from torch import nn
        >>> find_hook(nn.Linear(2, 2), "weight")
        (None, None)
    """
    found = [
        (key, hook)
        for key, hook in module._forward_pre_hooks.items()
        if _is_pruning_hook(hook, name)
    ]
    if len(found) > 1:
        # torch's type and words: its tests match them
        raise AssertionError(
            f"Avoid adding multiple pruning hooks to the same tensor {name} of module {module}. "
            "Use a PruningContainer."
        )
    return found[0] if found else (None, None)


def pruned_parts(module: nn.Module, name: str) -> PrunedParts | None:
    """The parts of ``module.<name>`` if it is pruned, else ``None``.

    Raises:
        ValueError: if the tensor has a pruning hook but its ``_orig`` parameter or ``_mask``
            buffer is missing (a module edited by hand), naming the pair and the part.

    Example:
        >>> from torch import nn
        >>> pruned_parts(nn.Linear(2, 2), "weight") is None
        True
    """
    key, hook = find_hook(module, name)
    if hook is None:
        return None
    orig = module._parameters.get(name + "_orig")
    mask = module._buffers.get(name + "_mask")
    if not isinstance(orig, nn.Parameter) or mask is None:
        missing = f"{name}_orig" if not isinstance(orig, nn.Parameter) else f"{name}_mask"
        raise ValueError(
            f"Expected ({type(module).__name__}, {name!r}), which has a pruning hook, to have "
            f"the parameter {name}_orig and the buffer {name}_mask, but {missing} is missing."
        )
    assert key is not None  # for mypy: found together with the hook
    return PrunedParts(orig, mask, hook, key)


def is_pruned_tensor(module: nn.Module, name: str) -> bool:
    """Whether ``module.<name>`` is pruned: it has a hook, ``_orig`` and ``_mask``.

    Example:
        >>> from torch import nn
        >>> is_pruned_tensor(nn.Linear(2, 2), "weight")
        False
    """
    _, hook = find_hook(module, name)
    return (
        hook is not None
        and isinstance(module._parameters.get(name + "_orig"), nn.Parameter)
        and module._buffers.get(name + "_mask") is not None
    )


def parameter_of(module: nn.Module, name: str) -> nn.Parameter | None:
    """The parameter behind ``module.<name>``: itself, or ``<name>_orig`` if pruned; else None.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.parity.methods import identity
        >>> module = identity(nn.Linear(2, 2), "weight")
        >>> parameter_of(module, "weight") is module.weight_orig, parameter_of(module, "nope")
        (True, None)
    """
    param = module._parameters.get(name)
    if param is not None:
        return param
    parts = pruned_parts(module, name)
    return None if parts is None else parts.orig


def pruned_tensor_names(module: nn.Module, excluding: object = None) -> list[str]:
    """The names of ``module``'s own tensors that carry a pruning hook, in hook order.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.parity.methods import identity
        >>> pruned_tensor_names(identity(identity(nn.Linear(2, 2), "bias"), "weight"))
        ['bias', 'weight']
    """
    names = [getattr(hook, "_tensor_name", None) for hook in module._forward_pre_hooks.values()]
    return [
        name
        for name, hook in zip(names, module._forward_pre_hooks.values(), strict=True)
        if isinstance(name, str) and hook is not excluding and _is_pruning_hook(hook, name)
    ]


def reparametrized_names(state_dict: Mapping[str, object]) -> list[str]:
    """The names ``state_dict`` saves reparametrized (both ``<name>_orig`` and ``<name>_mask``
    are keys), in key order.

    Example:
        >>> reparametrized_names({"fc.weight_orig": 0, "fc.weight_mask": 0, "fc.bias": 0})
        ['fc.weight']
    """
    return [
        key[: -len("_orig")]
        for key in state_dict
        if key.endswith("_orig") and key[: -len("_orig")] + "_mask" in state_dict
    ]


def count_pruned(parts: PrunedParts | Tensor) -> int:
    """The pruned units of a tensor: the zeros of its mask (of the tensor itself if given one).

    Exact: it reads the values every time (an edit through ``.data`` leaves no trace to trust).

    Example:
        >>> import torch
        >>> count_pruned(torch.tensor([0.0, 1.0, 0.0]))
        2
    """
    return count_zeros([parts.mask if isinstance(parts, PrunedParts) else parts])[0]


def install(module: nn.Module, name: str, hook: Any, mask: Tensor, old_key: int | None) -> None:
    """Put ``hook`` and ``mask`` in place for ``module.<name>``; nothing here fails on checked
    input.

    On first pruning (``old_key is None``) the parameter moves to ``<name>_orig``; otherwise
    the hook under ``old_key`` is replaced by ``hook`` (re-registered last, as torch does).
    ``mask`` becomes the ``<name>_mask`` buffer, ``<name>`` is computed, and the module learns to
    deep-copy itself (torch cannot deep-copy the non-leaf ``<name>``).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning import Identity
        >>> layer, hook = nn.Linear(2, 1), Identity()
        >>> hook._tensor_name = "bias"
        >>> install(layer, "bias", hook, torch.zeros(1), old_key=None)
        >>> sorted(layer.state_dict()), layer.bias.eq(0).tolist()
        (['bias_mask', 'bias_orig', 'weight'], [True])
    """
    changes.touch(module)
    if old_key is None:
        orig = module._parameters.pop(name)
        module.register_parameter(name + "_orig", orig)
    else:
        del module._forward_pre_hooks[old_key]
    module.register_buffer(name + "_mask", mask)
    setattr(module, name, hook.apply_mask(module))
    module.register_forward_pre_hook(hook)
    module.__dict__["__deepcopy__"] = functools.partial(_deepcopy_pruned_module, module)


def remove_parts(module: nn.Module, name: str, hook: Any, weight: Tensor) -> None:
    """Make ``module.<name>`` a parameter again holding ``weight``; drop ``_orig`` and ``_mask``.

    The caller removes ``hook`` from the module's hooks (torch's ``remove`` does it after).

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.parity.methods import identity
        >>> layer = identity(nn.Linear(2, 1), "bias")
        >>> key, hook = find_hook(layer, "bias")
        >>> remove_parts(layer, "bias", hook, hook.apply_mask(layer))
        >>> del layer._forward_pre_hooks[key]
        >>> sorted(layer.state_dict())
        ['bias', 'weight']
    """
    changes.touch(module)
    if hasattr(module, name):
        delattr(module, name)
    orig = module._parameters[name + "_orig"]
    assert orig is not None  # for mypy: _orig is always a Parameter here
    changes.replace_data(orig, weight.data)
    del module._parameters[name + "_orig"]
    del module._buffers[name + "_mask"]
    setattr(module, name, orig)
    if not pruned_tensor_names(module, excluding=hook):
        module.__dict__.pop("__deepcopy__", None)


def _deepcopy_pruned_module(module: nn.Module, memo: dict[int, Any]) -> nn.Module:
    """Deep-copy a pruned module, which torch cannot do.

    ``module.<name>`` is ``mask * orig``, a non-leaf tensor that ``copy.deepcopy`` refuses. The
    copy gets a detached value instead (its own forward pre-hook recomputes it from the copied
    ``_orig`` and ``_mask``), so ``copy.deepcopy`` works on pruned models, as EMA/SWA wrappers
    and teacher models need. ``copy.deepcopy`` finds this function in the instance dict.
    """
    state = module.__dict__
    masked = {name: state[name] for name in pruned_tensor_names(module) if name in state}
    copier = state.pop("__deepcopy__")
    state.update({name: tensor.detach() for name, tensor in masked.items()})
    try:
        clone = copy.deepcopy(module, memo)
    finally:
        state.update(masked)
        state["__deepcopy__"] = copier
    clone.__dict__["__deepcopy__"] = functools.partial(_deepcopy_pruned_module, clone)
    return clone
