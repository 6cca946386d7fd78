"""Gradual pruning while a Lightning ``Trainer`` fits: an adapter over the pruner.

Every pruning decision belongs to :class:`~tensorplay.ao.pruning.pruner.Pruner`; the callback
builds it, gives it rank zero's seed and the trainer's optimizers, steps it with
``trainer.global_step`` (``k`` right after the ``k``-th optimizer step), logs, and checkpoints
its state. The masks must exist on the final model before Lightning restores a checkpoint (the
load is strict): the pruner is built in ``setup``, or in ``on_fit_start`` where the strategy
restores after set-up (``ModelParallelStrategy``, the model sharded in ``configure_model``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from typing_extensions import override

from tensorplay.ao.pruning.pruner.config import (
    AccumulatorDtype,
    Masking,
    Rewind,
    Scope,
    Structure,
)
from tensorplay.ao.pruning.pruner.gradual_search import RunPruner
from tensorplay.ao.pruning.pruner.schedules import Schedule
from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget
from tensorplay.ao.pruning.targets.parameters import KeepDense

from ..core.example_inputs import as_example_inputs
from ..core.lifecycle import PruningSession, SessionOptions, split_arguments
from ..core.metrics import PREFIX, metric_prefix, with_prefix
from ..core.state_keys import state_key_fields
from .loading import SHRUNK_KEY
from .sharded_teacher import add_teacher, teacher_loader
from .strategies import check_disjoint, check_shrinkable, check_strategy

__all__ = ["GradualPruning"]

ROLLBACK_HINT = (
    'Lightning loads it for `ckpt_path="best"`: the best checkpoint by the monitored metric, '
    "which may be one saved before the schedule had pruned everything. To test the model at the "
    'schedule\'s sparsity, test it as training left it (`trainer.test(model)`, or ckpt_path="last" '
    "with ModelCheckpoint(save_last=True)), or monitor a metric logged only once the schedule "
    "has ended."
)


# Where the callback's state keeps the teacher it took (its weights, saved once per checkpoint).
TEACHER_KEY = "distill_teacher"


def _scaled_like_loss(trainer: pl.Trainer, term: torch.Tensor) -> torch.Tensor:
    """``term`` as Lightning's automatic optimization hands the task loss to backward: divided
    by ``accumulate_grad_batches``, then multiplied by the precision plugin's loss scale."""
    term = term / trainer.accumulate_grad_batches
    scaler = getattr(trainer.precision_plugin, "scaler", None)  # a GradScaler under 16-mixed
    if scaler is None:
        return term
    scaled: torch.Tensor = scaler.scale(term)
    return scaled


class GradualPruning(SessionOptions, Callback):
    """Prune a model on a sparsity schedule while it trains, and log its sparsity.

    The pruning arguments are the fields of
    :class:`~tensorplay.ao.pruning.pruner.config.PrunerConfig` (documented there), checked by it as
    the pruner's are. Logged through :meth:`~lightning.pytorch.core.LightningModule.log` after every
    optimizer step (filed under the batch that ended): ``pruning/sparsity``,
    ``pruning/target_sparsity``, ``pruning/pruned`` (cumulative units) and, with ``log_per_tensor``,
    ``pruning/sparsity/<module>.<name>``; with several ``GradualPruning`` callbacks in one trainer,
    the ``i``-th of them (in ``trainer.callbacks``) logs ``pruning/<i>/sparsity`` and so on. Masks
    exist before a checkpoint is restored, so ``Trainer.fit(ckpt_path=...)`` loads strictly and
    resumes exactly; a fresh model loads a pruned checkpoint with
    :class:`~tensorplay.callbacks.PrunableMixin`. See :doc:`/callback` for YAML, several callbacks
    on one model, and resuming.

    With ``masking="inplace"`` the trainer's optimizers that hold a pruned tensor are attached
    to the pruner (a GAN pruning its generator attaches the generator's alone); the pruned
    gradients are zero as soon as autograd accumulates them, before any clipping, manual
    optimization included. A pruning step the step counter jumps over (two optimizers under
    manual optimization move it by 2 per batch) is taken at the first step after it. A checkpoint
    that ``trainer.test(ckpt_path="best")`` loads with fewer pruned units than the run reached
    comes with a :class:`~tensorplay.callbacks.PruningRollbackWarning`. It is the mode for
    ``ModelParallelStrategy`` (FSDP2): masks are sharded like the weights and saved in the
    distributed checkpoint; with ``distill_weight`` > 0 the teacher is copied shard by shard,
    sharded like the model, and saved in the distributed checkpoint too (not in a full one: a
    run resumed from that past the first pruning step needs ``teacher=``). Lightning's
    ``FSDPStrategy`` (FSDP1) is refused.

    Args:
        schedule: A field of ``PrunerConfig``, as are ``method`` (by name or import path in
            YAML), ``parameters``, ``module_types``, ``names``, ``include``, ``exclude``,
            ``keep_dense``, ``scope``, ``min_density``, ``rewind`` (``"init"`` restores the
            weights training starts from), ``rewind_step``, ``masking``, ``importance``
            (``"movement"`` and ``"taylor"`` accumulate in :meth:`on_before_optimizer_step`,
            once per optimizer step, after Lightning unscaled the gradients), ``accumulator_dtype``,
            ``structure`` (``"channel"``, ``"head"``, ``"layer"`` or ``"expert"`` of a Hugging
            Face model, a channel of a plain one: units found from its modules, masked in every
            slice), ``multiple_of``, ``target_params``, ``target_active_params``,
            ``target_memory`` and ``target_latency`` (budgets in place of the
            schedule's final sparsity: :doc:`/structured`).
        seed: The pruner's; by default rank zero's ``torch.initial_seed()`` (set by
            ``seed_everything``), the same on every rank.
        log_per_tensor: Also log ``pruning/sparsity/<module>.<name>``.
        make_permanent: At the end of fit, drop ``_orig``, ``_mask`` and the hooks (checkpoints
            saved during fit keep the masks).
        reset_optimizer_state: Give the pruner the trainer's optimizers, whose state it clears
            after each pruning event.
        verbose: Report each pruning event and the final sparsity table on rank zero.
        shrink_at_end: At the end of fit (after the last checkpoint of ``ModelCheckpoint``),
            remove the pruned units physically (:func:`~tensorplay.ao.pruning.shrink`) and
            report the parameters and widths before and after (:attr:`shrink_report`). A
            checkpoint saved afterwards (``trainer.save_checkpoint``) records the shrunk
            layout, which :class:`~tensorplay.callbacks.PrunableMixin` rebuilds when it is
            loaded. The trainer's optimizers hold the old tensors: stepping one raises. See
            :doc:`/structured`. Under ``ModelParallelStrategy`` (FSDP2) the sharded module
            stays as it is: it is gathered once on rank zero, to the CPU, and the shrunk copy
            (:attr:`shrunk_model` there) is written to ``shrunk_dir``
            (:doc:`/large_models`).
        shrunk_dir: Where ``shrink_at_end`` also writes the shrunk model, on rank zero: the
            ``save_pretrained`` folder of the Hugging Face model the module holds (every
            parameter of the module in it), else ``model.pt`` (the pickled module). ``None``
            (default): nowhere, except under ``ModelParallelStrategy``:
            ``<default_root_dir>/shrunk``.

        distill_weight: Distil from a teacher (:doc:`/distillation`): the weight of the KD term
            added to the loss Lightning back-propagates, scaled as it scales the task loss
            (``accumulate_grad_batches``, the 16-bit loss scaler); 0 (default) is off. The term
            is the one of the forward ``training_step`` runs through ``self(...)``; it is
            logged as ``pruning/distill_loss``.
        distill_temperature: The KD term's temperature (> 0).
        teacher: The teacher, used from the first step; ``None`` (default): a frozen dense copy
            of the module taken just before the first pruning step, saved in the checkpoints.
        example_inputs: With ``structure="channel"`` on a plain PyTorch model (no Hugging Face
            family), the inputs of its forward (a tensor or a tuple of positional inputs) that
            tracing it takes to find every layer's channels. ``None`` (default): the module's
            ``example_input_array``, or else the inputs of its first training forward
            (``self(...)`` in ``training_step``): the pruner is then built after that forward,
            and its step 0 taken then. Not a YAML option (tensors have no plain-data form).
        search: Search the mix of the kinds a ``structure`` list names (``"layer"``,
            ``"hidden"``, ``"head"``, ``"channel"``, ``"expert"``) under the budgets, on
            ``search_batches``, when the pruner is built, and prune to it along the schedule
            (a schedule without its own target: the fraction of the way to the budget): the
            layers chosen go then, each width on the schedule
            (:class:`~tensorplay.ao.pruning.pruner.gradual_search.SearchedPruner`, which
            :attr:`pruner` is; :doc:`/width`). With ``distill_weight`` > 0 and no ``teacher``,
            the teacher is the dense model, copied before the search.
        search_batches: The calibration batches the search realizes and scores the candidates
            on (required with ``search``; not a YAML option).
        search_forward: How a batch runs through the model, returning a scalar loss:
            ``search_forward(model, batch)``; ``None`` (default): ``model(**batch)`` for a
            mapping (a causal LM's loss where it holds ``input_ids``), see
            :func:`~tensorplay.ao.pruning.prune_one_shot`. Not a YAML option.
        search_grid: The allocations searched, as ``prune_one_shot``'s (default 4).
        search_score: ``"loss"`` (default) or ``"kl"`` against the dense model.
        search_allocation: The mix to prune to instead of searching (a row's ``allocation``
            of :attr:`pruner`'s ``search_report()``); a resumed run passes its state's.

    Raises:
        TypeError: As :class:`~tensorplay.ao.pruning.pruner.config.PrunerConfig`; a distillation
            argument of the wrong type; ``example_inputs`` neither a tensor nor a tuple.
        ValueError: As it; ``distill_weight`` < 0 or ``distill_temperature`` <= 0; at set-up,
            under ``FSDPStrategy``, or under ``ModelParallelStrategy`` without
            ``masking="inplace"`` or with rewinding; with ``shrink_at_end`` under
            ``DeepSpeedStrategy`` or a strategy launched in worker processes, or under
            ``ModelParallelStrategy`` on a model gathering cannot copy (a mesh of more than
            one dimension); with ``distill_weight`` > 0 under ``DeepSpeedStrategy`` or manual
            optimization; ``example_inputs`` with
            ``structure="element"``.
        RuntimeError: The pruner waits for the first training forward, and the first batch
            ended without one (the loss computed from a submodule, not ``self(...)``).

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import CubicSchedule
        >>> callback = GradualPruning(
        ...     CubicSchedule(final_sparsity=0.8, end_step=1000), keep_dense=["embeddings", "last"]
        ... )
        >>> callback.config.method, callback.config.keep_dense
        ('l1_unstructured', ['embeddings', 'last'])
        >>> # Trainer(callbacks=[callback]).fit(model)
        >>> distilled = GradualPruning(CubicSchedule(0.8, end_step=1000), distill_weight=1.0)
        >>> distilled.distill_weight, distilled.distill_temperature, distilled.teacher
        (1.0, 2.0, None)
        >>> GradualPruning(CubicSchedule(0.8, end_step=1000), distill_temperature=0)
        Traceback (most recent call last):
        ...
        ValueError: Expected `distill_temperature` to be a positive number, but got 0.
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
        # Every argument, by name, to the one place that reads them (LightningCLI reads the
        # signature above, so it stays explicit; a test keeps it equal to the Trainer callback's).
        config, options = split_arguments(locals())
        self._session = PruningSession(
            config,
            options,
            name="GradualPruning",
            built_when="`Trainer.fit` has set it up",
            inform=rank_zero_info,
            rollback_hint=ROLLBACK_HINT,
        )

    @property
    @override
    def state_key(self) -> str:
        """Differs between configurations, and is the key tensorplay 0.1 wrote."""
        return self._generate_state_key(**state_key_fields(self.config))

    @property
    def pruner(self) -> RunPruner:
        """The pruner, built when ``Trainer.fit`` sets up (before, a ``RuntimeError``)."""
        return self._session.pruner

    @property
    def built(self) -> bool:
        """Whether :attr:`pruner` exists."""
        return self._session.built

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Check the strategy; build the pruner unless it restores checkpoints after set-up."""
        if stage != "fit" or self._session.built_for(pl_module):
            return
        check_strategy(trainer.strategy, self.config, self._session.options)
        if self.shrink_at_end:
            check_shrinkable(trainer.strategy)
        if self.distill_weight > 0 and not pl_module.automatic_optimization:
            raise ValueError(
                "Expected automatic optimization with `distill_weight` > 0 (the callback adds "
                "the distillation term to the loss Lightning back-propagates), but got "
                f"distill_weight={self.distill_weight!r} and automatic_optimization=False. Set "
                "distill_weight=0 and add `tensorplay.ao.pruning.Distillation(...).loss()` to "
                "the loss you pass to `manual_backward`."
            )
        if not trainer.strategy.restore_checkpoint_after_setup:
            self._build(trainer, pl_module)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Build the pruner if :meth:`setup` did not; hand it the optimizers and weights."""
        if not (self._session.built_for(pl_module) or self._session.waiting):
            self._build(trainer, pl_module)
        if self._session.built:
            self._session.start(trainer.optimizers)

    @override
    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        """Add the distillation term of this batch's forward to the loss about to be
        back-propagated, scaled as Lightning scaled the task loss (by ``1 /
        accumulate_grad_batches``, then by the precision plugin's loss scaler)."""
        if self._should_skip(trainer):
            return
        term = self._session.distilling.term(lambda kd: _scaled_like_loss(trainer, kd))
        if term is not None:
            # One backward of task + KD (DDP reduces once): Lightning hands callbacks the very
            # tensor it back-propagates next, made for it (divided, scaled), so adding in place
            # changes nothing the user holds.
            loss.add_(term.to(loss.dtype))

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """With attached optimizers, zero the pruned weights' gradients before clipping; add the
        final gradients to a gradient score (once per optimizer step); check that every
        distillation term reached the backward. A pruner waiting for the first training
        forward is built first (its step 0 taken)."""
        self._session.distilling.check_reached()
        self._build_after_first_forward(trainer)
        self._session.before_optimizer_step(optimizer)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Take step ``global_step`` (0 unless resumed): a schedule may prune before training
        (once built, if the pruner waits for the first training forward)."""
        if self._should_skip(trainer) or not self._session.built:
            return
        self._session.step(trainer.global_step, report_every=self._log_every(trainer))

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Take a pruning step if this batch ended with an optimizer step, and log. (A pruner
        waiting for the first training forward is built first, its step 0 taken.)"""
        if self._should_skip(trainer):
            return
        self._build_after_first_forward(trainer)
        prefix = self._metric_prefix(trainer)
        distill_loss = self._session.distilling.mean_value()
        if distill_loss is not None:
            pl_module.log(f"{prefix}distill_loss", distill_loss, on_step=True, on_epoch=False)
        if self._session.step(trainer.global_step, report_every=self._log_every(trainer)) is None:
            return
        for name, value in with_prefix(self._session.metrics(), prefix).items():
            # float64: Lightning turns a Python number into float32, exact only up to 2**24 units.
            value64 = torch.tensor(value, dtype=torch.float64)
            prog_bar = name == f"{prefix}sparsity"
            pl_module.log(name, value64, on_step=True, on_epoch=False, prog_bar=prog_bar)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Report the final sparsity; make the pruning permanent or shrink the model if asked
        (under ``ModelParallelStrategy``, by default to ``<default_root_dir>/shrunk``)."""
        self._session.finish(os.path.join(trainer.default_root_dir, "shrunk"))

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Fit failed (or was interrupted): take the run's hooks off the model and optimizers
        (the teacher's, the first-forward hook, the optimizer attachment), so that later
        forwards, in any loop, run as without the callback; the masks stay."""
        self._session.close()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Take the run's hooks off (as :meth:`on_exception`; after a fit that ended, nothing
        is left to take off)."""
        if stage == "fit":
            self._session.close()

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Once the model is shrunk, record its layout in the checkpoint (under
        ``"tensorplay_shrunk"``), for :class:`~tensorplay.callbacks.PrunableMixin` to rebuild
        before the weights load."""
        shapes = self._session.shrunk_shapes
        if shapes is not None:
            checkpoint[SHRUNK_KEY] = shapes.to_dict()
        teacher = self._session.distilling.sharded_teacher()
        if teacher is not None and getattr(trainer.strategy, "_save_distributed_checkpoint", False):
            add_teacher(checkpoint["state_dict"], teacher)  # each rank writes its shards

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """A distributed checkpoint with a sharded teacher: load it when distillation resumes."""
        load = teacher_loader(trainer.ckpt_path)
        if load is not None:
            self._session.distilling.load_teacher_with(load)

    @override
    def state_dict(self) -> dict[str, Any]:
        """The pruner's :meth:`~tensorplay.ao.pruning.pruner.Pruner.state_dict` (or ``{}``),
        with the teacher's weights under ``"distill_teacher"`` once the callback has taken it."""
        state = self._session.state_dict()
        teacher = self._session.distilling.teacher_state()
        if teacher is not None:
            state[TEACHER_KEY] = teacher
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the pruner's state (kept until it is built if early) and the teacher taken;
        tensorplay 0.1's callback state (``{"version": 1, "pruner", "seed", "snapshot"}``) is
        accepted."""
        state = dict(state_dict)
        teacher = state.pop(TEACHER_KEY, None)
        if teacher is not None:
            self._session.distilling.load_teacher_state(teacher)
        self._session.load_state_dict(state)

    def _metric_prefix(self, trainer: pl.Trainer) -> str:
        # Several callbacks in one trainer would log under the same names: each gets its own.
        pruning = [c for c in trainer.callbacks if isinstance(c, GradualPruning)]  # type: ignore[attr-defined]
        if self not in pruning:
            return PREFIX
        return metric_prefix(pruning.index(self), len(pruning))

    def _should_skip(self, trainer: pl.Trainer) -> bool:
        return trainer.sanity_checking or not trainer.training

    def _log_every(self, trainer: pl.Trainer) -> int:
        # Counting reads every mask; the counts change on pruning steps only (or by hand), so
        # between those they are re-read on the steps the loggers write, not on every step.
        return max(1, int(getattr(trainer, "log_every_n_steps", 1)))  # set by the Trainer

    def _check_disjoint(self, trainer: pl.Trainer, pruner: RunPruner) -> None:
        callbacks = list(trainer.callbacks)  # type: ignore[attr-defined]
        others = [
            (index, other.pruner)
            for index, other in enumerate(callbacks)
            if other is not self and isinstance(other, GradualPruning) and other.built
        ]
        check_disjoint(pruner, callbacks.index(self), others)

    def _build(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning loads the model's state before any callback's: the keys must match already
        # (a pruner that waits for the first forward needs PrunableMixin to resume).
        self._session.build_or_wait(
            pl_module,
            as_example_inputs(pl_module, pl_module.example_input_array),
            broadcast=lambda seed: int(trainer.strategy.broadcast(seed, 0)),
            check=lambda pruner: self._check_disjoint(trainer, pruner),
        )

    def _build_after_first_forward(self, trainer: pl.Trainer) -> None:
        built = self._session.build_from_first_forward(
            broadcast=lambda seed: int(trainer.strategy.broadcast(seed, 0)),
            check=lambda pruner: self._check_disjoint(trainer, pruner),
        )
        if built:
            self._session.start(trainer.optimizers)
            self._session.step(trainer.global_step, report_every=self._log_every(trainer))
