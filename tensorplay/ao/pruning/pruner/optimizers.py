"""The pruner's dealings with optimizers: hooks, state resets, gradient scores, gradient masks.

:class:`OptimizerLinks` is the part of :class:`~tensorplay.ao.pruning.pruner.Pruner` that a
training loop calls around ``optimizer.step()``: :meth:`~OptimizerLinks.attach` hooks optimizers
(the masking mode's hooks keep lean pruned weights zero; a gradient score accumulates before
each step), :meth:`~OptimizerLinks.held_by` says which targets an optimizer holds,
:meth:`~OptimizerLinks.accumulate` feeds a gradient score, :meth:`~OptimizerLinks.mask_gradients`
zeroes pruned gradients, and :attr:`~OptimizerLinks.optimizers` are those whose state a pruning
event clears. The :class:`~tensorplay.ao.pruning.pruner.attached_optimizers.AttachedOptimizers` it
holds is the one place that touches them.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> model = nn.Linear(4, 2)
    >>> pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
    >>> isinstance(pruner, OptimizerLinks), pruner.held_by(torch.optim.SGD(model.parameters()))
    (True, ['weight'])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor
from torch.optim import Optimizer

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.importance import Importance
from tensorplay.ao.pruning.importance.step_hooks import GradientHooks
from tensorplay.ao.pruning.masking import MaskingMode
from tensorplay.ao.pruning.masking.optimizer_hooks import OptimizerAttachment, OptimizerHooks
from tensorplay.ao.pruning.pruner.attached_optimizers import AttachedOptimizers, held_targets
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["OptimizerLinks"]


class OptimizerLinks:
    """The optimizer methods of :class:`~tensorplay.ao.pruning.pruner.Pruner` (see the module);
    the pruner provides the targets, the masking mode, the importance and the optimizers."""

    _targets: list[Target]
    _scored_targets: list[Target]
    _mode: MaskingMode
    _importance: Importance
    _optimizers: AttachedOptimizers

    def _check_not_permanent(self, why: str) -> None:
        raise NotImplementedError

    def _check_not_spent(self, method: str) -> None:
        raise NotImplementedError

    @property
    def optimizers(self) -> list[Optimizer]:
        """Optimizers whose state is cleared after each pruning step that pruned something;
        may be replaced (e.g. once a framework has made them)."""
        return self._optimizers.reset

    @optimizers.setter
    def optimizers(self, optimizers: Sequence[Optimizer]) -> None:
        self._optimizers.reset = list(optimizers)

    @changes.atomic
    def attach(
        self, *optimizers: Optimizer, mask_gradients: bool = True, accumulate: bool = True
    ) -> OptimizerAttachment:
        """Hook ``optimizers``: keep the pruned weights zero through their steps (lean masks:
        the masking mode's hooks, :mod:`~tensorplay.ao.pruning.masking.optimizer_hooks`, mask
        the gradients before each step and keep the weights and the state's pruned entries
        zero), and, for an importance that reads gradients (movement, Taylor), call
        :meth:`accumulate` before each of their steps, in either masking mode
        (:mod:`~tensorplay.ao.pruning.importance.step_hooks`).

        Args:
            *optimizers: ``torch.optim.Optimizer`` instances, each holding at least one target;
                a wrapper exposing its optimizer as ``.optimizer`` (Accelerate's
                ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``) is unwrapped.
            mask_gradients: ``False`` when the loop calls :meth:`mask_gradients` itself before
                every step (before gradient clipping, as the Lightning callback does).
            accumulate: ``False`` when the loop calls :meth:`accumulate` itself before every
                step (a loop whose ``optimizer.step(closure)`` runs the backward inside the
                step, as Lightning's does).

        Returns:
            A handle whose ``remove()`` takes the hooks off again.

        Raises:
            ValueError: Nothing to hook (``masking="reparametrize"`` with an importance that
                reads no gradients), no optimizer is given, one holds no target, or is
                attached already.
            TypeError: An argument that is not an optimizer, or a non-bool ``mask_gradients``.
            RuntimeError: After :meth:`~tensorplay.ao.pruning.pruner.Pruner.make_permanent`.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Linear(8, 8)
            >>> pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
            >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            >>> handle = pruner.attach(optimizer)
            >>> _ = pruner.step()
            >>> model(torch.randn(4, 8)).sum().backward()
            >>> optimizer.step()
            >>> int((model.weight == 0).sum())
            32
        """
        self._check_not_spent("attach()")
        gradients = bool(accumulate) and self._importance.needs_gradients
        if not gradients:
            self._mode.check_attach()
        self._check_not_permanent("the masks are gone")

        def held(optimizer: Optimizer) -> Any:
            mine = held_targets(optimizer, self._targets)
            return (lambda: self._held_masks(mine)) if mine else None

        def make(
            optimizer: Optimizer, reader: Any, mask_gradients: bool, generation: Any
        ) -> OptimizerHooks:
            if not gradients:  # check_attach let only a mode with hooks through
                return self._mode.optimizer_hooks(optimizer, reader, mask_gradients, generation)
            inner = None
            if self._mode.hooks_optimizers:
                inner = self._mode.optimizer_hooks(optimizer, reader, mask_gradients, generation)
            return GradientHooks(optimizer, inner, reader, lambda: self.accumulate(optimizer))

        names = [target.name for target in self._targets]
        return self._optimizers.attach(optimizers, held, make, mask_gradients, names)

    def held_by(self, optimizer: Optimizer) -> list[str]:
        """The names of the targets whose parameter ``optimizer`` holds (a wrapper exposing its
        optimizer as ``.optimizer`` is unwrapped, as :meth:`attach` does): with several
        optimizers (a GAN's generator and discriminator), attach only those holding some.

        Raises:
            TypeError: ``optimizer`` is not an optimizer or a wrapper of one.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
            >>> pruner = Pruner(model, OneShotSchedule(0.5))
            >>> pruner.held_by(torch.optim.SGD(model[1].parameters(), lr=0.1))
            ['1.weight']
        """
        self._check_not_spent("held_by()")
        return [target.name for target in held_targets(optimizer, self._targets)]

    def accumulate(self, optimizer: Optimizer | None = None) -> int:
        """Add the targets' current gradients to the importance's accumulators: call it once
        per optimizer step, after every backward pass of the step and any gradient unscaling,
        before ``optimizer.step()``. With several optimizers, pass the one about to step: only
        the targets it holds (:meth:`held_by`) are accumulated, each once per step of its own
        optimizer, from the gradients that optimizer uses. The optimizers given to
        :meth:`attach` call it themselves, that way; the Lightning callback calls it in
        ``on_before_optimizer_step``. A no-op for scores that read no gradients (magnitude,
        Wanda).

        Args:
            optimizer: The optimizer about to step (or a wrapper of it); ``None``: every target.

        Returns:
            The number of targets that had a gradient (0 for an optimizer that holds none).

        Raises:
            RuntimeError: After :meth:`~tensorplay.ao.pruning.pruner.Pruner.make_permanent`.
            TypeError: ``optimizer`` is not an optimizer or a wrapper of one.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 2)
            >>> pruner = Pruner(model, OneShotSchedule(0.5, step=1), importance="movement")
            >>> model(torch.randn(3, 4)).sum().backward()
            >>> pruner.accumulate()
            1
            >>> pruner.accumulate(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1))
            0
            >>> pruner.step(0), pruner.step(1)
            (0, 4)
        """
        self._check_not_spent("accumulate()")
        self._check_not_permanent("pruning has ended")
        scored = self._scored_targets
        targets = scored if optimizer is None else held_targets(optimizer, scored)
        return self._importance.accumulate(targets)

    def mask_gradients(self) -> None:
        """Zero the pruned entries of the targets' gradients now (lean masks; autograd does it
        for the reparametrization): in a hand-written loop, before gradient clipping.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 4)
            >>> pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
            >>> _ = pruner.step()
            >>> model(torch.randn(2, 4)).sum().backward()
            >>> pruner.mask_gradients()
            >>> bool((model.weight.grad[~model.weight_mask] == 0).all())
            True
        """
        self._check_not_spent("mask_gradients()")
        self._mode.mask_gradients(self._targets)
        self._optimizers.gradients_masked += 1

    def _held_masks(self, targets: Sequence[Target]) -> tuple[list[Tensor], list[Tensor]]:
        """The parameters and masks of ``targets`` for an attached optimizer's hooks, read
        now."""
        self._check_not_spent("the step of an attached optimizer")
        return self._mode.masked(targets)
