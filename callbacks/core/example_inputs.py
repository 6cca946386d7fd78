"""The inputs that tracing a plain model takes, for the adapters: given, or taken from the
model's first training forward.

``structure="channel"`` on a plain PyTorch model (no Hugging Face family) finds its channels
by tracing it with example inputs (:class:`~tensorplay.ao.pruning.DependencyGraph`); without
them, tracing stops where a layer's output changes shape (a conv pooled and flattened into a
``Linear``), and that layer is never a unit. An adapter takes the inputs it is given, or the
framework's (Lightning's ``example_input_array``), or, with neither, records the positional
inputs of the model's first training forward with :class:`FirstForward` (a forward pre-hook,
removed right after), so that the pruner is built from them.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Linear(4, 2)
    >>> first = FirstForward(model)
    >>> _ = model(torch.ones(3, 4))
    >>> first.inputs[0].shape, len(model._forward_pre_hooks)
    (torch.Size([3, 4]), 0)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.distillation.left_out import LeftOutOfCopies
from tensorplay.ao.pruning.edits import changes

__all__ = [
    "ExampleInputs",
    "FirstForward",
    "as_example_inputs",
    "check_example_inputs",
    "positional_inputs",
]

ExampleInputs = Tensor | tuple[Any, ...]


def check_example_inputs(value: object) -> None:
    """Check an adapter's ``example_inputs``: a tensor, a tuple of positional inputs, or None.

    Raises:
        TypeError: Naming the type given.

    Example:
        >>> check_example_inputs([1, 2])
        Traceback (most recent call last):
        ...
        TypeError: Expected `example_inputs` to be a tensor, a tuple of the model's positional inputs or None, but got list.
    """  # noqa: E501
    if value is not None and not isinstance(value, (Tensor, tuple)):
        raise TypeError(
            "Expected `example_inputs` to be a tensor, a tuple of the model's positional inputs "
            f"or None, but got {type(value).__name__}."
        )


def positional_inputs(
    forward: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[Any, ...]:
    """The inputs of a call ``forward(*args, **kwargs)`` as positional inputs, in the order of
    ``forward``'s parameters (tracing takes positional inputs only). Keyword arguments that only
    a ``**kwargs`` of ``forward`` takes (the Trainer's ``num_items_in_batch``) are left out.

    Raises:
        ValueError: A keyword argument that no position reaches (it follows a parameter that
            was not given, or is keyword-only), or that ``forward`` has no parameter for,
            naming it.

    Example:
        >>> def forward(x, mask=None, labels=None): ...
        >>> positional_inputs(forward, (), {"x": 1, "mask": 2})
        (1, 2)
        >>> positional_inputs(lambda x, **kwargs: x, (1,), {"num_items_in_batch": 8})
        (1,)
        >>> positional_inputs(forward, (), {"x": 1, "labels": 3})
        Traceback (most recent call last):
        ...
        ValueError: Expected the model's forward to be called with inputs that can be passed by position (tracing takes positional inputs), but 'labels' follows a parameter that was not given, or is keyword-only. Pass `example_inputs` (a tensor or a tuple) to the callback.
    """  # noqa: E501
    if not kwargs:
        return tuple(args)
    try:
        signature = inspect.signature(forward)
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError as error:
        raise ValueError(
            f"Expected inputs that the model's forward takes, but {error}. Pass "
            "`example_inputs` (a tensor or a tuple) to the callback."
        ) from error
    named = [name for name in bound.kwargs if name in signature.parameters]
    if named:
        raise ValueError(
            "Expected the model's forward to be called with inputs that can be passed by "
            f"position (tracing takes positional inputs), but {named[0]!r} "
            "follows a parameter that was not given, or is keyword-only. Pass `example_inputs` "
            "(a tensor or a tuple) to the callback."
        )
    return tuple(bound.args)


def as_example_inputs(model: nn.Module, value: object) -> ExampleInputs | None:
    """A framework's example inputs (Lightning's ``example_input_array``: a tensor, a tuple,
    a list or a dict of keyword arguments) as tracing takes them.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> as_example_inputs(nn.Linear(2, 2), {"input": torch.ones(1, 2)})[0].shape
        torch.Size([1, 2])
    """
    if value is None or isinstance(value, (Tensor, tuple)):
        return value
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, Mapping):
        return positional_inputs(model.forward, (), value)
    raise TypeError(
        f"Expected the example inputs of {type(model).__name__} to be a tensor, a tuple, a list "
        f"or a dict of the forward's arguments, but got {type(value).__name__}."
    )


class FirstForward(LeftOutOfCopies):
    """Record the positional inputs of ``model``'s first training forward (in train mode, with
    gradients enabled), with a forward pre-hook that removes itself right after it, or when it
    fails (a copy of the model never carries it).

    Args:
        model: The model whose inputs tracing will take.
    """

    def __init__(self, model: nn.Module) -> None:
        #: The inputs recorded, ``None`` before the first training forward.
        self.inputs: tuple[Any, ...] | None = None
        #: The model watched.
        self.model = model
        self._handle: Any = changes.hook(
            model.register_forward_pre_hook, self._record, with_kwargs=True
        )

    @property
    def watching(self) -> bool:
        """Whether the hook is still on the model."""
        return self._handle is not None

    def _record(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        try:
            self.inputs = positional_inputs(module.forward, args, kwargs)
        finally:
            self.remove()

    def remove(self) -> None:
        """Take the hook off the model (again: nothing)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
