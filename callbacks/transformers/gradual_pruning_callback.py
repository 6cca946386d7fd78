"""Gradual pruning while a Hugging Face ``Trainer`` trains: an adapter over the pruner.

Every pruning decision belongs to :class:`~tensorplay.ao.pruning.pruner.Pruner`; the callback
builds it when the ``Trainer`` is made (``on_init_end``: the masks must exist before
``train(resume_from_checkpoint=...)`` loads a checkpoint's weights, and before DDP wraps the
model; under FSDP2 when training begins, on the sharded model), gives it rank zero's seed and
the trainer's optimizer, steps it with ``state.global_step`` (``k`` right after the ``k``-th
optimizer step), adds its metrics to the Trainer's logs, and keeps its state in
``trainer_state.json``. Importing this module needs ``transformers`` (and, to train,
``accelerate``), not Lightning.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle
from transformers import (
    DefaultFlowCallback,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging
from typing_extensions import override

from tensorplay.ao.pruning.distillation.left_out import LeftOutOfCopies
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.imports import import_path
from tensorplay.ao.pruning.pruner.config import (
    AccumulatorDtype,
    Masking,
    PrunerConfig,
    Rewind,
    Scope,
    Structure,
)
from tensorplay.ao.pruning.pruner.gradual_search import RunPruner
from tensorplay.ao.pruning.pruner.schedules import Schedule
from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget
from tensorplay.ao.pruning.targets.parameters import KeepDense

from ..core.distilling import Distilling
from ..core.lifecycle import (
    PruningSession,
    SessionOptions,
    on_rank_zero,
    plain_arguments,
    split_arguments,
)
from ..core.metrics import metric_prefix, with_prefix
from ..core.state_keys import state_key_fields
from .json_state import find_entry, find_saved, saved_entry
from .sharded_setups import (
    check_fresh_under_fsdp2,
    refuse_loads_before_build,
    trainer_shards_with_fsdp2,
)

__all__ = ["GradualPruningCallback"]

# A child of the library's logger: the Trainer's `log_level` (and TRANSFORMERS_VERBOSITY) set its
# level, and the library's handler prints it, as for the Trainer's own messages.
logger = logging.get_logger(f"transformers.{__name__}")


class GradualPruningCallback(SessionOptions, TrainerCallback, ExportableState):
    """Prune a model on a sparsity schedule while a Hugging Face ``Trainer`` trains it.

    The arguments are those of the Lightning callback
    :class:`~tensorplay.callbacks.GradualPruning`, one for one: the pruning arguments are the
    fields of :class:`~tensorplay.ao.pruning.pruner.config.PrunerConfig` (documented there), checked
    by it as the pruner's are, so a bad value fails here, when the callback is made, with the
    pruner's message. A bad selection (a parameter the model lacks) fails when the ``Trainer``
    is made. The schedule counts optimizer steps (``state.global_step``: gradient accumulation
    is folded in). See :doc:`/huggingface_trainer` for what differs from Lightning.

    At the Trainer's logging steps (``logging_steps``) the metrics ``pruning/sparsity``,
    ``pruning/target_sparsity``, ``pruning/pruned`` (cumulative units) and, with
    ``log_per_tensor``, ``pruning/sparsity/<module>.<name>`` join the logs: in
    ``trainer.state.log_history`` always, and in the reporting integrations (TensorBoard, W&B,
    ...) that run after this callback, which :meth:`put_first` arranges. With several of these
    callbacks in one ``Trainer``, the ``i``-th of them logs ``pruning/<i>/sparsity`` and so on.

    Under FSDP2 (``TrainingArguments(fsdp=True)``, version 2, on GPUs) the pruner is built when
    training begins, on the model the Trainer has sharded (``masking="inplace"``: masks sharded
    like the weights); a run under FSDP2 cannot resume yet, and its saves keep the masks
    (``*_mask`` entries) rather than the permanent form.

    With ``masking="inplace"`` the trainer's optimizer (Accelerate's wrapper, unwrapped) is
    attached to the pruner; the pruned gradients are zero as soon as autograd accumulates them,
    so the norm the Trainer clips by and logs as ``grad_norm`` is the kept weights'.

    Every save of the model is the permanent form
    (:mod:`~tensorplay.ao.pruning.saving.permanent_saves`): ``trainer.save_model``,
    ``model.save_pretrained`` and the Trainer's checkpoints write a model that plain
    ``from_pretrained`` loads, without ``make_permanent``. Resuming with
    ``trainer.train(resume_from_checkpoint=...)`` restores the masks exactly (the loaded zeros,
    and the kept zeros listed in ``trainer_state.json``) and the pruner's state, into a freshly
    built model too, with ``restore_callback_states_from_checkpoint`` either way. A checkpoint
    loaded at the end (``load_best_model_at_end``) with fewer pruned units than the run
    reached is restored with its pruner state and a
    :class:`~tensorplay.callbacks.PruningRollbackWarning`.

    Args:
        schedule: A field of ``PrunerConfig``, as are ``method`` (by name or import path),
            ``parameters``, ``module_types``, ``names``, ``include``, ``exclude``,
            ``keep_dense``, ``scope``, ``min_density``, ``rewind`` (``"init"`` restores the
            weights training starts from), ``rewind_step``, ``masking``, ``importance``
            (``"movement"`` and ``"taylor"`` accumulate in :meth:`on_pre_optimizer_step`, once
            per optimizer step, from the clipped gradients the optimizer uses),
            ``accumulator_dtype``, ``structure`` (``"channel"``, ``"head"``, ``"layer"`` or
            ``"expert"`` of a Hugging Face model: units found from its modules, masked in every
            slice), ``multiple_of``, ``target_params``, ``target_active_params``,
            ``target_memory`` and ``target_latency`` (budgets in place of the
            schedule's final sparsity: :doc:`/structured`).
        seed: The pruner's; by default rank zero's ``torch.initial_seed()`` (the Trainer's
            ``TrainingArguments.seed``), the same on every rank.
        log_per_tensor: Also log ``pruning/sparsity/<module>.<name>``.
        make_permanent: At the end of training, drop the masks and the hooks, keeping the zeros
            (every save is the permanent form anyway; this ends pruning in the model itself).
        reset_optimizer_state: Give the pruner the trainer's optimizer, whose state it clears
            after each pruning event.
        verbose: Log each pruning event and the final sparsity table (``logging.INFO``, on the
            main process: ``TrainingArguments(log_level="info")`` shows them).
        shrink_at_end: At the end of training (after the Trainer's last checkpoint, and after
            it loaded the best one with ``load_best_model_at_end``: that one is shrunk),
            remove the pruned units physically (:func:`~tensorplay.ao.pruning.shrink`), update
            the model's config and report the parameters and widths before and after
            (:attr:`shrink_report`); ``trainer.save_model()`` then writes the smaller model.
            The trainer's optimizer holds the old tensors: stepping it raises. See
            :doc:`/structured`. Under FSDP2 the sharded model stays as it is: it is gathered
            once on the main process, to the CPU, and the shrunk copy (:attr:`shrunk_model`
            there) is written to ``shrunk_dir`` (:doc:`/large_models`).
        shrunk_dir: Where ``shrink_at_end`` also writes the shrunk model (its
            ``save_pretrained`` folder), on the main process; ``None`` (default): nowhere
            (``trainer.save_model()`` writes it), except under FSDP2: ``<output_dir>/shrunk``.
        distill_weight: Distil from a teacher (:doc:`/distillation`): the weight of the KD term
            added to the ``loss`` of the model's outputs in the Trainer's training steps (what
            the Trainer back-propagates; a forward outside them, or after ``train`` returned or
            raised, gets the model's own loss), counted as the Trainer counts that loss under
            gradient accumulation; 0 (default) is off. Logged as ``pruning/distill_loss``.
        distill_temperature: The KD term's temperature (> 0).
        teacher: The teacher, used from the first step; ``None`` (default): a frozen dense copy
            of the model taken just before the first pruning step, written into each
            checkpoint's folder (``tensorplay_teacher.pt``) and read back on resume.
        example_inputs: With ``structure="channel"`` on a plain PyTorch model (no Hugging Face
            family), the inputs of its forward (a tensor or a tuple of positional inputs) that
            tracing it takes to find every layer's channels. ``None`` (default): the inputs of
            its first training forward (the keyword arguments the Trainer passes, put in the
            forward's order): the pruner is then built before the first optimizer step, and
            its step 0 taken then. Resuming such a run needs ``example_inputs``.
        search: Search the mix of depth and widths under the budgets when the ``Trainer``
            is made, and prune to it along the schedule; as
            :class:`~tensorplay.callbacks.GradualPruning`'s, and so are ``search_batches``,
            ``search_forward``, ``search_grid``, ``search_score`` and ``search_allocation``
            (:doc:`/width`). With ``"hidden"`` among the kinds, ``save_strategy="no"``.

    Raises:
        TypeError: As :class:`~tensorplay.ao.pruning.pruner.config.PrunerConfig`; a distillation
            argument of the wrong type; ``example_inputs`` neither a tensor nor a tuple.
        ValueError: As it; ``distill_weight`` < 0 or ``distill_temperature`` <= 0; when the
            ``Trainer`` is made, as the ``Pruner`` (an unknown or empty selection), with
            DeepSpeed, FSDP1, or FSDP2 that Accelerate does not run (on CPU), and under FSDP2
            with ``masking`` other than ``"inplace"`` or with ``rewind`` (see
            :doc:`/huggingface_trainer`); when a run resumes under FSDP2; or with
            ``restore_callback_states_from_checkpoint=True`` and a schedule that has no
            plain-data form (a lambda), a ``teacher`` module or ``example_inputs``;
            ``example_inputs`` with ``structure="element"``; when resuming a run whose pruner
            waits for the first training forward.
        RuntimeError: The pruner waits for the first training forward, and the first optimizer
            step came without one (the loss computed without calling the model).

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import CubicSchedule
        >>> callback = GradualPruningCallback(CubicSchedule(final_sparsity=0.8, end_step=1000))
        >>> callback.config.method, callback.config.scope
        ('l1_unstructured', 'global')
        >>> # Trainer(model, args, train_dataset=data, callbacks=[callback]).train()
        >>> distilled = GradualPruningCallback(CubicSchedule(0.8, end_step=10), distill_weight=1.0)
        >>> distilled.distill_weight, distilled.distill_temperature, distilled.teacher
        (1.0, 2.0, None)
        >>> GradualPruningCallback(CubicSchedule(0.8, end_step=1000), distill_weight=-1)
        Traceback (most recent call last):
        ...
        ValueError: Expected `distill_weight` to be a non-negative number (0: off), but got -1.
    """

    def __init__(
        self,
        schedule: Schedule,
        method: str = "l1_unstructured",
        parameters: list[str] | None = None,
        module_types: list[str] | None = None,
        names: list[str] | None = None,
        include: list[str] | None = None,
        exclude: list[str] | None = None,
        keep_dense: Sequence[KeepDense] = (),
        scope: Scope = "global",
        min_density: float = 0.0,
        log_per_tensor: bool = False,
        make_permanent: bool = False,
        rewind: Rewind = "none",
        rewind_step: int = 0,
        reset_optimizer_state: bool = False,
        seed: int | None = None,
        verbose: bool = True,
        masking: Masking = "reparametrize",
        importance: str | dict[str, str] | None = None,
        accumulator_dtype: AccumulatorDtype = "float32",
        structure: Structure | list[Structure] = "element",
        multiple_of: int = 1,
        target_params: int | float | None = None,
        target_active_params: int | float | None = None,
        target_memory: MemoryBudget | None = None,
        target_latency: LatencyBudget | None = None,
        shrink_at_end: bool = False,
        shrunk_dir: str | None = None,
        distill_weight: float = 0.0,
        distill_temperature: float = 2.0,
        teacher: nn.Module | None = None,
        example_inputs: Tensor | tuple[Any, ...] | None = None,
        search: bool = False,
        search_batches: Sequence[Any] | None = None,
        search_forward: Callable[[nn.Module, Any], Any] | None = None,
        search_grid: int | list[dict[str, float]] | None = None,
        search_score: Literal["loss", "kl"] = "loss",
        search_allocation: dict[str, float] | None = None,
    ) -> None:
        # Every argument, by name, to the one place that reads them (a test keeps the signature
        # equal to the Lightning callback's).
        config, options = split_arguments(locals())
        self._session = PruningSession(
            config,
            options,
            name="GradualPruningCallback",
            built_when="a Trainer has been made with it",
            inform=_inform_on_main_process,
            permanent_saves=True,
            rollback_hint=ROLLBACK_HINT,
            on_error=self._close,
        )
        # Set by the Trainer on a callback it rebuilds from a checkpoint's trainer_state.json
        # (restore_callback_states_from_checkpoint=True); the state itself is read from the
        # Trainer's state, whose latest entry is the checkpoint's.
        self.saved_state: dict[str, Any] | None = None
        self._loss_hook: RemovableHandle | None = None
        self._run: _RunGuard | None = None  # the run under way (its training steps)
        self._guards: tuple[RemovableHandle, ...] = ()
        self._forward_failed = False
        self._args: TrainingArguments | None = None
        self._teacher_ids: tuple[object, str] = (None, "")
        self._on_sharded = False  # the Trainer shards the model with FSDP2: built on it later
        self._load_guard: RemovableHandle | None = None  # until then, refuses a resume's load

    @property
    def state_key(self) -> str:
        """Tells the saved states of several callbacks apart (the Trainer files them all under
        the class name); the fields of the Lightning callback's key."""
        return _state_key(self.config)

    @property
    def pruner(self) -> RunPruner:
        """The pruner, built when the ``Trainer`` is made, under FSDP2 when training begins
        (before, a ``RuntimeError``)."""
        return self._session.pruner

    @staticmethod
    def put_first(trainer: Trainer) -> None:
        """Move ``trainer``'s pruning callbacks before its other callbacks (the reporting
        integrations among them), keeping the Trainer's flow callback first: their metrics
        then reach TensorBoard, W&B and the others, which the Trainer puts before the
        ``callbacks`` it is given. Uses only ``remove_callback`` and ``add_callback``.

        Example:
            >>> # trainer = Trainer(..., report_to="tensorboard", callbacks=[pruning])
            >>> # GradualPruningCallback.put_first(trainer)
        """
        after = [
            callback
            for callback in trainer.callback_handler.callbacks
            if not isinstance(callback, (DefaultFlowCallback, GradualPruningCallback))
        ]
        for callback in after:
            trainer.remove_callback(callback)
            trainer.add_callback(callback)

    @override
    def on_init_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        """Build the pruner and give every target its mask, before any checkpoint is loaded."""
        _check_hidden_saves(args, self.config.structure)
        if args.restore_callback_states_from_checkpoint and self._arguments() is None:
            raise ValueError(
                "Expected arguments that are plain data with "
                "`TrainingArguments(restore_callback_states_from_checkpoint=True)` (the Trainer "
                "rebuilds the callback from them), but the schedule or a class has no import "
                f"path: {self.config.schedule!r}; or a `teacher` module or `example_inputs` were "
                "given. Define the schedule at the top level of a module; leave `teacher` and "
                "`example_inputs` to their defaults."
            )
        # Under FSDP2 the Trainer shards the model in `train`, then loads a checkpoint into the
        # sharded model: the pruner is built on it when training begins, its masks DTensors.
        self._on_sharded = trainer_shards_with_fsdp2(args, self.config)
        self._args = args
        _join(args, self)
        if model is not None and self._on_sharded:
            self._load_guard = refuse_loads_before_build(model, lambda: self._session.built)
        elif model is not None:
            # The Trainer loads a checkpoint's weights into the model's keys: they must match.
            self._build(model)

    @override
    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        **kwargs: Any,
    ) -> None:
        """Restore the pruner's state when resumed; hand it the optimizer and the weights; take
        step ``global_step`` (0 unless resumed): a schedule may prune before training."""
        if model is None:
            raise ValueError("Expected the Trainer to pass its model to the callbacks.")
        _check_hidden_saves(args, self.config.structure)
        # Again for a callback the Trainer rebuilt from a checkpoint, or one added after it was
        # made: neither saw `on_init_end`.
        self._on_sharded = trainer_shards_with_fsdp2(args, self.config)
        if self._on_sharded and not self._session.built:
            check_fresh_under_fsdp2(state.global_step)
        if self._guards:  # an earlier run was left by an exception: take its hooks off
            self._close()
        guard = _RunGuard(self, _run_frame())
        self._run = guard
        self._guards = (
            changes.hook(model.register_forward_pre_hook, guard.before),
            changes.hook(model.register_forward_hook, guard.after, always_call=True),
        )
        if not (self._session.built_for(model) or self._session.waiting):
            self._take_over_or_build(model, state)
        # The teacher sees the training steps' forwards only (the session may be one taken over).
        self._session.distilling.active = self._in_step
        self._args = args
        _join(args, self)
        if self._session.waiting:
            if state.global_step > 0:
                self._close()
                raise ValueError(
                    "Expected `example_inputs` for GradualPruningCallback(structure='channel') "
                    f"to resume training {type(model).__name__} (not a Hugging Face model of a "
                    "known family: it is traced), but got none: the masks must exist before the "
                    "checkpoint's weights are loaded, and the inputs of the first training "
                    "forward come after. Pass `example_inputs` (a batch of the forward's "
                    "positional inputs)."
                )
            return  # built before the first optimizer step, from the first forward's inputs
        if state.global_step > 0:  # resumed: the checkpoint's trainer_state.json is loaded
            self._session.load_state_dict(*self._saved_state(state))
            self._load_teacher(args, state)
        self._session.start([] if optimizer is None else [optimizer])
        self._session.step(state.global_step)
        self._hook_loss()

    @override
    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """A training step begins: until its ``on_step_end``, the forwards of the model in
        this run are the step's (the teacher sees them, the loss hook adds their KD term)."""
        if self._run is not None:
            self._run.step_open = True

    @override
    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Before each optimizer step (the one place the callback calls into the pruner
        before a step): with an attached optimizer, zero the pruned weights' gradients; add the
        final gradients to a gradient score (once per optimizer step, accumulation folded in);
        check that every distillation term reached the backward. A pruner waiting for the
        first training forward is built first (its step 0 taken)."""
        self._session.distilling.check_reached()
        optimizer = kwargs.get("optimizer")
        if self._session.build_from_first_forward(permanent_saves=self._permanent_saves()):
            self._registered()
            self._session.start([] if optimizer is None else [optimizer])
            self._session.step(state.global_step)
            self._hook_loss()
        self._session.before_optimizer_step(optimizer)

    @override
    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Close the training step; take the pruning step of the optimizer step just done.

        Raises:
            RuntimeError: Distilling, and the step was not opened by :meth:`on_step_begin` (a
                subclass's override that does not call it): its forwards had no KD term.
        """
        if self._run is not None:
            if not self._run.step_open and self._session.distilling.attached:
                self._close()
                raise RuntimeError(
                    "GradualPruningCallback: expected `on_step_begin` before `on_step_end` "
                    "(the distillation term is added to the forwards of the training steps it "
                    "opens), but this step had none: a subclass that overrides `on_step_begin` "
                    "must call `super().on_step_begin(args, state, control, **kwargs)`."
                )
            self._run.step_open = False
        if self._session.built:
            self._session.step(state.global_step)
            self._hook_loss()

    @override
    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        """Add the pruning metrics to the training logs of this logging step: to ``logs`` (for
        the callbacks after this one) and to the entry the Trainer just put in
        ``state.log_history``."""
        if not self._session.built or logs is None or "loss" not in logs:
            return  # evaluation and the end-of-training summary are logged without them
        metrics = self._session.metrics(fresh=True)
        distill_loss = self._session.distilling.mean_value()
        if distill_loss is not None:
            metrics["pruning/distill_loss"] = distill_loss
        metrics = with_prefix(metrics, self._metric_prefix(args))
        logs.update(metrics)
        last = state.log_history[-1] if state.log_history else {}
        if last.get("step") == state.global_step and last.get("loss") == logs["loss"]:
            last.update(metrics)

    @override
    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Bring the pruner to the checkpoint the Trainer loaded at the end
        (``load_best_model_at_end``, warning if it has fewer pruned units); report the final
        sparsity; make the pruning permanent if asked."""
        best = state.best_model_checkpoint
        if args.load_best_model_at_end and best and self._session.weights_loaded():
            saved = TrainerState.load_from_json(os.path.join(best, TRAINER_STATE_NAME))
            self._session.load_state_dict(*self._saved_state(saved))
        self._close()
        self._session.finish(os.path.join(args.output_dir or ".", "shrunk"))

    @override
    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Write the teacher taken (its weights) into the checkpoint just saved, on the main
        process, so that a run resumed from it distils from the same teacher."""
        teacher = self._session.distilling.teacher_state()
        if teacher is None or not state.is_world_process_zero:
            return
        folder = _checkpoint_folder(args, state.global_step)
        if os.path.isdir(folder):
            torch.save({"id": self._teacher_id(), "teacher": teacher}, _teacher_path(folder))

    @override
    def state(self) -> dict[str, Any]:
        """What ``trainer_state.json`` keeps: under :attr:`state_key`, the pruner's state and
        the kept units whose weights are exactly zero in the weights saved beside it (JSON)."""
        saved = None
        if self._session.built:
            pruner_state, kept = self._session.state_dict(), self._session.kept_zeros()
            saved = saved_entry(self.state_key, pruner_state, kept)
            if self._session.distilling.teacher_state() is not None:
                saved[TEACHER_ENTRY] = self._teacher_id()
        return {"args": self._arguments() or {}, "attributes": {"saved_state": saved}}

    def _close(self) -> None:
        """Take the run's hooks off the model and optimizer: the loss hook, the guards and the
        session's (the teacher's, the first-forward hook, the optimizer attachment)."""
        for handle in (self._loss_hook, *self._guards):
            if handle is not None:
                handle.remove()
        self._loss_hook, self._guards, self._forward_failed = None, (), False
        self._run = None  # no step is open any more (and the Trainer's frame is let go)
        self._session.close()

    def _in_step(self) -> bool:
        """Whether a forward of the model now is inside one of this run's training steps."""
        return self._run is not None and self._run.in_step()

    def _forward_raised(self) -> None:
        """A forward of the model raised (seen by :class:`_RunGuard`): take off what can be
        taken off while torch runs the model's forward hooks (the optimizer's, the
        first-forward hook), make the loss hook inert; the next forward closes the run."""
        self._forward_failed = True
        self._session.stop_waiting()
        self._session.detach()

    def _hook_loss(self) -> None:
        """Once the teacher is attached, hook the student to add the distillation term to the
        loss its output carries (``outputs.loss``, what the Trainer back-propagates)."""
        distillation = self._session.distilling.distillation
        if self._loss_hook is not None or distillation is None or distillation.student is None:
            return
        hook = _AddToOutputLoss(self._session.distilling, self._args, self._close)
        self._loss_hook = changes.hook(
            distillation.student.register_forward_hook, hook.add, with_kwargs=True
        )

    def _metric_prefix(self, args: TrainingArguments) -> str:
        # Several callbacks of one Trainer (the one whose arguments they were given) would log
        # under the same names: each gets its own. A callback the Trainer rebuilt from a
        # checkpoint shares the session of the one it replaced: counted once.
        sessions: list[PruningSession] = []
        for callback in _peers(args):
            if not any(callback._session is seen for seen in sessions):
                sessions.append(callback._session)
        index = next((i for i, seen in enumerate(sessions) if seen is self._session), 0)
        return metric_prefix(index, len(sessions))

    def _teacher_id(self) -> str:
        """A random id of the teacher taken, saved with it and in trainer_state.json, so that a
        resumed run loads the teacher of its own checkpoint."""
        distillation = self._session.distilling.distillation
        if self._teacher_ids[0] is not distillation:
            self._teacher_ids = (distillation, uuid.uuid4().hex)
        return self._teacher_ids[1]

    def _load_teacher(self, args: TrainingArguments, state: TrainerState) -> None:
        """The teacher saved with the checkpoint the run resumed from, if it holds one."""
        saved: Any = state.stateful_callbacks or {}
        entries = saved.get(type(self).__name__, []) if isinstance(saved, dict) else []
        entry = find_entry(entries, self.state_key) or {}
        teacher_id = entry.get(TEACHER_ENTRY)
        if teacher_id is None or not self.distill_weight > 0:
            return
        path = _teacher_path(_checkpoint_folder(args, state.global_step))
        found = torch.load(path, weights_only=True) if os.path.isfile(path) else {}
        if found.get("id") != teacher_id:
            raise ValueError(
                f"Expected the teacher saved with the checkpoint of step {state.global_step} at "
                f"{path} (the checkpoint's folder in `output_dir`), but "
                f"{'it is another run' + chr(39) + 's' if found else 'there is none'}. Resume "
                "from a checkpoint in the `output_dir` of this run's arguments, or copy the "
                f"checkpoint's {TEACHER_FILE} with it."
            )
        self._session.distilling.load_teacher_state(found["teacher"])

    def _arguments(self) -> dict[str, Any] | None:
        return plain_arguments(self._session.config, self._session.options)

    def _take_over_or_build(self, model: nn.Module, state: TrainerState) -> None:
        if self.saved_state is not None:  # the Trainer rebuilt this callback from a checkpoint
            # The latest first: the session of the callback this one replaces, whose masks the
            # checkpoint's weights were loaded into.
            for ref in reversed(_SESSIONS):
                session = ref()
                if session is not None and session.built_for(model) and self._same_key(session):
                    self._session = session
                    return
        elif state.global_step > 0:
            raise ValueError(
                "Expected GradualPruningCallback to be given to the Trainer when it is made "
                "(`Trainer(..., callbacks=[...])`) to resume from a checkpoint, but it was "
                "added later: the masks must exist before the checkpoint's weights are loaded."
            )
        self._build(model)

    def _same_key(self, session: PruningSession) -> bool:
        return _state_key(session.config) == self.state_key

    def _build(self, model: nn.Module) -> None:
        if self._session.build_or_wait(model, permanent_saves=self._permanent_saves()):
            self._registered()
        if self._load_guard is not None:
            self._load_guard.remove()
            self._load_guard = None

    def _permanent_saves(self) -> bool | None:
        """``False`` on a model sharded with FSDP2: its saves keep the masks, sharded like the
        weights (permanent saves hook plain tensors only); else the session's (every save in
        the permanent form)."""
        return False if self._on_sharded else None

    def _registered(self) -> None:
        _SESSIONS[:] = [ref for ref in _SESSIONS if ref() is not None]
        _SESSIONS.append(weakref.ref(self._session))

    def _saved_state(self, state: TrainerState) -> tuple[dict[str, Any], dict[str, Tensor] | None]:
        # A loaded state holds the JSON of trainer_state.json: by class name, a list if several.
        saved: Any = state.stateful_callbacks or {}
        entries = saved.get(type(self).__name__, []) if isinstance(saved, dict) else []
        found = find_saved(entries, self.state_key)
        if found is None:  # saved before classes were written by their import path
            found = find_saved(entries, _state_key(self.config, str))
        if found is not None:
            return found
        raise ValueError(
            f"Expected the checkpoint of step {state.global_step} to hold the state of "
            f"this GradualPruningCallback (key {self.state_key}), but its trainer_state.json "
            "has none: it was saved without this callback, or with another configuration."
        )


class _RunGuard(LeftOutOfCopies):
    """One run of the Trainer (from ``on_train_begin``) and its training steps, which the
    callback's hooks on the model act in: a forward of the model counts as a training step's
    (the teacher sees it, its KD term is added) only between ``on_step_begin`` and
    ``on_step_end``, and only while the run is under way. The Trainer has no exception event:
    the run is under way while the frame of the Trainer's ``train`` that began it
    (:func:`_run_frame`) is still executing, that is, on the stack of a forward in the thread
    that began it. A forward after an exception left ``train`` (from a step, the data, another
    callback, a ``KeyboardInterrupt``), in any loop, so finds the run over: it closes the run
    before it runs, in the pre-hook :meth:`before`, and runs as a plain forward.

    A forward of the model that raises is seen by a forward hook torch calls also then
    (``always_call``), :meth:`after`: the optimizer's hooks come off at once (forward hooks
    cannot come off there: torch is iterating over them), and the next forward closes the run.
    (A :class:`~tensorplay.ao.pruning.distillation.left_out.LeftOutOfCopies`: a teacher copied
    from the model never carries it.)

    Args:
        callback: The callback whose run this is.
        frame: The Trainer's frame that began the run (see :func:`_run_frame`).
    """

    def __init__(self, callback: GradualPruningCallback, frame: FrameType | None) -> None:
        self.callback = callback
        self.frame = frame
        self.thread = threading.get_ident()
        #: Between the Trainer's ``on_step_begin`` and ``on_step_end``.
        self.step_open = False

    def under_way(self) -> bool:
        """Whether the Trainer's run is still executing. A forward in another thread (the
        replicas of ``DataParallel``) cannot tell from its stack: taken as under way."""
        if self.frame is None or threading.get_ident() != self.thread:
            return True
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            if frame is self.frame:
                return True
            frame = frame.f_back
        return False

    def in_step(self) -> bool:
        """Whether a forward now is inside one of the run's training steps."""
        return self.step_open and self.under_way()

    def before(self, model: nn.Module, args: Any) -> None:
        if self.callback._forward_failed or not self.under_way():
            self.callback._close()

    def after(self, model: nn.Module, args: Any, output: Any) -> None:
        if sys.exc_info()[0] is not None:
            self.callback._forward_raised()


def _run_frame() -> FrameType | None:
    """The frame that a run of the Trainer executes in, seen from ``on_train_begin``: going out
    from there, the first frames of ``transformers`` or ``accelerate`` (the Trainer's callback
    handler) and the outermost of those that follow them without a break (``Trainer.train``;
    a subclass's ``train`` written elsewhere ends the climb). Every training step of the run
    happens inside it, and an exception that leaves the run leaves it too. Called other than
    by the Trainer (no such frame), the first frame outside this module; ``None`` where no
    frame can be seen."""
    frame: FrameType | None = sys._getframe(1)
    first_outside: FrameType | None = None
    while frame is not None and not _of_trainer(frame):  # this module, a subclass's override
        if first_outside is None and frame.f_globals.get("__name__") != __name__:
            first_outside = frame
        frame = frame.f_back
    if frame is None:
        return first_outside
    outermost = frame
    while frame is not None and _of_trainer(frame):
        outermost, frame = frame, frame.f_back
    return outermost


def _of_trainer(frame: FrameType) -> bool:
    """Whether ``frame`` runs code of ``transformers`` or ``accelerate``."""
    module = str(frame.f_globals.get("__name__", ""))
    return module.partition(".")[0] in ("transformers", "accelerate")


# The callbacks by the Trainer whose arguments they were given (its callbacks, in its order),
# held weakly: several in one Trainer log under names of their own.
_TRAINERS: list[tuple[weakref.ref[TrainingArguments], weakref.ref[GradualPruningCallback]]] = []


def _join(args: TrainingArguments, callback: GradualPruningCallback) -> None:
    _TRAINERS[:] = [(a, c) for a, c in _TRAINERS if a() is not None and c() is not None]
    if callback not in _peers(args):
        _TRAINERS.append((weakref.ref(args), weakref.ref(callback)))


def _peers(args: TrainingArguments) -> list[GradualPruningCallback]:
    found = [c() for a, c in _TRAINERS if a() is args]
    return [callback for callback in found if callback is not None]


# The sessions built here, held weakly: a callback the Trainer rebuilds from a checkpoint takes
# over the session of the one it replaces (see GradualPruningCallback._take_over_or_build).
_SESSIONS: list[weakref.ref[PruningSession]] = []


class _AddToOutputLoss(LeftOutOfCopies):
    """A forward hook on the student that adds the distillation term to the ``loss`` of its
    training outputs: what the Trainer's ``compute_loss`` returns and back-propagates; only in
    the Trainer's training steps, the forwards the teacher sees. (A
    :class:`~tensorplay.ao.pruning.distillation.left_out.LeftOutOfCopies`: a copy of the student,
    such as a
    teacher, never carries it.)"""

    def __init__(
        self, distilling: Distilling, args: TrainingArguments | None, close: Callable[[], None]
    ) -> None:
        self.distilling = distilling
        self.args = args
        self.close = close  # the run's hooks off, when adding fails

    def add(
        self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        if not (model.training and torch.is_grad_enabled() and self.distilling.attached):
            return None  # not a training forward, or a run closed by a failed forward
        if not self.distilling.observing():
            return None  # outside the Trainer's training steps: the teacher did not see it
        try:
            return self._add(output, kwargs)
        except Exception:
            self.close()
            raise

    def _add(self, output: Any, kwargs: dict[str, Any]) -> Any:
        loss = output.get("loss") if isinstance(output, Mapping) else None
        if not isinstance(loss, Tensor):
            raise ValueError(
                "GradualPruningCallback: expected the model's output to carry its `loss` in "
                "training with `distill_weight` > 0 (the distillation term is added to it), but "
                f"the {type(output).__name__} it returned has none: the labels were not passed "
                "to the model (the Trainer's `compute_loss_func`, or a custom `compute_loss`). "
                "Pass the labels to the model, or set distill_weight=0 and add "
                "`tensorplay.ao.pruning.Distillation(...).loss()` to your loss yourself."
            )
        term = self.distilling.term(self.scale(kwargs))
        if term is not None:
            output["loss"] = loss + term.to(loss.dtype)
        return output

    def scale(self, kwargs: Mapping[str, Any]) -> float:
        """What makes the term of one micro-batch count as the Trainer counts its loss. A model
        given ``num_items_in_batch`` divides its summed loss by the items of the whole
        accumulated batch (of every process, which the Trainer then multiplies back by the
        process count), and the Trainer no longer divides by the accumulation steps: the term,
        a mean per micro-batch, is divided by both here. Otherwise the Trainer divides the loss
        and the term alike."""
        if "num_items_in_batch" not in kwargs or self.args is None:
            return 1.0
        scale = 1.0 / self.args.gradient_accumulation_steps
        if getattr(self.args, "average_tokens_across_devices", False):
            distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
            scale /= torch.distributed.get_world_size() if distributed else 1
        return scale


# The teacher the callback took, saved in each checkpoint's folder; its id in trainer_state.json.
TEACHER_FILE = "tensorplay_teacher.pt"
TEACHER_ENTRY = "distill_teacher"


def _check_hidden_saves(args: TrainingArguments, structure: object) -> None:
    """Refuse checkpoints of a run pruning the hidden size, before anything changes: a copy
    saved while hidden channels are masked would load into a model whose norms read the full
    width (every permanent save refuses it), so the Trainer would stop at its first save."""
    kinds = structure if isinstance(structure, tuple) else (structure,)
    strategy = getattr(args.save_strategy, "value", args.save_strategy)
    if "hidden" in kinds and strategy != "no":
        raise ValueError(
            "Expected TrainingArguments(save_strategy='no') with "
            f"GradualPruningCallback(structure={structure!r}), but got "
            f"save_strategy={strategy!r}: a checkpoint written while hidden channels are "
            "masked would load into a model whose norms read the full width. Set "
            "save_strategy='no' and shrink_at_end=True (trainer.save_model then writes the "
            "shrunk model), or prune the hidden size once (prune_one_shot(..., "
            "structure='hidden')), shrink, and train the shrunk model."
        )


def _checkpoint_folder(args: TrainingArguments, step: int) -> str:
    return os.path.join(args.output_dir or "", f"{PREFIX_CHECKPOINT_DIR}-{step}")


def _teacher_path(folder: str) -> str:
    return os.path.join(folder, TEACHER_FILE)


def _state_key(config: PrunerConfig, name: Callable[[object], str] | None = None) -> str:
    """The fields of the Lightning callback's key as JSON, a class by its import path (as the
    callback the Trainer rebuilds from the saved arguments has it)."""
    plain = name or (lambda value: import_path(value) or str(value))
    return json.dumps(state_key_fields(config), sort_keys=True, default=plain)


ROLLBACK_HINT = (
    "With load_best_model_at_end=True the Trainer loads the checkpoint with the best metric "
    "when training ends, which may be one saved before the schedule had pruned everything. To "
    "end at the schedule's sparsity, evaluate only once it is reached, "
    "TrainingArguments(eval_delay=<its last pruning step>), so that the best checkpoint is one "
    "at that sparsity; or set load_best_model_at_end=False."
)


def _inform_on_main_process(message: str) -> None:
    """``message`` at ``INFO`` on the main process, through the library's logger."""
    if on_rank_zero():
        logger.info(message)
