"""The one owner of every change tensorplay makes to a user's model, and of its undo.

Every hook tensorplay puts on a module, a parameter or an optimizer, every buffer or parameter
it registers, replaces or removes, every attribute it sets on a module or a config, and every
in-place write a refusal must take back, goes through one function of this module. Outside a
:func:`transaction` the change is simply made. Inside one it is also recorded, and an exception
that leaves the transaction (a refusal, a ``KeyboardInterrupt``, a bug) first undoes every change
recorded in it, newest first: the model, its hooks and attributes, and its optimizers' hooks are
then exactly as they were when the transaction began.

What is recorded:

* a structural change to an object (:func:`touch`, which every changing function here calls
  first): a shallow snapshot of the object taken once per transaction, the first time it is
  changed. For a module that is its parameters, buffers, submodules and hooks (each dict, so
  their order too) and its plain attributes; for any other object (a Hugging Face config) its
  attributes. Undoing puts the same objects back in the same order;
* a hook registered through :func:`hook`: its handle is removed;
* the values of a tensor written in place (:func:`keep_values`), only in a transaction opened
  with ``keep_values=True`` (a one-shot call that re-solves weights): a copy on the CPU, copied
  back;
* the data of a tensor swapped for other data (:func:`replace_data`, what making a mask
  permanent does to its ``_orig`` parameter), in the same transactions: a reference to the old
  data, put back (no copy).

Transactions nest: an inner one that succeeds hands its record to the outer one; an inner one
that fails undoes its own changes, and the outer one, if the exception leaves it too, the rest.

Example:
    >>> import torch
    >>> from torch import nn
    >>> layer = nn.Linear(2, 2)
    >>> try:
    ...     with transaction():
    ...         register_buffer(layer, "weight_mask", torch.ones(2, 2, dtype=torch.bool))
    ...         _ = hook(layer.register_forward_pre_hook, lambda module, args: None)
    ...         raise ValueError("refused")
    ... except ValueError:
    ...     pass
    >>> sorted(layer.state_dict()), len(layer._forward_pre_hooks)
    (['bias', 'weight'], 0)
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

__all__ = [
    "OBSERVER_TYPES",
    "ChangeRecord",
    "Observer",
    "atomic",
    "held_references",
    "hook",
    "is_registered",
    "keep_values",
    "observe",
    "on_undo",
    "pop_buffer",
    "register_buffer",
    "replace_data",
    "set_attribute",
    "touch",
    "transaction",
    "trial",
]

H = TypeVar("H", bound=RemovableHandle)
P = ParamSpec("P")
R = TypeVar("R")


class ChangeRecord:
    """The changes made inside one :func:`transaction`, each with its undo.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> with transaction() as record:
        ...     set_attribute(layer, "note", 1)
        >>> len(record), layer.note
        (1, 1)
    """

    def __init__(self, *, keep_values: bool = False, outer: ChangeRecord | None = None) -> None:
        self.keeps_values = keep_values
        self.outer = outer
        self._undo: list[Callable[[], None]] = []
        self._touched: set[int] = set()
        self._kept: set[int] = set()
        # How many references to each parameter the snapshots hold (by id): the aliases'
        # reference count must not take them for another holder of the parameter.
        self._held: collections.Counter[int] = collections.Counter()

    def __len__(self) -> int:
        return len(self._undo)

    def touch(self, obj: object) -> None:
        """Snapshot ``obj`` the first time this transaction changes it."""
        if id(obj) in self._touched:
            return
        self._touched.add(id(obj))
        self._undo.append(_restorer(obj))
        if isinstance(obj, nn.Module):
            self._held.update(id(param) for param in obj._parameters.values())

    def keep(self, tensor: Tensor) -> None:
        """Keep a copy of ``tensor``'s values the first time this transaction writes it."""
        if not self.keeps_values or id(tensor) in self._kept:
            return
        self._kept.add(id(tensor))
        local = _local(tensor)
        saved = torch.empty_like(local, device="cpu").copy_(local.detach())

        def copy_back() -> None:
            with torch.no_grad():
                local.copy_(saved)

        self._undo.append(copy_back)

    def keep_data(self, tensor: Tensor) -> None:
        """Keep a reference to ``tensor``'s data before it is swapped for other data."""
        if not self.keeps_values:
            return
        old = tensor.data

        def put_back() -> None:
            tensor.data = old

        self._undo.append(put_back)

    def add(self, undo: Callable[[], None]) -> None:
        """Record ``undo`` (called, newest first, if the transaction fails)."""
        self._undo.append(undo)

    def take(self, other: ChangeRecord) -> None:
        """Adopt the changes of a nested transaction that succeeded."""
        self._undo.extend(other._undo)
        self._touched |= other._touched
        self._kept |= other._kept
        self._held += other._held

    def undo(self) -> None:
        """Undo every recorded change, newest first; each undo runs even if one fails."""
        errors: list[BaseException] = []
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as error:
                errors.append(error)
        self._touched.clear()
        self._kept.clear()
        self._held.clear()
        if errors:
            raise errors[0]


_CURRENT: ContextVar[ChangeRecord | None] = ContextVar("tensorplay_changes", default=None)


@contextlib.contextmanager
def transaction(*, keep_values: bool = False) -> Iterator[ChangeRecord]:
    """Record the changes made inside; undo them all if an exception leaves the block.

    Args:
        keep_values: Also keep the values that :func:`keep_values` is asked to keep (a nested
            transaction keeps them if any enclosing one does).

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> with transaction():
        ...     set_attribute(layer, "note", "kept")
        >>> layer.note
        'kept'
    """
    outer = _CURRENT.get()
    keeps = keep_values or (outer is not None and outer.keeps_values)
    record = ChangeRecord(keep_values=keeps, outer=outer)
    token = _CURRENT.set(record)
    try:
        yield record
    except BaseException:
        _CURRENT.reset(token)
        record.undo()
        raise
    _CURRENT.reset(token)
    if outer is not None:
        outer.take(record)


class _TrialOver(Exception):
    """Ends a :func:`trial`, undoing its changes."""


@contextlib.contextmanager
def trial(*, keep_values: bool = False) -> Iterator[ChangeRecord]:
    """A :func:`transaction` undone when the block ends, however it ends: a change tried,
    measured and taken back (a search's candidate, hooks that time a forward). An exception
    from the block still leaves it, after the undo.

    Args:
        keep_values: As for :func:`transaction`.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> with trial():
        ...     set_attribute(layer, "note", "tried")
        ...     layer.note
        'tried'
        >>> hasattr(layer, "note")
        False
    """
    try:
        with transaction(keep_values=keep_values) as record:
            yield record
            raise _TrialOver
    except _TrialOver:
        pass


def atomic(function: Callable[P, R]) -> Callable[P, R]:
    """``function`` run inside a :func:`transaction`: if it raises, it leaves nothing behind.

    Example:
        >>> from torch import nn
        >>> @atomic
        ... def note_then_refuse(layer: nn.Module) -> None:
        ...     set_attribute(layer, "note", 1)
        ...     raise ValueError("refused")
        >>> layer = nn.Linear(2, 2)
        >>> try:
        ...     note_then_refuse(layer)
        ... except ValueError:
        ...     pass
        >>> hasattr(layer, "note")
        False
    """

    @functools.wraps(function)
    def all_or_nothing(*args: P.args, **kwargs: P.kwargs) -> R:
        with transaction():
            return function(*args, **kwargs)

    return all_or_nothing


def touch(obj: object) -> None:
    """Record ``obj``'s structure before a change to it (nothing outside a transaction).

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> try:
        ...     with transaction():
        ...         touch(layer)
        ...         del layer._parameters["bias"]
        ...         raise KeyboardInterrupt
        ... except KeyboardInterrupt:
        ...     pass
        >>> list(layer._parameters)
        ['weight', 'bias']
    """
    record = _CURRENT.get()
    if record is not None:
        record.touch(obj)


def hook(register: Callable[..., H], *args: Any, **kwargs: Any) -> H:
    """``register(*args, **kwargs)`` (a ``register_*_hook`` method of a module, a tensor or an
    optimizer), its handle recorded for removal.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> handle = hook(layer.register_forward_hook, lambda module, args, output: None)
        >>> len(layer._forward_hooks)
        1
    """
    handle = register(*args, **kwargs)
    record = _CURRENT.get()
    if record is not None:
        record.add(handle.remove)
    return handle


class Observer:
    """A hook that watches a model for tensorplay without changing what it computes (the
    statistics a score gathers from the forwards): it calls ``watch`` and returns ``None``. A
    copy of the model (``copy.deepcopy``) holds an inert hook in its place, so the copy's
    forwards never feed the statistics of the model it was copied from (an evaluation or EMA
    copy, a teacher), and the copy computes as the model does.

    Args:
        watch: The hook's function (its arguments as the hook's).

    Example:
        >>> import copy
        >>> import torch
        >>> from torch import nn
        >>> seen = []
        >>> layer = nn.Linear(2, 2)
        >>> _ = observe(layer.register_forward_hook, lambda module, args, output: seen.append(1))
        >>> _ = layer(torch.ones(1, 2))
        >>> _ = copy.deepcopy(layer)(torch.ones(1, 2))  # the copy's forward is not seen
        >>> seen
        [1]
    """

    def __init__(self, watch: Callable[..., Any]) -> None:
        self.watch = watch

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.watch(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Inert:
        return _INERT


class _Inert:
    """What an :class:`Observer` is copied as: a hook that does nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __deepcopy__(self, memo: dict[int, Any]) -> _Inert:
        return self

    def __repr__(self) -> str:
        return "<tensorplay observer left out of this copy>"


_INERT = _Inert()

OBSERVER_TYPES: tuple[type, ...] = (Observer, _Inert)
"""The types of an observer hook, on a model or on a copy of it.

Example:
    >>> isinstance(Observer(print), OBSERVER_TYPES), isinstance(print, OBSERVER_TYPES)
    (True, False)
"""


def observe(register: Callable[..., H], watch: Callable[..., Any], **kwargs: Any) -> H:
    """:func:`hook` with ``watch`` as an :class:`Observer`: for the hooks that gather
    statistics and change nothing.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> handle = observe(layer.register_forward_hook, lambda module, args, output: None)
        >>> isinstance(next(iter(layer._forward_hooks.values())), OBSERVER_TYPES)
        True
    """
    return hook(register, Observer(watch), **kwargs)


def on_undo(undo: Callable[[], None]) -> None:
    """Record ``undo``, called if the enclosing transaction fails (nothing outside one): for a
    record tensorplay keeps about a model outside it (what :func:`~tensorplay.ao.pruning.shrink`
    spanned).

    Example:
        >>> calls = []
        >>> try:
        ...     with transaction():
        ...         on_undo(lambda: calls.append("undone"))
        ...         raise ValueError("refused")
        ... except ValueError:
        ...     pass
        >>> calls
        ['undone']
    """
    record = _CURRENT.get()
    if record is not None:
        record.add(undo)


def is_registered(handle: RemovableHandle) -> bool:
    """Whether the hook of ``handle`` is still registered (a failed transaction removes the
    hooks registered in it; their owners ask before trusting a handle they kept).

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> handle = hook(layer.register_forward_hook, lambda module, args, output: None)
        >>> before = is_registered(handle)
        >>> handle.remove()
        >>> before, is_registered(handle)
        (True, False)
    """
    hooks = handle.hooks_dict_ref()
    return hooks is not None and handle.id in hooks


def register_buffer(module: nn.Module, name: str, tensor: Tensor, persistent: bool = True) -> None:
    """``module.register_buffer(name, tensor, persistent)``, recorded.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> register_buffer(layer, "scale", torch.ones(1))
        >>> sorted(layer.state_dict())
        ['bias', 'scale', 'weight']
    """
    touch(module)
    module.register_buffer(name, tensor, persistent=persistent)


def pop_buffer(module: nn.Module, name: str) -> Tensor | None:
    """Remove the buffer ``name`` (if any) from ``module`` and return it, recorded.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> norm = nn.BatchNorm1d(2)
        >>> pop_buffer(norm, "running_mean").tolist(), pop_buffer(norm, "missing")
        ([0.0, 0.0], None)
    """
    touch(module)
    module._non_persistent_buffers_set.discard(name)
    return module._buffers.pop(name, None)


def set_attribute(obj: object, name: str, value: Any) -> None:
    """``setattr(obj, name, value)`` on a module or any other object (a config), recorded.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> set_attribute(layer, "in_features", 3)
        >>> layer.in_features
        3
    """
    touch(obj)
    setattr(obj, name, value)


def held_references(param: object) -> int:
    """How many references to ``param`` the open transactions' snapshots hold (a count of
    references that tells whether anything else holds a parameter must leave them out).

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> with transaction():
        ...     touch(layer)
        ...     held_references(layer.weight)
        1
        >>> held_references(layer.weight)
        0
    """
    record, count = _CURRENT.get(), 0
    while record is not None:
        count += record._held[id(param)]
        record = record.outer
    return count


def keep_values(tensor: Tensor) -> None:
    """Keep a CPU copy of ``tensor``'s values before an in-place write, where the enclosing
    transaction asked to (``transaction(keep_values=True)``); nothing otherwise.

    Example:
        >>> import torch
        >>> weight = torch.ones(2)
        >>> try:
        ...     with transaction(keep_values=True):
        ...         keep_values(weight)
        ...         _ = weight.zero_()
        ...         raise ValueError("refused")
        ... except ValueError:
        ...     pass
        >>> weight.tolist()
        [1.0, 1.0]
    """
    record = _CURRENT.get()
    if record is not None:
        record.keep(tensor)


def replace_data(tensor: Tensor, data: Tensor) -> None:
    """``tensor.data = data``; where the enclosing transaction keeps values
    (``transaction(keep_values=True)``), the old data is put back if it fails (by reference: no
    copy is made).

    Example:
        >>> import torch
        >>> weight = torch.nn.Parameter(torch.ones(2))
        >>> try:
        ...     with transaction(keep_values=True):
        ...         replace_data(weight, torch.zeros(2))
        ...         raise ValueError("refused")
        ... except ValueError:
        ...     pass
        >>> weight.tolist()
        [1.0, 1.0]
    """
    record = _CURRENT.get()
    if record is not None:
        record.keep_data(tensor)
    tensor.data = data


def _local(tensor: Tensor) -> Tensor:
    """A ``DTensor``'s local shard, or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return tensor if to_local is None else to_local()


# A module's containers, restored in place (their identity may be held elsewhere, a hook
# handle's reference to its hook dict among them).
def _restorer(obj: object) -> Callable[[], None]:
    """How to put ``obj``'s structure back as it is now (see :func:`touch`)."""
    state = vars(obj)
    saved = dict(state)
    containers = {
        key: (value, value.copy())
        for key, value in state.items()
        if isinstance(value, (dict, set)) and isinstance(obj, nn.Module)
    }

    def restore() -> None:
        for key in [key for key in state if key not in saved]:
            del state[key]
        state.update(saved)
        for container, copy in containers.values():
            container.clear()
            container.update(copy)  # type: ignore[arg-type]

    return restore
