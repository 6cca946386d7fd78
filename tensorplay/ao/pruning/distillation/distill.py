"""Knowledge distillation from a frozen teacher: the term that recovers what pruning costs.

A pruned model recovers more of its quality when it is trained to match the outputs of the
model it was pruned from than when it is trained on the task alone (Hinton et al. 2015; at LLM
scale Minitron and Sheared-LLaMA). :class:`Distillation` runs a frozen teacher on the inputs of
every training forward of the student and gives the distillation term for the last one,

.. math::

    \\mathcal{L}_{KD} = w \\, T^2 \\, \\frac{1}{N} \\sum_{n=1}^{N}
        \\mathrm{KL}\\bigl(\\mathrm{softmax}(z^t_n / T)
        \\,\\|\\, \\mathrm{softmax}(z^s_n / T)\\bigr),

over the ``N`` positions of the logits (every row of a classifier's ``B x C`` logits, all
``B x T`` positions of a sequence model's ``B x T x V``, not shifted), with temperature ``T``
and weight ``w``; the :math:`T^2` keeps the gradient's scale independent of ``T``. A plain loop
adds it to its own loss:

.. code-block:: python

    distill = Distillation(temperature=2.0, weight=1.0).attach(model)  # teacher: model as it is
    for batch in batches:
        task_loss = model(**batch).loss
        loss = task_loss + distill.loss()
        loss.backward()
        ...

The teacher is, by default, a frozen dense copy of the student taken when it is attached
(:func:`~tensorplay.ao.pruning.distillation.dense_copy.dense_copy`), optionally in a lower dtype.

Example:
    >>> import torch
    >>> from torch import nn
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> distill = Distillation(temperature=2.0).attach(model)  # the teacher: model as it is now
    >>> _ = model(torch.randn(5, 4))
    >>> float(distill.loss().detach())  # no gap yet
    0.0
    >>> distill.detach()
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from tensorplay.ao.pruning.distillation.dense_copy import dense_copy
from tensorplay.ao.pruning.distillation.left_out import LeftOutOfCopies
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.selection import is_dtensor

__all__ = ["Distillation", "attached_distillation", "kd_loss"]


def kd_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    *,
    temperature: float = 2.0,
    weight: float = 1.0,
    mask: Tensor | None = None,
) -> Tensor:
    """``weight * T**2 * KL(softmax(teacher / T) || softmax(student / T))``, averaged over the
    positions of the logits (every index but the last, the classes).

    Computed in float32 (or the logits' dtype if wider) whatever the logits' dtype; the gradient
    flows to ``student_logits`` only.

    Args:
        student_logits: ``(..., classes)``.
        teacher_logits: The same shape.
        temperature: ``T`` > 0.
        weight: ``w`` >= 0.
        mask: Optional ``(...)``: 1/``True`` where a position counts, 0/``False`` where it is
            left out (padding); the mean is over the positions that count (0 if none does).

    Returns:
        A scalar tensor.

    Raises:
        ValueError: Shapes that differ, naming both.

    Example:
        >>> import torch
        >>> student, teacher = torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, math.log(3)]])
        >>> p = torch.tensor([0.25, 0.75])  # the teacher's softmax at T = 1
        >>> expected = float((p * (p / 0.5).log()).sum())
        >>> round(float(kd_loss(student, teacher, temperature=1.0)) - expected, 6)
        0.0
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            "Expected the teacher's logits to have the student's shape, but got "
            f"{tuple(teacher_logits.shape)} for the teacher and {tuple(student_logits.shape)} "
            "for the student."
        )
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    student = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)
    per_position = F.kl_div(student, teacher, reduction="none", log_target=True).sum(-1)
    if mask is None:
        mean = per_position.mean()
    else:
        if mask.shape != per_position.shape:
            raise ValueError(
                f"Expected the mask of positions to have the shape {tuple(per_position.shape)} "
                f"of the logits without their last dimension, but got {tuple(mask.shape)}."
            )
        counts = mask.to(device=per_position.device, dtype=dtype)
        mean = (per_position * counts).sum() / counts.sum().clamp_min(1.0)
    return weight * temperature**2 * mean


class Distillation(LeftOutOfCopies):
    """A frozen teacher that sees every training forward of a student, and the KD term.

    :meth:`attach` hooks the student: on every forward it runs in training (``student.training``
    and gradients enabled), the teacher is run on the same positional and keyword arguments
    (under ``torch.no_grad``, in eval mode, on the student's device; floating-point inputs cast
    to the teacher's dtype), and :meth:`loss` gives the KD term (:func:`kd_loss`) for that
    forward, differentiable in the student's logits. Evaluation forwards (eval mode or no
    gradients) run no teacher. The logits are the output itself if it is a tensor, else its
    ``logits`` (a Hugging Face ``ModelOutput``). A call of the student that itself calls the
    student (Lightning under DDP routes ``training_step`` through the module's call, and the
    ``self(x)`` inside it is the forward) counts as the inner forward only.

    Padding: by default every position counts. ``padding_mask="attention_mask"`` leaves out the
    positions where the student's keyword argument ``attention_mask`` is 0 (a padded batch of a
    Hugging Face model). Positions whose label is ``-100`` are not left out: a causal LM's labels
    are shifted against its logits, and the KD term is defined on every position the logits
    have; pass those positions' mask yourself to :func:`kd_loss` if you need that.

    One distillation per student: attaching a second one is refused. A forward in which the
    teacher is refused (logits of another shape: another vocabulary) or fails raises; with
    ``on_error`` the distillation detaches itself first, so that no later forward runs it.

    A training framework's adapter can narrow the forwards that count with ``active``: a forward
    while it returns ``False`` (one outside the framework's training steps) is left out as an
    evaluation forward is.

    Args:
        teacher: The teacher module, or ``None`` (default): a frozen dense copy of the student
            taken at the first :meth:`attach`
            (:func:`~tensorplay.ao.pruning.distillation.dense_copy.dense_copy`: masked weights as
            the student computes with them, no pruning state). A given teacher is put in eval mode,
            frozen (``requires_grad=False``) and moved to the student's device in place.
        temperature: ``T`` > 0, softening both distributions: higher values weigh the
            teacher's small probabilities more.
        weight: ``w`` >= 0, the term's weight against the task loss (0 gives a zero term).
        teacher_dtype: A floating-point dtype for the teacher (``torch.bfloat16`` halves a
            float32 teacher's memory), or ``None``: the copy keeps the student's dtypes and a
            given teacher its own.
        padding_mask: The name of the student's keyword argument that marks real positions (1)
            and padding (0), e.g. ``"attention_mask"``; ``None`` (default): every position.
        on_error: Called (with no argument) when a forward's teacher is refused or fails,
            after the distillation detached itself, before the error propagates: a training
            framework's adapter takes its own hooks of the run off there. ``None`` (default):
            the distillation stays attached (yours to :meth:`detach`).
        active: Called (with no argument) at each forward of the student: while it returns
            ``False`` a forward runs no teacher and is not counted, even in training (an
            adapter passes whether the forward is inside one of its framework's training
            steps). ``None`` (default): every forward in training counts.

    Raises:
        TypeError: A ``teacher`` that is not a module, a ``temperature`` or ``weight`` that is
            not a real number, a ``teacher_dtype`` that is not a floating-point dtype, or a
            ``padding_mask`` that is not a non-empty string, an ``on_error`` or ``active``
            not callable.
        ValueError: ``temperature`` <= 0 or not finite, ``weight`` < 0 or not finite.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> _ = torch.manual_seed(0)
        >>> student = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> distill = Distillation(temperature=2.0, weight=0.5).attach(student)
        >>> with torch.no_grad():
        ...     _ = student[2].weight.mul_(0.5)  # the student drifts from its teacher
        >>> task_loss = student(torch.randn(5, 4)).logsumexp(-1).mean()
        >>> loss = task_loss + distill.loss()
        >>> loss.backward()
        >>> float(distill.last_loss) > 0, distill.teacher[2].weight.grad is None
        (True, True)
        >>> distill.detach()
    """

    def __init__(
        self,
        teacher: nn.Module | None = None,
        *,
        temperature: float = 2.0,
        weight: float = 1.0,
        teacher_dtype: torch.dtype | None = None,
        padding_mask: str | None = None,
        on_error: Callable[[], None] | None = None,
        active: Callable[[], bool] | None = None,
    ) -> None:
        if teacher is not None and not isinstance(teacher, nn.Module):
            raise TypeError(
                f"Expected `teacher` to be a torch.nn.Module or None, but got {teacher!r}."
            )
        _check_real("temperature", temperature, "a positive number", lambda v: v > 0)
        _check_real("weight", weight, "a non-negative number", lambda v: v >= 0)
        if teacher_dtype is not None and not (
            isinstance(teacher_dtype, torch.dtype) and teacher_dtype.is_floating_point
        ):
            raise TypeError(
                "Expected `teacher_dtype` to be a floating-point torch.dtype or None, but got "
                f"{teacher_dtype!r}."
            )
        if padding_mask is not None and not (isinstance(padding_mask, str) and padding_mask):
            raise TypeError(
                "Expected `padding_mask` to be the name of a keyword argument of the student's "
                f"forward (such as 'attention_mask') or None, but got {padding_mask!r}."
            )
        self.teacher = teacher
        self.temperature = float(temperature)
        self.weight = float(weight)
        self.teacher_dtype = teacher_dtype
        if on_error is not None and not callable(on_error):
            raise TypeError(f"Expected `on_error` to be callable or None, but got {on_error!r}.")
        if active is not None and not callable(active):
            raise TypeError(f"Expected `active` to be callable or None, but got {active!r}.")
        self.padding_mask = padding_mask
        self.on_error = on_error
        self.active = active
        #: The student hooked by :meth:`attach`, ``None`` when detached.
        self.student: nn.Module | None = None
        #: The value of the last :meth:`loss` (detached), for logging; ``None`` before one.
        self.last_loss: Tensor | None = None
        self._handle: RemovableHandle | None = None
        self._pre_handle: RemovableHandle | None = None
        self._entered: list[int] = []  # the forwards seen when each call of the student began
        self._pending: tuple[Tensor, Tensor, Tensor | None] | None = None
        self._forwards = 0
        self._teacher_device: torch.device | None = None
        self._input_dtype: torch.dtype | None = None  # floating inputs cast to the teacher's

    @property
    def attached(self) -> bool:
        """Whether a student is hooked.

        Example:
            >>> from torch import nn
            >>> Distillation().attached
            False
        """
        return self._handle is not None

    @property
    def consumed(self) -> bool:
        """Whether :meth:`loss` was taken for the student's last training forward (``False``
        before the first).

        Example:
            >>> import torch
            >>> from torch import nn
            >>> student = nn.Linear(2, 3)
            >>> distill = Distillation().attach(student)
            >>> _ = student(torch.ones(1, 2))
            >>> distill.consumed, distill.loss().shape, distill.consumed
            (False, torch.Size([]), True)
        """
        return self._forwards > 0 and self._pending is None

    @property
    def forwards(self) -> int:
        """The student's training forwards seen since :meth:`attach` (a framework adapter
        compares it between two :meth:`loss` calls to tell a forward whose term was never
        taken).

        Example:
            >>> import torch
            >>> from torch import nn
            >>> student = nn.Linear(2, 3)
            >>> distill = Distillation().attach(student)
            >>> _ = student(torch.ones(1, 2)), student(torch.ones(1, 2))
            >>> with torch.no_grad():
            ...     _ = student(torch.ones(1, 2))  # not a training forward
            >>> distill.forwards
            2
        """
        return self._forwards

    @changes.atomic
    def attach(self, student: nn.Module) -> Distillation:
        """Hook ``student`` so that the teacher sees its training forwards; take the teacher
        (a frozen dense copy of ``student`` as it is now) if none was given.

        Everything is checked before anything changes.

        Args:
            student: The model being trained (its ``forward`` returns logits or an output with
                ``logits``).

        Returns:
            This :class:`Distillation`.

        Raises:
            TypeError: ``student`` is not a module.
            RuntimeError: Already attached, or another distillation is attached to
                ``student`` (naming it).
            ValueError: The teacher is the student, or shares a parameter's memory with it.

        Example:
            >>> from torch import nn
            >>> student = nn.Linear(2, 2)
            >>> distill = Distillation().attach(student)
            >>> hooks = lambda: (len(student._forward_pre_hooks), len(student._forward_hooks))
            >>> distill.teacher is not student, hooks()
            (True, (1, 1))
            >>> distill.detach()
            >>> hooks()
            (0, 0)
        """
        if not isinstance(student, nn.Module):
            raise TypeError(f"Expected `student` to be a torch.nn.Module, but got {student!r}.")
        if self._handle is not None:
            raise RuntimeError(
                f"Expected a Distillation attached once, but it is already attached to a "
                f"{type(self.student).__name__}: call detach() first."
            )
        if attached_distillation(student) is not None:
            raise RuntimeError(
                f"Expected one Distillation per student, but the {type(student).__name__} "
                "given has one attached already: two would each add a KD term to its loss. "
                "Detach the other first (`distillation.detach()`), or distil with one of them "
                "(a pruning callback with `distill_weight` > 0 attaches its own: set "
                "distill_weight=0 to keep yours)."
            )
        if self.teacher is not None:
            _check_separate(self.teacher, student)
        device = _device_of(student)
        teacher = self.teacher
        if teacher is None:
            teacher = dense_copy(student, self.teacher_dtype)
        else:
            teacher.requires_grad_(False)
            if self.teacher_dtype is not None:
                teacher.to(dtype=self.teacher_dtype)
        if device is not None:
            teacher.to(device)
        self.teacher = teacher.eval()
        self._teacher_device = device
        self._input_dtype = _float_dtype(teacher)
        self.student = student
        self._pending = None
        self._forwards = 0
        self._entered = []
        self._pre_handle = changes.hook(student.register_forward_pre_hook, self._before_forward)
        self._handle = changes.hook(
            student.register_forward_hook, self._after_forward, with_kwargs=True
        )
        return self

    def detach(self) -> None:
        """Remove every hook from the student and drop the last forward's logits; the teacher is
        kept (a later :meth:`attach` reuses it).

        Example:
            >>> from torch import nn
            >>> student = nn.Linear(2, 2)
            >>> distill = Distillation().attach(student)
            >>> distill.detach()
            >>> distill.attached, len(student._forward_pre_hooks), len(student._forward_hooks)
            (False, 0, 0)
        """
        for handle in (self._handle, self._pre_handle):
            if handle is not None:
                handle.remove()
        self._handle = self._pre_handle = None
        self._entered = []
        self.student = None
        self._pending = None

    def loss(self) -> Tensor:
        """The KD term (:func:`kd_loss`) of the student's last training forward, a scalar
        differentiable in the student's logits; taken once per forward.

        Returns:
            ``weight * T**2 * KL(softmax(teacher / T) || softmax(student / T))``, averaged over
            the positions (see the class).

        Raises:
            RuntimeError: Not attached, no training forward since :meth:`attach`, or
                :meth:`loss` already taken for the last one (a term added twice would count
                that forward twice).

        Example:
            >>> import torch
            >>> from torch import nn
            >>> student = nn.Linear(2, 3)
            >>> distill = Distillation(weight=2.0).attach(student)
            >>> _ = student(torch.ones(4, 2))
            >>> distill.loss()
            tensor(0., grad_fn=<MulBackward0>)
        """
        if self._handle is None:
            raise RuntimeError("Expected loss() after attach(student), but it is not attached.")
        if self._pending is None:
            if self._forwards == 0:
                raise RuntimeError(
                    "Expected a training forward of the student (in train mode, with gradients "
                    "enabled) before loss(), but none was seen since attach()."
                )
            raise RuntimeError(
                "Expected one loss() per training forward, but loss() was already taken for the "
                "student's last forward."
            )
        student_logits, teacher_logits, mask = self._pending
        self._pending = None  # the logits and the graph behind them are not kept past here
        loss = kd_loss(
            student_logits,
            teacher_logits,
            temperature=self.temperature,
            weight=self.weight,
            mask=mask,
        )
        self.last_loss = loss.detach()
        return loss

    def _before_forward(self, student: nn.Module, args: tuple[Any, ...]) -> None:
        if self.active is None or self.active():
            self._entered.append(self._forwards)

    def _after_forward(
        self, student: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        try:
            self._take_forward(student, args, kwargs, output)
        except Exception:
            if self.on_error is not None:
                self.detach()  # a teacher refused (or failing) is never run again
                self.on_error()
            raise

    def _take_forward(
        self, student: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if self.active is not None and not self.active():
            return  # outside the adapter's training steps (nothing was entered either)
        entered = self._entered.pop() if self._entered else self._forwards
        if not (student.training and torch.is_grad_enabled()):
            return
        if self._forwards > entered:
            # A call of the student that wrapped a training forward of it: not a forward of
            # its own (Lightning under DDP routes `training_step` through the module's call,
            # and the user's `self(x)` inside it is the forward).
            return
        logits = _logits(output, "student")
        mask = self._positions(kwargs, logits)
        teacher_logits = self._teacher_logits(student, args, kwargs)
        if teacher_logits.shape != logits.shape:
            raise ValueError(
                "Expected the teacher's logits to have the student's shape, but got "
                f"{tuple(teacher_logits.shape)} for the teacher and {tuple(logits.shape)} for "
                "the student."
            )
        self._pending = (logits, teacher_logits, mask)
        self._forwards += 1

    def _teacher_logits(
        self, student: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Tensor:
        teacher = self.teacher
        assert teacher is not None  # for mypy: set by attach
        device = _device_of(student)
        if device is not None and device != self._teacher_device:  # the student was moved
            teacher.to(device)
            self._teacher_device = device
        if teacher.training:
            teacher.eval()
        with torch.no_grad():
            output = teacher(*_cast(args, self._input_dtype), **_cast(kwargs, self._input_dtype))
        _reshard_root(teacher)
        return _logits(output, "teacher")

    def _positions(self, kwargs: dict[str, Any], logits: Tensor) -> Tensor | None:
        if self.padding_mask is None:
            return None
        mask = kwargs.get(self.padding_mask)
        if not isinstance(mask, Tensor):
            raise ValueError(
                f"Expected the student's forward to be called with the keyword argument "
                f"{self.padding_mask!r} (padding_mask={self.padding_mask!r}), but got "
                f"{type(mask).__name__} for it."
            )
        if mask.shape != logits.shape[:-1]:
            raise ValueError(
                f"Expected {self.padding_mask!r} to have the shape {tuple(logits.shape[:-1])} of "
                f"the logits without their last dimension, but got {tuple(mask.shape)}."
            )
        return mask


def _check_real(name: str, value: object, expected: str, ok: Callable[[float], bool]) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected `{name}` to be {expected}, but got {value!r}.")
    if not (math.isfinite(value) and ok(float(value))):
        raise ValueError(f"Expected `{name}` to be {expected}, but got {value!r}.")


def _check_separate(teacher: nn.Module, student: nn.Module) -> None:
    if teacher is student:
        raise ValueError(
            "Expected `teacher` to be a module other than the student, but got the student "
            "itself: pass teacher=None for a frozen copy of it."
        )
    memory = {
        _address(param): name
        for name, param in student.named_parameters()
        if param.device.type != "meta" and param.numel()
    }
    for name, param in teacher.named_parameters():
        if param.device.type != "meta" and param.numel():
            shared = memory.get(_address(param))
            if shared is not None:
                raise ValueError(
                    f"Expected `teacher` to share no memory with the student, but its {name} "
                    f"is the student's {shared}: training would change the teacher. Pass a "
                    "copy, or teacher=None."
                )


def _address(param: Tensor) -> int:
    """Where ``param``'s memory starts (a DTensor's: its local shard's)."""
    local = param.to_local() if is_dtensor(param) else param  # type: ignore[attr-defined]
    return int(local.untyped_storage().data_ptr())


def _device_of(module: nn.Module) -> torch.device | None:
    param = next(module.parameters(), None)
    return None if param is None else param.device


def _float_dtype(module: nn.Module) -> torch.dtype | None:
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), None)


def _cast(value: Any, dtype: torch.dtype | None) -> Any:
    """``value`` with every floating-point tensor inside it (tuples, lists, dicts) in ``dtype``."""
    if dtype is None:
        return value
    if isinstance(value, Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_cast(item, dtype) for item in value)
    if isinstance(value, list):
        return [_cast(item, dtype) for item in value]
    if isinstance(value, Mapping):
        return {key: _cast(item, dtype) for key, item in value.items()}
    return value


def _logits(output: Any, whose: str) -> Tensor:
    logits = output if isinstance(output, Tensor) else getattr(output, "logits", None)
    if not isinstance(logits, Tensor):
        raise TypeError(
            f"Expected the {whose}'s output to be a tensor of logits or to have `logits` (a "
            f"Hugging Face output), but got {type(output).__name__}."
        )
    return logits


def attached_distillation(student: nn.Module) -> Distillation | None:
    """The :class:`Distillation` attached to ``student``, or ``None``.

    Example:
        >>> from torch import nn
        >>> student = nn.Linear(2, 2)
        >>> distill = Distillation().attach(student)
        >>> attached_distillation(student) is distill
        True
        >>> Distillation().attach(student)
        Traceback (most recent call last):
        ...
        RuntimeError: Expected one Distillation per student, but the Linear given has one ...
        >>> distill.detach()
        >>> attached_distillation(student) is None
        True
    """
    for hook in student._forward_hooks.values():
        owner = getattr(hook, "__self__", None)
        if isinstance(owner, Distillation) and owner.student is student:
            return owner
    return None


def _reshard_root(teacher: nn.Module) -> None:
    """Free what a sharded teacher's root gathered for its forward: FSDP2 reshards a root after
    its backward only, and a teacher runs none (its other modules reshard after their
    forwards)."""
    if "torch.distributed.fsdp" not in sys.modules:
        return
    from torch.distributed.fsdp import FSDPModule

    if isinstance(teacher, FSDPModule):
        teacher.reshard()
