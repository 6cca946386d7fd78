"""Gradual pruning while a Hugging Face ``Trainer`` trains: an adapter over the pruner.

Every pruning decision belongs to :class:`~tensorplay.ao.pruning.pruner.Pruner`; the callback
builds it when the ``Trainer`` is made (``on_init_end``: the masks must exist before
``train(resume_from_checkpoint=...)`` loads a checkpoint's weights, and before DDP wraps the
model), gives it rank zero's seed and the trainer's optimizer, steps it with
``state.global_step`` (``k`` right after the ``k``-th optimizer step), adds its metrics to the
Trainer's logs, and keeps its state in ``trainer_state.json``. Importing this module needs
``transformers`` (and, to train, ``accelerate``), not Lightning.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import (
    DefaultFlowCallback,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_callback import ExportableState
from transformers.utils import logging
from typing_extensions import override

from tensorplay.ao.pruning.config import AccumulatorDtype, Masking, PrunerConfig, Rewind, Scope
from tensorplay.ao.pruning.masking.optimizer_hooks import OptimizerAttachment
from tensorplay.ao.pruning.pruner import Pruner
from tensorplay.ao.pruning.schedules import Schedule
from tensorplay.ao.pruning.targets import KeepDense
from tensorplay.callbacks._json_state import from_json, to_json
from tensorplay.callbacks._metrics import pruning_metrics
from tensorplay.callbacks._state import state_key_fields

__all__ = ["GradualPruningCallback"]

# A child of the library's logger: the Trainer's `log_level` (and TRANSFORMERS_VERBOSITY) set its
# level, and the library's handler prints it, as for the Trainer's own messages.
logger = logging.get_logger(f"transformers.{__name__}")


class GradualPruningCallback(TrainerCallback, ExportableState):
    """Prune a model on a sparsity schedule while a Hugging Face ``Trainer`` trains it.

    The arguments are those of the Lightning callback
    :class:`~tensorplay.callbacks.GradualPruning`, one for one: the pruning arguments are the
    fields of :class:`~tensorplay.ao.pruning.config.PrunerConfig` (documented there), checked
    by it as the pruner's are, so a bad value fails here, when the callback is made, with the
    pruner's message. A bad selection (a parameter the model lacks) fails when the ``Trainer``
    is made. The schedule counts optimizer steps (``state.global_step``: gradient accumulation
    is folded in). See :doc:`/huggingface_trainer` for what differs from Lightning.

    At the Trainer's logging steps (``logging_steps``) the metrics ``pruning/sparsity``,
    ``pruning/target_sparsity``, ``pruning/pruned`` (cumulative units) and, with
    ``log_per_tensor``, ``pruning/sparsity/<module>.<name>`` join the logs: in
    ``trainer.state.log_history`` always, and in the reporting integrations (TensorBoard, W&B,
    ...) that run after this callback, which :meth:`put_first` arranges.

    With ``masking="inplace"`` the trainer's optimizer (Accelerate's wrapper, unwrapped) is
    attached to the pruner and the gradients are masked in :meth:`on_pre_optimizer_step`, which
    the Trainer calls after clipping: the gradient norm it clips by and logs includes the
    pruned entries' gradients (the reparametrization's are zero already).

    Resuming with ``trainer.train(resume_from_checkpoint=...)`` restores the masks (with the
    weights) and the pruner's state (from ``trainer_state.json``), into a freshly built model
    too, under the Trainer's default ``restore_callback_states_from_checkpoint=False``.

    Args:
        schedule: A field of ``PrunerConfig``, as are ``method`` (by name or import path),
            ``parameters``, ``module_types``, ``names``, ``include``, ``exclude``,
            ``keep_dense``, ``scope``, ``min_density``, ``rewind`` (``"init"`` restores the
            weights training starts from), ``rewind_step``, ``masking``, ``importance``
            (``"movement"`` and ``"taylor"`` accumulate in :meth:`on_pre_optimizer_step`, once
            per optimizer step, from the clipped gradients the optimizer uses) and
            ``accumulator_dtype``.
        seed: The pruner's; by default rank zero's ``torch.initial_seed()`` (the Trainer's
            ``TrainingArguments.seed``), the same on every rank.
        log_per_tensor: Also log ``pruning/sparsity/<module>.<name>``.
        make_permanent: At the end of training, drop ``_orig``, ``_mask`` and the hooks, so
            that ``trainer.save_model(d)`` writes a plain model that ``from_pretrained`` loads
            (checkpoints saved during training keep the masks).
        reset_optimizer_state: Give the pruner the trainer's optimizer, whose state it clears
            after each pruning event.
        verbose: Log each pruning event and the final sparsity table (``logging.INFO``, on the
            main process: ``TrainingArguments(log_level="info")`` shows them).

    Raises:
        TypeError: As :class:`~tensorplay.ao.pruning.config.PrunerConfig`.
        ValueError: As it; when the ``Trainer`` is made, as the ``Pruner`` (an unknown or empty
            selection), with ``restore_callback_states_from_checkpoint=True``, or with FSDP or
            DeepSpeed (not supported yet).

    Example:
        >>> from tensorplay.ao.pruning.schedules import CubicSchedule
        >>> callback = GradualPruningCallback(CubicSchedule(final_sparsity=0.8, end_step=1000))
        >>> callback.config.method, callback.config.scope
        ('l1_unstructured', 'global')
        >>> # Trainer(model, args, train_dataset=data, callbacks=[callback]).train()
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
        importance: str = "magnitude",
        accumulator_dtype: AccumulatorDtype = "float32",
    ) -> None:
        # In the order of PrunerConfig's fields, as the Lightning callback builds it.
        self.config = PrunerConfig(
            *(schedule, parameters, module_types, names, include, exclude, keep_dense),
            *(method, scope, min_density, rewind, rewind_step, seed, masking),
            *(importance, accumulator_dtype),
        )
        self.log_per_tensor = log_per_tensor
        self.make_permanent = make_permanent
        self.reset_optimizer_state = reset_optimizer_state
        self.verbose = verbose
        self._pruner: Pruner | None = None
        self._attachment: OptimizerAttachment | None = None

    @property
    def state_key(self) -> str:
        """Tells the saved states of several callbacks apart (the Trainer files them all under
        the class name); the fields of the Lightning callback's key."""
        return json.dumps(state_key_fields(self.config), sort_keys=True, default=str)

    @property
    def pruner(self) -> Pruner:
        """The pruner, built when the ``Trainer`` is made (before, a ``RuntimeError``)."""
        if self._pruner is None:
            raise RuntimeError(
                "`GradualPruningCallback.pruner` exists once a Trainer has been made with it."
            )
        return self._pruner

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
        if args.restore_callback_states_from_checkpoint:
            raise ValueError(
                "Expected `TrainingArguments(restore_callback_states_from_checkpoint=False)` with "
                "GradualPruningCallback, but got True: the Trainer would replace the callback by "
                "a new one built from JSON after the masks were made. The callback restores its "
                "own state from the checkpoint's trainer_state.json."
            )
        for option in ("fsdp", "deepspeed"):
            if getattr(args, option, None):
                raise ValueError(
                    f"Expected a Trainer without `{option}` (DDP or one device): "
                    f"GradualPruningCallback does not support it yet, but got "
                    f"{option}={getattr(args, option)!r}."
                )
        if model is not None:
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
        if self._pruner is None or self._pruner.model is not model:
            self._check_not_resumed(state)
            self._build(model)
        if state.global_step > 0:  # resumed: the checkpoint's trainer_state.json is loaded
            self.pruner.load_state_dict(self._saved_state(state))
        self._detach()  # the optimizer of an earlier train()
        lean = self.pruner.mode.hooks_optimizers and not self.pruner.permanent
        if optimizer is not None and lean:
            # The gradients are masked in on_pre_optimizer_step (after the Trainer's clipping).
            self._attachment = self.pruner.attach(optimizer, mask_gradients=False, accumulate=False)
        if self.reset_optimizer_state and optimizer is not None:
            self.pruner.optimizers = [optimizer]
        if self.config.rewind == "init" and self.pruner.last_step < 0:
            self.pruner.take_snapshot()  # the weights training starts from, as loaded
        if state.global_step != self.pruner.last_step:
            self._step(state)

    @override
    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Before each optimizer step (the one place the callback calls into the pruner
        before a step): with an attached optimizer, zero the pruned weights' gradients; add the
        final gradients to a gradient score (once per optimizer step, accumulation folded in)."""
        if self._pruner is None or self._pruner.permanent:
            return
        if self._attachment is not None:
            self.pruner.mask_gradients()
        self.pruner.accumulate()  # a no-op for scores that read no gradients

    @override
    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Take the pruning step of the optimizer step just done."""
        if self._pruner is not None and state.global_step != self.pruner.last_step:
            self._step(state)

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
        if self._pruner is None or logs is None or "loss" not in logs:
            return  # evaluation and the end-of-training summary are logged without them
        metrics = pruning_metrics(self.pruner, self.pruner.report(), self.log_per_tensor)
        logs.update(metrics)
        last = state.log_history[-1] if state.log_history else {}
        if last.get("step") == state.global_step and last.get("loss") == logs["loss"]:
            last.update(metrics)

    @override
    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Report the final sparsity; make the pruning permanent if asked."""
        if self._pruner is None:
            return
        self._detach()
        if self.verbose and state.is_world_process_zero:
            logger.info(f"GradualPruningCallback: final sparsity\n{self.pruner.report()}")
        if self.make_permanent and not self.pruner.permanent:
            self.pruner.make_permanent()

    @override
    def state(self) -> dict[str, Any]:
        """What ``trainer_state.json`` keeps: the pruner's state (JSON) under :attr:`state_key`."""
        pruner = None if self._pruner is None else to_json(self._pruner.state_dict())
        return {"args": {}, "attributes": {"state_key": self.state_key, "pruner": pruner}}

    def _build(self, model: nn.Module) -> None:
        seed = torch.initial_seed() if self.config.seed is None else self.config.seed
        # Rank zero's seed on every rank: random methods then draw the same masks everywhere.
        config = PrunerConfig(**{**self.config.as_kwargs(), "seed": _rank_zero(int(seed))})
        pruner = Pruner(model, **config.as_kwargs())
        self._pruner = pruner
        # The Trainer loads a checkpoint's weights into the model's keys: they must match.
        pruner.reparametrize()

    def _check_not_resumed(self, state: TrainerState) -> None:
        if state.global_step > 0:
            raise ValueError(
                "Expected GradualPruningCallback to be given to the Trainer when it is made "
                "(`Trainer(..., callbacks=[...])`) to resume from a checkpoint, but it was "
                "added later: the masks must exist before the checkpoint's weights are loaded."
            )

    def _saved_state(self, state: TrainerState) -> dict[str, Any]:
        # A resumed state holds the JSON of trainer_state.json: by class name, a list if several.
        saved: Any = state.stateful_callbacks or {}
        entries = saved.get(type(self).__name__, []) if isinstance(saved, dict) else []
        for entry in entries if isinstance(entries, list) else [entries]:
            attributes: dict[str, Any] = entry.get("attributes", {})
            if attributes.get("state_key") == self.state_key and attributes.get("pruner"):
                loaded: dict[str, Any] = from_json(attributes["pruner"])
                return loaded
        raise ValueError(
            f"Expected the checkpoint resumed at step {state.global_step} to hold the state of "
            f"this GradualPruningCallback (key {self.state_key}), but its trainer_state.json "
            "has none: it was saved without this callback, or with another configuration."
        )

    def _step(self, state: TrainerState) -> None:
        pruned = self.pruner.step(state.global_step)
        if pruned > 0 and self.verbose and state.is_world_process_zero:
            report = self.pruner.report()
            logger.info(
                f"GradualPruningCallback: step {state.global_step}: pruned {pruned} more units, "
                f"sparsity {report.sparsity:.4f} (target {self.pruner.target_sparsity():.4f})."
            )

    def _detach(self) -> None:
        if self._attachment is not None:
            self._attachment.remove()
            self._attachment = None


def _rank_zero(value: int) -> int:
    """``value`` as rank zero has it, when a process group is up."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    values = [value]
    torch.distributed.broadcast_object_list(values, src=0)
    return int(values[0])
