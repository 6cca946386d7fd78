"""The optimizers a pruner acts on: one channel for state resets and the masking mode's hooks.

A pruner touches optimizers in two ways, both after each pruning event that pruned something:
it clears the whole state of the optimizers it was given for that (``optimizers=``: fresh Adam
moments after a rewind), and it zeroes the pruned entries of the state of the optimizers
attached with ``attach()``, whose hooks (made by the masking mode) keep pruned weights zero
through every step. :class:`AttachedOptimizers` holds both lists and is the only place that
does either. A framework's wrapper of an optimizer (Accelerate's ``AcceleratedOptimizer``,
Lightning's ``LightningOptimizer``) is taken for the ``torch.optim.Optimizer`` it wraps
(:func:`unwrap_optimizer`), so the hooks land where the step really runs.

Example:
    >>> import torch
    >>> weight = torch.nn.Parameter(torch.ones(2))
    >>> optimizer = torch.optim.SGD([weight], lr=0.1, momentum=0.9)
    >>> weight.grad = torch.ones(2)
    >>> optimizer.step()
    >>> links = AttachedOptimizers([optimizer])
    >>> links.after_pruning()
    >>> len(optimizer.state)
    0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from torch import Tensor
from torch.optim import Optimizer

from tensorplay.ao.pruning.masking.optimizer_hooks import OptimizerAttachment, OptimizerHooks

if TYPE_CHECKING:
    from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["AttachedOptimizers", "HookFactory", "held_targets", "unwrap_optimizer"]

# (optimizer, the params and masks of its targets, mask_gradients, generation) -> hooks.
HookFactory = Callable[
    [Optimizer, Callable[[], tuple[list[Tensor], list[Tensor]]], bool, Callable[[], int]],
    OptimizerHooks,
]


def unwrap_optimizer(optimizer: object) -> object:
    """The ``torch.optim.Optimizer`` that ``optimizer`` wraps, if it is a wrapper; else itself.

    A wrapper is recognised by duck typing, so the core imports no framework: an object whose
    ``optimizer`` attribute is, or through further ``optimizer`` attributes leads to, a
    ``torch.optim.Optimizer`` (Accelerate's ``AcceleratedOptimizer``, itself an ``Optimizer``
    subclass whose step calls the wrapped one's, or Lightning's ``LightningOptimizer``).

    Example:
        >>> import torch
        >>> sgd = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
        >>> class Wrapper:
        ...     def __init__(self, optimizer):
        ...         self.optimizer = optimizer
        >>> unwrap_optimizer(Wrapper(Wrapper(sgd))) is sgd, unwrap_optimizer(sgd) is sgd
        (True, True)
    """
    found, inner = optimizer, getattr(optimizer, "optimizer", None)
    for _ in range(8):  # a wrapper of a wrapper, never a cycle
        if inner is None:
            break
        if isinstance(inner, Optimizer):
            found = inner
        inner = getattr(inner, "optimizer", None)
    return found


def held_targets(optimizer: object, targets: Sequence[Target]) -> list[Target]:
    """The ``targets`` whose parameter ``optimizer`` (unwrapped, see :func:`unwrap_optimizer`)
    holds in one of its parameter groups, in the targets' order.

    Raises:
        TypeError: ``optimizer`` is not a ``torch.optim.Optimizer`` or a wrapper of one.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.targets.tied import Target
        >>> first, second = nn.Linear(2, 2), nn.Linear(2, 2)
        >>> targets = [Target(("0",), ((first, "weight"),)), Target(("1",), ((second, "weight"),))]
        >>> optimizer = torch.optim.SGD(second.parameters(), lr=0.1)
        >>> [target.name for target in held_targets(optimizer, targets)]
        ['1']
    """
    inner = unwrap_optimizer(optimizer)
    if not isinstance(inner, Optimizer):
        raise TypeError(
            "Expected `optimizer` to be a torch.optim.Optimizer (or a wrapper of one exposing "
            f"it as .optimizer), but got {type(optimizer).__name__}."
        )
    params = {id(p) for group in inner.param_groups for p in group["params"]}
    return [target for target in targets if id(target.parameter()) in params]


class AttachedOptimizers:
    """The optimizers whose state a pruner resets and those it keeps hooks on.

    Args:
        reset: Optimizers whose whole state is cleared after each pruning event (wrappers are
            unwrapped, see :func:`unwrap_optimizer`).
    """

    def __init__(self, reset: Sequence[Optimizer] = ()) -> None:
        self.reset = reset
        self._hooks: list[OptimizerHooks] = []
        self.gradients_masked = 0  # counts mask_gradients() calls: the hooks skip a second pass

    @property
    def reset(self) -> list[Optimizer]:
        """The optimizers whose whole state is cleared after each pruning event."""
        return self._reset

    @reset.setter
    def reset(self, optimizers: Sequence[Optimizer]) -> None:
        self._reset: list[Optimizer] = [unwrap_optimizer(o) for o in optimizers]  # type: ignore[misc]

    @property
    def hooks(self) -> list[OptimizerHooks]:
        """The hooks still on their optimizers."""
        self._hooks = [hooks for hooks in self._hooks if hooks.active]
        return self._hooks

    def attach(
        self,
        optimizers: Sequence[Optimizer],
        held: Callable[[Optimizer], Callable[[], tuple[list[Tensor], list[Tensor]]] | None],
        make: HookFactory,
        mask_gradients: bool,
        names: Sequence[str],
    ) -> OptimizerAttachment:
        """Hook each optimizer, after checking them all.

        Args:
            optimizers: The optimizers to attach (wrappers are unwrapped, see
                :func:`unwrap_optimizer`).
            held: ``optimizer -> (() -> (params, masks))`` of the targets it holds, ``None``
                if it holds none.
            make: The masking mode's hook factory.
            mask_gradients: Whether the pre-step hooks mask the gradients.
            names: The targets' names, for the message.

        Raises:
            ValueError: No optimizer, one attached already, or one that holds no target.
            TypeError: An argument that is not an optimizer, or a ``mask_gradients`` that is
                not a bool.
        """
        if not isinstance(mask_gradients, bool):
            raise TypeError(f"Expected `mask_gradients` to be a bool, but got {mask_gradients!r}.")
        if not optimizers:
            raise ValueError("Expected at least one optimizer to attach, but got none.")
        attached = {id(hooks.optimizer) for hooks in self.hooks}
        optimizers = [unwrap_optimizer(optimizer) for optimizer in optimizers]  # type: ignore[misc]
        readers = []
        for position, optimizer in enumerate(optimizers):
            kind = type(optimizer).__name__
            if not isinstance(optimizer, Optimizer):
                raise TypeError(
                    "Expected each optimizer to be a torch.optim.Optimizer, but got "
                    f"{kind} at position {position}."
                )
            if id(optimizer) in attached:
                raise ValueError(
                    f"Expected each optimizer to be attached once, but {kind} at position "
                    f"{position} is attached already."
                )
            attached.add(id(optimizer))
            reader = held(optimizer)
            if reader is None:
                raise ValueError(
                    f"Expected each optimizer to hold at least one target, but {kind} at "
                    f"position {position} holds none of {list(names)}."
                )
            readers.append(reader)
        made = []
        for optimizer, reader in zip(optimizers, readers, strict=True):
            hooks = make(optimizer, reader, mask_gradients, lambda: self.gradients_masked)
            hooks.zero_state()
            made.append(hooks)
        self._hooks.extend(made)
        return OptimizerAttachment(made)

    def after_pruning(self) -> None:
        """Clear the state of the reset optimizers; zero the pruned entries of the hooked
        optimizers' state."""
        for optimizer in self.reset:
            optimizer.state.clear()
        for hooks in self.hooks:
            hooks.zero_state()

    def remove_hooks(self) -> None:
        """Take every hook off its optimizer."""
        for hooks in self.hooks:
            hooks.remove()
        self._hooks = []
