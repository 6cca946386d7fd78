"""The hooks a copy of a model leaves out: pruning hooks and those of :class:`LeftOutOfCopies`.

A teacher copied from its student
(:func:`~tensorplay.ao.pruning.distillation.dense_copy.dense_copy`,
:func:`~tensorplay.ao.pruning.distillation.sharded_copy.sharded_copy`) computes as the student
does, but carries none of the hooks tensorplay or an adapter put on the student to watch or steer
its training: ``copy.deepcopy`` copies each such hook as :data:`LEFT_OUT`, which
:func:`drop_left_out_hooks` then removes from the copy.

Example:
    >>> from torch import nn
    >>> class Watcher(LeftOutOfCopies):
    ...     def hook(self, module, args, output):
    ...         pass
    >>> layer = nn.Linear(2, 2)
    >>> _ = layer.register_forward_hook(Watcher().hook)
    >>> [is_left_out(hook) for hook in layer._forward_hooks.values()]
    [True]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from tensorplay.ao.pruning.edits import changes

__all__ = [
    "LEFT_OUT",
    "LeftOutOfCopies",
    "drop_left_out_hooks",
    "hook_dicts",
    "is_left_out",
    "left_out_memo",
]

# Hook dicts whose keys are a hook's handle id in another hook dict (torch's flags per hook).
_HOOK_FLAGS = (
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)
LEFT_OUT = object()  # what a left-out hook is copied as, then removed


class LeftOutOfCopies:
    """A mixin: module hooks that are bound methods of its instances are not copied by
    :func:`~tensorplay.ao.pruning.distillation.dense_copy.dense_copy` (a
    :class:`~tensorplay.ao.pruning.distillation.Distillation`'s hooks on its student never reach the
    teacher copied from that student).

    Example:
        >>> from torch import nn
        >>> class Watcher(LeftOutOfCopies):
        ...     def hook(self, module, args, output):
        ...         pass
        >>> layer = nn.Linear(2, 2)
        >>> _ = layer.register_forward_hook(Watcher().hook)
        >>> from tensorplay.ao.pruning.distillation.dense_copy import dense_copy
        >>> len(layer._forward_hooks), len(dense_copy(layer)._forward_hooks)
        (1, 0)
    """


def is_left_out(hook: object) -> bool:
    """A pruning method (or container) as a forward pre-hook, a :class:`LeftOutOfCopies`'s
    bound method, or an observer of a score's statistics
    (:class:`~tensorplay.ao.pruning.edits.changes.Observer`)."""
    if isinstance(hook, changes.OBSERVER_TYPES):
        return True
    is_pruning = isinstance(getattr(hook, "_tensor_name", None), str) and callable(
        getattr(hook, "apply_mask", None)
    )
    return is_pruning or isinstance(getattr(hook, "__self__", None), LeftOutOfCopies)


def hook_dicts(module: nn.Module) -> list[dict[int, Any]]:
    return [
        value
        for key, value in vars(module).items()
        if key.endswith("_hooks") and isinstance(value, dict)
    ]


def left_out_memo(model: nn.Module, also: Callable[[object], bool] | None = None) -> dict[int, Any]:
    """A ``copy.deepcopy`` memo that copies as :data:`LEFT_OUT` every hook of ``model``'s
    modules that a copy leaves out (:func:`is_left_out`, or ``also`` says so).

    Example:
        >>> class Watcher(LeftOutOfCopies):
        ...     def hook(self, module, args, output):
        ...         pass
        >>> layer = nn.Linear(2, 2)
        >>> _ = layer.register_forward_hook(Watcher().hook)
        >>> _ = layer.register_forward_hook(lambda module, args, output: None)
        >>> list(left_out_memo(layer).values()) == [LEFT_OUT]
        True
    """
    return {
        id(hook): LEFT_OUT
        for module in model.modules()
        for hooks in hook_dicts(module)
        for hook in hooks.values()
        if is_left_out(hook) or (also is not None and also(hook))
    }


def drop_left_out_hooks(module: nn.Module) -> None:
    left_out: set[int] = set()
    for hooks in hook_dicts(module):
        for key in [key for key, hook in hooks.items() if hook is LEFT_OUT]:
            left_out.add(key)
            del hooks[key]
    for name in _HOOK_FLAGS:
        flags = vars(module).get(name)
        if isinstance(flags, dict):
            for key in left_out & set(flags):
                del flags[key]
