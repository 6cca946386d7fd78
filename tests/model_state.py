"""A whole model before and after a call: what a refusal must leave exactly as it was.

``check = unchanged(model)`` takes the model's picture; ``check()`` later fails, naming the first
difference, unless the model is as it was:

* its ``state_dict``: the same keys in the same order, each value bit for bit (dtype and shape
  included: ``-0.0`` is not ``0.0``, and a NaN is itself);
* its parameters and buffers: the same objects under the same names, in the same order (and
  each parameter's ``requires_grad``);
* its modules: the same objects under the same names;
* its hooks: every hook dict of every module (forward, pre-forward, backward, state-dict and
  load hooks, with their flags), and every parameter's post-accumulate-grad hooks, the same
  hooks under the same keys; a hook that is an object of its own (a pruning method, a
  ``PruningContainer``) with the same attributes (its tensor name, amount, methods);
* its attributes: each module's plain attributes (``tensorplay_unit_groups``, a masked
  tensor's ``<name>``, ``__deepcopy__``, ``in_features`` ...) the same objects or equal values;
* a Hugging Face model's config: the same ``to_dict()``, and no attribute added or dropped;
* the hooks of any optimizer given beside it.

``check = unchanged_hooks(model)`` checks the hooks alone (every hook dict of every module, every
parameter's gradient hooks, the optimizers' hooks): what a run of training, which changes the
weights, must leave as it found.

Example:
    >>> import torch
    >>> from torch import nn
    >>> layer = nn.Linear(2, 2)
    >>> check = unchanged(layer)
    >>> check()
    >>> layer.note = 1
    >>> check()
    Traceback (most recent call last):
    ...
    AssertionError: the attributes of module '' changed: ['note'] added...
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

__all__ = ["unchanged", "unchanged_hooks"]

_CONTAINERS = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")


def _hook_dicts(obj: object) -> dict[str, list[tuple[int, int]]]:
    """Every hook dict of ``obj`` (a module or an optimizer) as ``(key, id(hook))`` pairs."""
    return {
        name: [(key, id(hook)) for key, hook in value.items()]
        for name, value in vars(obj).items()
        if "hooks" in name and isinstance(value, dict)
    }


def _hook_states(module: nn.Module) -> dict[tuple[str, int], dict[str, Any]]:
    """The attributes of each hook of ``module`` that is an object of its own (a pruning method:
    its tensor name and amount, a container's methods), not a function or a bound method."""
    return {
        (name, key): dict(vars(hook))
        for name, value in vars(module).items()
        if "hooks" in name and isinstance(value, dict)
        for key, hook in value.items()
        if hasattr(hook, "__dict__")
        and not inspect.isroutine(hook)
        and not isinstance(hook, functools.partial)
    }


def _grad_hooks(param: Tensor) -> list[tuple[int, int]]:
    """A parameter's post-accumulate-grad hooks as ``(key, id(hook))`` pairs."""
    hooks = getattr(param, "_post_accumulate_grad_hooks", None) or {}
    return [(key, id(hook)) for key, hook in hooks.items()]


def _plain(module: nn.Module, ignoring: Collection[str] = ()) -> dict[str, Any]:
    """A module's plain attributes: the object for a tensor, a module or a callable, the value
    for data (compared by equality); those named in ``ignoring`` left out."""
    return {
        key: value
        for key, value in vars(module).items()
        if key not in _CONTAINERS
        and key not in ignoring
        and not ("hooks" in key and isinstance(value, dict))
    }


def _bits(tensor: Tensor) -> Tensor:
    """A floating tensor's bits as integers (so ``-0.0`` differs from ``0.0`` and a NaN equals
    itself); any other tensor as it is."""
    tensor = tensor.detach()
    if tensor.is_floating_point() or tensor.is_complex():
        return tensor.reshape(-1).contiguous().view(torch.uint8)
    return tensor


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor) or callable(a) or callable(b):
        return a is b
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a bool: the same object then
        return a is b


def _config_of(model: nn.Module) -> tuple[dict[str, Any], set[str]] | None:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    return config.to_dict(), set(vars(config))


def unchanged(
    model: nn.Module, *optimizers: Optimizer, ignoring: Collection[str] = ()
) -> Callable[[], None]:
    """A check that ``model`` (and the hooks of ``optimizers``) are as they are now; see the
    module docstring. ``ignoring`` names plain attributes a training framework sets on the
    modules it runs (Lightning's ``_trainer``): not compared."""
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    dtypes = {key: value.dtype for key, value in state.items()}
    params = [
        (name, id(p), p.requires_grad) for name, p in model.named_parameters(remove_duplicate=False)
    ]
    buffers = [(name, id(b)) for name, b in model.named_buffers(remove_duplicate=False)]
    modules = [(name, id(m)) for name, m in model.named_modules(remove_duplicate=False)]
    hooks = {name: _hook_dicts(m) for name, m in model.named_modules()}
    hook_states = {name: _hook_states(m) for name, m in model.named_modules()}
    grad_hooks = {name: _grad_hooks(p) for name, p in model.named_parameters()}
    attributes = {name: _plain(m, ignoring) for name, m in model.named_modules()}
    config = _config_of(model)
    optimizer_hooks = [_hook_dicts(optimizer) for optimizer in optimizers]

    def check() -> None:
        now = model.state_dict()
        assert list(now) == list(state), (
            f"the state_dict keys changed: {sorted(set(now) ^ set(state))} added or dropped"
        )
        for key, value in now.items():
            assert value.dtype == dtypes[key], f"{key!r} changed dtype to {value.dtype}"
            assert value.shape == state[key].shape and torch.equal(
                _bits(value), _bits(state[key])
            ), f"the values of {key!r} changed"
        named = [
            (name, id(p), p.requires_grad)
            for name, p in model.named_parameters(remove_duplicate=False)
        ]
        assert named == params, (
            "the parameters changed (other objects, names, order or requires_grad)"
        )
        named = [(name, id(b)) for name, b in model.named_buffers(remove_duplicate=False)]
        assert named == buffers, "the buffers changed (other objects, names or order)"
        named = [(name, id(m)) for name, m in model.named_modules(remove_duplicate=False)]
        assert named == modules, "the modules changed (other objects, names or order)"
        for name, module in model.named_modules():
            assert _hook_dicts(module) == hooks[name], f"the hooks of module {name!r} changed"
            for where, hook_state in _hook_states(module).items():
                before_state = hook_states[name][where]
                assert list(hook_state) == list(before_state) and all(
                    _same(value, before_state[key]) for key, value in hook_state.items()
                ), f"the state of hook {where} of module {name!r} changed"
            plain, before = _plain(module, ignoring), attributes[name]
            added = sorted(set(plain) - set(before))
            dropped = sorted(set(before) - set(plain))
            assert not added and not dropped, (
                f"the attributes of module {name!r} changed: {added} added"
                + (f", {dropped} dropped" if dropped else "")
            )
            for key, value in plain.items():
                assert _same(value, before[key]), f"attribute {key!r} of module {name!r} changed"
        for name, param in model.named_parameters():
            assert _grad_hooks(param) == grad_hooks[name], f"the gradient hooks of {name!r} changed"
        if config is not None:
            found_config = _config_of(model)
            assert found_config is not None and found_config[1] == config[1], (
                "the config's attributes changed"
            )
            assert found_config[0] == config[0], "the config changed"
        for optimizer, before_hooks in zip(optimizers, optimizer_hooks, strict=True):
            assert _hook_dicts(optimizer) == before_hooks, "an optimizer's hooks changed"

    return check


def unchanged_hooks(model: nn.Module, *optimizers: Optimizer) -> Callable[[], None]:
    """A check that the hooks of ``model`` and ``optimizers`` are as they are now (the hooks part
    of :func:`unchanged`; the weights, attributes and config may change).

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> check = unchanged_hooks(layer)
        >>> with torch.no_grad():
        ...     _ = layer.weight.zero_()
        >>> check()
        >>> handle = layer.register_forward_hook(lambda module, args, output: None)
        >>> check()
        Traceback (most recent call last):
        ...
        AssertionError: the hooks of module '' changed...
    """
    modules = [name for name, _ in model.named_modules()]
    hooks = {name: _hook_dicts(m) for name, m in model.named_modules()}
    grad_hooks = {name: _grad_hooks(p) for name, p in model.named_parameters()}
    optimizer_hooks = [_hook_dicts(optimizer) for optimizer in optimizers]

    def check() -> None:
        assert [name for name, _ in model.named_modules()] == modules, "the modules changed"
        for name, module in model.named_modules():
            found = _hook_dicts(module)
            assert found == hooks[name], (
                f"the hooks of module {name!r} changed: {hooks[name]} then {found}"
            )
        found = {name: _grad_hooks(p) for name, p in model.named_parameters()}
        assert found == grad_hooks, "the parameters' gradient hooks changed"
        for optimizer, before in zip(optimizers, optimizer_hooks, strict=True):
            assert _hook_dicts(optimizer) == before, "an optimizer's hooks changed"

    return check
