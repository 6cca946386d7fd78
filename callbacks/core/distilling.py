"""Distillation from the dense model inside a training framework, once for every adapter.

An adapter given ``distill_weight > 0`` trains the model it prunes (the student) against a
frozen teacher (:class:`~tensorplay.ao.pruning.distillation.Distillation`): by default a
dense copy of the model taken just before the first pruning step (before it there is nothing to
recover), or the ``teacher`` given, from the first training step. :class:`Distilling` holds that
teacher across the run: it takes it when the first pruning step is due, gives the KD term of
each training forward scaled as the framework scales the task loss (the adapter adds it to the
loss that is back-propagated), checks that every term it gave reached a backward (a custom loss
that drops it is an error, never a silent no-op), averages the values for the loggers, and
saves and restores the teacher taken, so that a resumed run distils from the same one.

A teacher copied from a model sharded with FSDP2 (sharded like it, one shard per rank) is not
in the callback's state: a framework's checkpoint keeps that on one rank only, so its weights
would miss the other ranks' shards. Its state is a marker instead; the adapter saves the teacher
where each rank writes its shards (Lightning's distributed checkpoint) and gives a resumed run a
function that loads it back (:meth:`Distilling.load_teacher_with`). A run resumed past the first
pruning step from a checkpoint with the marker and no such function is refused, saying what to
do (pass the dense model, sharded like the student, as ``teacher``, or resume with
``distill_weight=0``).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning import OneShotSchedule, Pruner
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> pruner = Pruner(model, OneShotSchedule(0.5))
    >>> distilling = Distilling("Adapter")
    >>> distilling.before_step(pruner, 0, weight=1.0, temperature=2.0)  # the teacher: dense
    >>> _ = pruner.step(0)
    >>> task = model(torch.randn(2, 4)).logsumexp(-1).mean()
    >>> (task + distilling.term(scale=1.0)).backward()
    >>> distilling.check_reached()  # every term reached the backward
    >>> distilling.mean_value() > 0
    True
    >>> distilling.detach()
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.distillation.dense_copy import dense_copy
from tensorplay.ao.pruning.distillation.distill import Distillation
from tensorplay.ao.pruning.distillation.left_out import LeftOutOfCopies
from tensorplay.ao.pruning.pruner.gradual_search import RunPruner
from tensorplay.ao.pruning.selection import is_dtensor

__all__ = ["SHARDED_TEACHER", "Distilling", "check_distill_arguments", "first_pruning_due"]

#: The key of :meth:`Distilling.teacher_state` for a teacher sharded with FSDP2 (saved apart).
SHARDED_TEACHER = "__sharded_teacher_not_saved__"


def check_distill_arguments(weight: object, temperature: object, teacher: object) -> None:
    """Check the adapters' ``distill_weight``, ``distill_temperature`` and ``teacher``, naming
    each as the user wrote it.

    Raises:
        TypeError: A weight or temperature that is not a real number, a teacher that is not a
            module.
        ValueError: ``distill_weight`` < 0, ``distill_temperature`` <= 0, or either not finite.

    Example:
        >>> check_distill_arguments(1.0, 2.0, None)
        >>> check_distill_arguments(-1.0, 2.0, None)
        Traceback (most recent call last):
        ...
        ValueError: Expected `distill_weight` to be a non-negative number (0: off), but got -1.0.
    """
    _check_real("distill_weight", weight, "a non-negative number (0: off)", lambda v: v >= 0)
    _check_real("distill_temperature", temperature, "a positive number", lambda v: v > 0)
    if teacher is not None and not isinstance(teacher, nn.Module):
        raise TypeError(f"Expected `teacher` to be a torch.nn.Module or None, but got {teacher!r}.")


def _check_real(name: str, value: object, expected: str, ok: Callable[[float], bool]) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected `{name}` to be {expected}, but got {value!r}.")
    if not (math.isfinite(float(value)) and ok(float(value))):
        raise ValueError(f"Expected `{name}` to be {expected}, but got {value!r}.")


def first_pruning_due(pruner: RunPruner, step: int) -> bool:
    """Whether ``pruner.step(step)`` takes the pruner's first pruning step that removes units
    (none removed yet, a pruning step of its schedule between the last step taken and ``step``,
    and a target above 0 there).

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning import OneShotSchedule, Pruner
        >>> pruner = Pruner(nn.Linear(2, 2), OneShotSchedule(0.5, step=3))
        >>> [first_pruning_due(pruner, step) for step in (0, 2, 4)]
        [False, False, True]
    """
    if pruner.history or step <= pruner.last_step or pruner.schedule(step) <= 0:
        return False  # units pruned already, a step taken, or a target of 0 (nothing removed)
    return pruner.schedule.latest_pruning_step(pruner.last_step, step) is not None


class Distilling(LeftOutOfCopies):
    """The teacher of one pruning run and the KD terms it gives (see the module).

    Args:
        name: The adapter's name, heading its errors.
        on_error: Called when the teacher, refused or failing in a forward, detached itself
            (the adapter takes the rest of its run's hooks off).
    """

    def __init__(self, name: str, on_error: Callable[[], None] | None = None) -> None:
        self.name = name
        self.on_error = on_error
        #: Whether a forward of the student now is inside one of the framework's training
        #: steps (set by an adapter that can tell); ``None``: every training forward counts.
        #: Read at each forward (see :meth:`observing`).
        self.active: Callable[[], bool] | None = None
        #: The attached :class:`Distillation`, ``None`` before the teacher exists.
        self.distillation: Distillation | None = None
        self._copied = False  # whether the teacher is the dense copy taken here (saved)
        self._seen = 0  # the distillation's forwards when the last term was given
        self._unreached = 0  # terms given whose backward has not reached them
        self._sum: Tensor | None = None
        self._count = 0
        self._loaded: Mapping[str, Tensor] | None = None
        self._unsaved = False  # the checkpoint loaded had a sharded teacher, not found
        self._fill: Callable[[nn.Module], None] | None = None  # loads a sharded teacher
        self._taken: nn.Module | None = None  # the dense copy taken before a searched run

    @property
    def attached(self) -> bool:
        """Whether a teacher is attached to the student."""
        return self.distillation is not None and self.distillation.attached

    def observing(self) -> bool:
        """Whether the teacher sees a training forward of the student now: always, unless the
        adapter's :attr:`active` says the forward is outside its training steps."""
        return self.active is None or self.active()

    def start(self, student: nn.Module, *, teacher: nn.Module | None, weight: float,
              temperature: float) -> None:  # fmt: skip
        """Training starts: attach a given ``teacher`` (distilling from the first step), or the
        teacher loaded from a checkpoint; a default teacher waits for :meth:`before_step`."""
        if weight <= 0 or self.attached:
            return
        taken, self._taken = self._taken, None
        if self._loaded is not None or self._fill is not None:
            copy = dense_copy(student)
            if self._fill is not None:
                self._fill(copy)
            else:
                copy.load_state_dict(self._loaded)  # type: ignore[arg-type]  # not None here
            self._loaded = self._fill = None
            self._attach(student, copy, weight, temperature, copied=True)
        elif teacher is not None:
            self._attach(student, teacher, weight, temperature, copied=False)
        elif taken is not None:
            self._attach(student, taken, weight, temperature, copied=True)

    def copy_teacher(self, student: nn.Module) -> None:
        """Take the teacher now, a frozen dense copy of ``student`` as it is, to attach at
        :meth:`start`: a searched run removes layers when its pruner is built, before
        training starts (a teacher loaded from a checkpoint still comes first)."""
        self._taken = dense_copy(student)

    def before_step(
        self, pruner: RunPruner, step: int, *, weight: float, temperature: float
    ) -> None:
        """Before ``pruner.step(step)``: if it takes the first pruning step, take the teacher
        (a frozen dense copy of the model as it is now) and attach it.

        Raises:
            RuntimeError: Resumed past the first pruning step with no teacher saved.
        """
        if weight <= 0 or self.attached:
            return
        due = first_pruning_due(pruner, step)
        if self._loaded is not None or self._fill is not None:
            self.start(pruner.model, teacher=None, weight=weight, temperature=temperature)
            return
        if pruner.history and step > pruner.last_step and self._unsaved:
            raise RuntimeError(
                f"{self.name}: expected the teacher (the model before the first pruning step, "
                f"step {pruner.history[0][0]}) in the checkpoint this run resumed from, but "
                "the model is sharded with FSDP2 and its sharded teacher is kept only in a "
                "distributed checkpoint (ModelParallelStrategy(save_distributed_checkpoint=True)); "
                "this one holds none. Pass the dense model, sharded like the student, as "
                "`teacher`, or resume with distill_weight=0."
            )
        if pruner.history and step > pruner.last_step:
            raise RuntimeError(
                f"{self.name}: expected the teacher (the model before the first pruning step, "
                f"step {pruner.history[0][0]}) in "
                "the checkpoint this run resumed from, but it holds none: it was saved with "
                "distill_weight=0. Pass the dense model as `teacher`, or resume with "
                "distill_weight=0."
            )
        if due:
            self._attach(pruner.model, None, weight, temperature, copied=True)

    def _attach(self, student: nn.Module, teacher: nn.Module | None, weight: float,
                temperature: float, *, copied: bool) -> None:  # fmt: skip
        distillation = Distillation(
            teacher,
            temperature=temperature,
            weight=weight,
            on_error=self.on_error,
            active=self.observing,
        )
        self.distillation = distillation.attach(student)
        self._copied = copied
        self._seen = self.distillation.forwards

    def term(self, scale: float | Callable[[Tensor], Tensor] = 1.0) -> Tensor | None:
        """The KD term of the student's last training forward scaled by ``scale`` (a factor,
        or a function of the term: what the framework does to the task loss before its
        backward), ``None`` while no teacher is attached. The adapter adds it to the loss that
        is back-propagated.

        Raises:
            RuntimeError: No training forward of the student since the last term (the loss was
                computed without calling the model the callback prunes), or more than one (the
                terms of the others would be lost).
        """
        distillation = self.distillation
        if distillation is None or not distillation.attached:
            return None
        forwards, self._seen = distillation.forwards - self._seen, distillation.forwards
        if forwards != 1:
            raise RuntimeError(
                f"{self.name}: expected one training forward of the model being pruned "
                f"({type(distillation.student).__name__}) before each backward, to add its "
                f"distillation term to the loss, but saw {forwards}. Compute the loss from one "
                "call of that model (in Lightning, `self(...)` in `training_step`), or set "
                "distill_weight=0 and add `Distillation.loss()` to your loss yourself."
            )
        term = distillation.loss()
        value = term.detach()
        self._sum = value if self._sum is None else self._sum + value
        self._count += 1
        scaled = scale(term) if callable(scale) else term * scale
        if scaled.requires_grad:
            self._unreached += 1
            scaled.register_hook(self._reached)  # type: ignore[no-untyped-call]
        return scaled

    def _reached(self, grad: Tensor) -> None:
        self._unreached -= 1

    def check_reached(self) -> None:
        """Before an optimizer step: every term given reached a backward.

        Raises:
            RuntimeError: A term that no backward reached (a loss computed without it).
        """
        if self._unreached > 0:
            unreached, self._unreached = self._unreached, 0
            raise RuntimeError(
                f"{self.name}: expected the distillation term added to the model's loss to "
                f"reach the backward, but {unreached} of them did not: the loss that was "
                "back-propagated was computed without the model output's `loss` (a custom "
                "`compute_loss` or loss function). Return `outputs.loss` (plus your own terms), "
                "or set distill_weight=0 and add `Distillation.loss()` to your loss yourself."
            )

    def mean_value(self) -> float | None:
        """The mean KD term (weight included, not scaled) since the last call; ``None`` if none."""
        if self._sum is None:
            return None
        mean = float(self._sum) / self._count
        self._sum, self._count = None, 0
        return mean

    def last_value(self) -> Tensor | None:
        """The last KD term given (weight included, not scaled, detached); ``None`` if none."""
        return None if self.distillation is None else self.distillation.last_loss

    def teacher_state(self) -> dict[str, Tensor] | None:
        """The state_dict of the teacher taken here (a given teacher is the user's: ``None``),
        to save with a checkpoint; for a teacher sharded with FSDP2, only the marker
        :data:`SHARDED_TEACHER` (see the module)."""
        if self.distillation is None or not self._copied or self.distillation.teacher is None:
            return None
        if any(is_dtensor(param) for param in self.distillation.teacher.parameters()):
            return {SHARDED_TEACHER: torch.ones((), dtype=torch.bool)}
        return {
            key: value.detach() for key, value in self.distillation.teacher.state_dict().items()
        }

    def load_teacher_state(self, state: Mapping[str, Any]) -> None:
        """The teacher saved by :meth:`teacher_state`, attached at the next :meth:`start` or
        :meth:`before_step` (a dense copy of the student given these weights)."""
        self.detach()
        self.distillation = None
        self._unsaved = SHARDED_TEACHER in state and self._fill is None
        self._loaded = None if SHARDED_TEACHER in state else dict(state)

    def load_teacher_with(self, fill: Callable[[nn.Module], None]) -> None:
        """A sharded teacher saved by the adapter: ``fill`` loads its weights into a dense copy
        of the student (sharded like it), attached at the next :meth:`start` or
        :meth:`before_step`."""
        self.detach()
        self.distillation = None
        self._fill, self._unsaved, self._loaded = fill, False, None

    def sharded_teacher(self) -> nn.Module | None:
        """The teacher taken here if it is sharded with FSDP2 (the adapter saves it), else
        ``None``."""
        state = self.teacher_state()
        if state is None or SHARDED_TEACHER not in state:
            return None
        assert self.distillation is not None  # for mypy: a state means a teacher
        return self.distillation.teacher

    def detach(self) -> None:
        """Remove the teacher's hooks from the student (training ended)."""
        if self.distillation is not None:
            self.distillation.detach()
        self._unreached = 0
