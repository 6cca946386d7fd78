"""Gradual pruning while a Lightning ``Trainer`` fits: a thin adapter over the pruner.

:class:`GradualPruning` maps Lightning hooks to :class:`~tensorplay.ao.pruning.pruner.Pruner`
steps. All pruning decisions (which tensors, how many units, which units) belong to the pruner and
its schedule; the callback decides *when* (after optimizer steps, never during validation, test or
predict), logs what happened, keeps every rank's masks identical and carries the pruner's state in
Lightning checkpoints.

Steps are optimizer steps: the schedule is called with ``trainer.global_step``, ``0`` before the
first optimizer step (at ``on_train_start``) and ``k`` right after the ``k``-th one, so gradient
accumulation and manual optimization count correctly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from typing_extensions import override

from tensorplay.ao.pruning.aliases import alias_map
from tensorplay.ao.pruning.pruner import Pruner
from tensorplay.ao.pruning.schedules import Schedule
from tensorplay.ao.pruning.targets import (
    KeepDense,
    _check_selection_args,
    _owned_parameter,
    resolve_method,
)

__all__ = ["GradualPruning"]

Scope = Literal["global", "layerwise"]
Rewind = Literal["none", "init", "step"]

_SCOPES: tuple[str, ...] = ("global", "layerwise")
_REWINDS: tuple[str, ...] = ("none", "init", "step")
_STATE_VERSION = 1


class GradualPruning(Callback):
    r"""Prune a model on a sparsity schedule while it trains, and log its sparsity.

    After every optimizer step ``t`` the pruner brings the selected tensors to the schedule's
    cumulative target sparsity ``s_t``: exactly ``round(s_t * total) - already_pruned`` more units
    are pruned across all of them (``scope="global"``) or in each (``scope="layerwise"``).

    Logged after every optimizer step through
    :meth:`~lightning.pytorch.core.LightningModule.log`, so every logger and the progress bar
    receive them (Lightning files the values after optimizer step ``t`` under logger step
    ``t - 1``, the index of the batch that just ended, like that batch's training loss):

    * ``pruning/sparsity``: the fraction of the selected units that are pruned;
    * ``pruning/target_sparsity``: the schedule's target at this step;
    * ``pruning/pruned``: the number of pruned units (cumulative);
    * ``pruning/sparsity/<module>.<name>`` per tensor, with ``log_per_tensor=True``.

    Every selected tensor is reparametrized (``<name>_orig``, ``<name>_mask``) in :meth:`setup`,
    before any checkpoint is restored, so ``Trainer.fit(ckpt_path=...)`` loads the model strictly
    and resumes mid-schedule exactly where the interrupted run stopped. To load a pruned
    checkpoint into a fresh model with ``LightningModule.load_from_checkpoint``, give the module
    :class:`~tensorplay.callbacks.PrunableMixin`.

    Args:
        schedule: the cumulative target sparsity per optimizer step, e.g.
            :class:`~tensorplay.ao.pruning.schedules.CubicSchedule`.
        method: an unstructured pruning method: ``"l1_unstructured"``,
            ``"random_unstructured"``, a class name or an import path.
        parameters: the fully qualified tensors to prune (``["net.0.weight"]``); by default
            they are selected with ``module_types``, ``names``, ``include``, ``exclude`` and
            ``keep_dense`` (:func:`~tensorplay.ao.pruning.targets.select_parameters`).
        module_types: the module types whose parameters are pruned, by class name or import
            path; default
            :data:`~tensorplay.ao.pruning.targets.DEFAULT_MODULE_TYPES`: ``Linear``,
            ``Bilinear``, ``Conv1d/2d/3d``, ``ConvTranspose1d/2d/3d``, ``MultiheadAttention``
            and Hugging Face's ``Conv1D``.
        names: the parameter names pruned in those modules, e.g. ``[weight, bias]``; default
            :data:`~tensorplay.ao.pruning.targets.DEFAULT_NAMES` (``weight`` and the attention
            input projections ``in_proj_weight``...).
        include: regexes (``re.search``); a selected tensor's name matches at least one.
        exclude: regexes; a selected tensor's name matches none.
        keep_dense: any of ``embeddings`` (embedding weights and weights tied to them, such as
            a language model's head), ``first`` and ``last`` (the first and last selected
            module in registration order): left dense, as papers usually do.
        scope: ``"global"`` ranks units across all selected tensors, ``"layerwise"`` prunes
            each tensor to the target on its own.
        min_density: the fraction of each tensor's units that is never pruned, so no layer is
            pruned away whole.
        log_per_tensor: also log ``pruning/sparsity/<module>.<name>``.
        make_permanent: at the end of fit, drop ``_orig``, ``_mask`` and the hooks so the
            model is plain dense-with-zeros (checkpoints saved during fit keep the masks).
        rewind: after each pruning event that pruned something, reset the unpruned weights of
            the selected tensors to their values before training (``"init"``) or after optimizer
            step ``rewind_step`` (``"step"``): lottery tickets (Frankle & Carbin, 2019) and
            weight rewinding (Renda et al., 2020). Other parameters keep training.
        rewind_step: the optimizer step whose weights ``rewind="step"`` restores.
        reset_optimizer_state: after each pruning event that pruned something, clear the
            optimizers' per-parameter state (momentum, Adam moments), as when fine-tuning starts
            afresh.
        seed: the seed of random pruning methods; by default rank zero's ``torch.initial_seed()``
            (set by ``seed_everything``). Each pruning step draws from ``seed + step`` on every
            rank, so masks are identical across ranks and a resumed run draws what an
            uninterrupted one would.
        verbose: report each pruning event and the final sparsity table on rank zero.

    Every argument can be written in a LightningCLI config:

    .. code-block:: yaml

        trainer:
          callbacks:
            - class_path: tensorplay.callbacks.GradualPruning
              init_args:
                schedule:
                  class_path: tensorplay.ao.pruning.schedules.CubicSchedule
                  init_args: {final_sparsity: 0.9, end_step: 2000, frequency: 100}
                keep_dense: [embeddings, last]

    Notes:
        * Resuming (``ckpt_path``) needs a checkpoint saved with this callback: a dense
          checkpoint has ``<name>`` where the model now has ``<name>_orig``. To prune a
          pretrained dense model, load its weights first and fit without ``ckpt_path``.
        * With ``strategy="ddp_spawn"``, Lightning copies the trained weights back into the main
          process's model with ``strict=False``, which skips pruned tensors; use
          ``make_permanent=True`` or load the last checkpoint.
        * A later ``fit`` of the same model continues the schedule; a new model gets a new
          pruner.
        * Several ``GradualPruning`` callbacks may prune one model (different schedules for
          different layers) as long as they select disjoint tensors: a tensor selected by two
          of them (under any of its names, tied weights included) is an error at set-up.

    Raises:
        TypeError: if ``schedule`` is not a :class:`~tensorplay.ao.pruning.schedules.Schedule`.
        ValueError: if an argument is out of range, ``method`` is unknown or structured, a
            ``keep_dense`` entry is unknown, or ``parameters`` is given together with
            ``module_types``, ``names``, ``include``, ``exclude`` or ``keep_dense``.

    Example:
        >>> from tensorplay.ao.pruning.schedules import CubicSchedule
        >>> callback = GradualPruning(CubicSchedule(final_sparsity=0.8, end_step=1000))
        >>> callback.method, callback.scope
        ('l1_unstructured', 'global')
        >>> callback = GradualPruning(
        ...     CubicSchedule(final_sparsity=0.8, end_step=1000),
        ...     names=["weight", "bias"],
        ...     keep_dense=["embeddings", "last"],
        ... )
        >>> callback.names, callback.keep_dense
        (['weight', 'bias'], ['embeddings', 'last'])
        >>> # Trainer(callbacks=[callback]).fit(model)
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
    ) -> None:
        _check_args(schedule, method, parameters)
        # The core's checks, so a bad value fails here with the core's message.
        _check_selection_args(
            parameters,
            module_types=module_types,
            names=names,
            include=include,
            exclude=exclude,
            keep_dense=keep_dense,
        )
        _check_options(scope, min_density, rewind, rewind_step, seed)
        self.schedule = schedule
        self.method = method
        self.parameters = None if parameters is None else list(parameters)
        self.module_types = None if module_types is None else list(module_types)
        self.names = None if names is None else list(names)
        self.keep_dense: list[KeepDense] = list(keep_dense)
        self.include = None if include is None else list(include)
        self.exclude = None if exclude is None else list(exclude)
        self.scope: Scope = scope
        self.min_density = min_density
        self.log_per_tensor = log_per_tensor
        self.make_permanent = make_permanent
        self.rewind: Rewind = rewind
        self.rewind_step = rewind_step
        self.reset_optimizer_state = reset_optimizer_state
        self.seed = seed
        self.verbose = verbose
        self._pruner: Pruner | None = None
        self._seed = 0  # resolved in setup
        self._snapshot: dict[str, Tensor] | None = None
        self._pending_state: dict[str, Any] | None = None

    @property
    @override
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint; differs between configurations."""
        # names and keep_dense only when set: the keys of checkpoints written before they existed
        # stay valid.
        extra: dict[str, Any] = {}
        if self.names is not None:
            extra["names"] = self.names
        if self.keep_dense:
            extra["keep_dense"] = self.keep_dense
        return self._generate_state_key(
            schedule=_schedule_key(self.schedule),
            method=self.method,
            parameters=self.parameters,
            module_types=self.module_types,
            include=self.include,
            exclude=self.exclude,
            **extra,
        )

    @property
    def pruner(self) -> Pruner:
        """The pruner built in :meth:`setup`.

        Raises:
            RuntimeError: before :meth:`setup` has run.
        """
        if self._pruner is None:
            raise RuntimeError("`GradualPruning.pruner` exists once `Trainer.fit` has set it up.")
        return self._pruner

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Build the pruner and reparametrize its tensors, before any checkpoint is restored."""
        if stage != "fit" or (self._pruner is not None and self._pruner.model is pl_module):
            return
        self._build(trainer, pl_module)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Take step ``global_step`` (0 unless resumed): a schedule may prune before training."""
        if self._should_skip(trainer):
            return
        self._on_optimizer_step(trainer, pl_module, log=False)

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Take a pruning step if this batch ended with an optimizer step."""
        if self._should_skip(trainer) or trainer.global_step == self.pruner.last_step:
            return
        self._on_optimizer_step(trainer, pl_module, log=True)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Report the final sparsity; make the pruning permanent if asked."""
        if self._pruner is None:
            return
        self._finish(trainer)

    @override
    def state_dict(self) -> dict[str, Any]:
        """The pruner's state, the random seed and the rewind snapshot: plain data and tensors.

        Returns:
            ``{"version", "pruner", "seed", "snapshot"}``; empty before :meth:`setup`.
        """
        if self._pruner is None:
            return {}
        return {
            "version": _STATE_VERSION,
            "pruner": self._pruner.state_dict(),
            "seed": self._seed,
            "snapshot": self._snapshot,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state saved by :meth:`state_dict` (kept until :meth:`setup` if early).

        Raises:
            ValueError: if the state has an unknown version.
        """
        if state_dict and state_dict.get("version") != _STATE_VERSION:
            raise ValueError(
                f"Expected `GradualPruning` state version {_STATE_VERSION}, but got "
                f"{state_dict.get('version')!r}."
            )
        self._pending_state = state_dict or None
        if self._pruner is not None:
            self._load_pending()

    def _should_skip(self, trainer: pl.Trainer) -> bool:
        return trainer.sanity_checking or not trainer.training

    def _build(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pruner = Pruner(
            pl_module,
            self.schedule,
            parameters=self.parameters,
            module_types=self.module_types,
            names=self.names,
            include=self.include,
            exclude=self.exclude,
            keep_dense=self.keep_dense,
            method=self.method,
            scope=self.scope,
            min_density=self.min_density,
        )
        _check_disjoint(trainer, self, pruner)
        self._pruner = pruner
        self._snapshot = None
        # Lightning loads the model's state before any callback's: the keys must match already.
        self._pruner.reparametrize()
        # Rank zero's seed on every rank: random methods then draw the same masks everywhere.
        seed = torch.initial_seed() if self.seed is None else self.seed
        self._seed = int(trainer.strategy.broadcast(seed, src=0))
        self._load_pending()

    def _load_pending(self) -> None:
        state, self._pending_state = self._pending_state, None
        if state is None:
            return
        self.pruner.load_state_dict(state["pruner"])
        self._seed = state["seed"]
        self._snapshot = state["snapshot"]

    def _on_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, log: bool
    ) -> None:
        step = trainer.global_step
        self._take_snapshot(step)
        pruned = self._prune(step, pl_module.device)
        if pruned > 0:
            self._after_pruning(trainer, step, pruned)
        if log:
            self._log(pl_module)

    def _take_snapshot(self, step: int) -> None:
        rewind_step = 0 if self.rewind == "init" else self.rewind_step
        if self.rewind == "none" or self._snapshot is not None or step < rewind_step:
            return
        if step > rewind_step:
            raise RuntimeError(
                f"Expected the rewind snapshot of step {rewind_step} in the checkpoint, but it "
                f"has none and training resumed at step {step}."
            )
        self._snapshot = self.pruner.snapshot()

    def _prune(self, step: int, device: torch.device) -> int:
        if not self.schedule.should_prune(step):
            return self.pruner.step(step)
        with _seeded((self._seed + step) % 2**64, device):
            return self.pruner.step(step)

    def _after_pruning(self, trainer: pl.Trainer, step: int, pruned: int) -> None:
        if self._snapshot is not None:
            self.pruner.rewind(self._snapshot)
        if self.reset_optimizer_state:
            for optimizer in trainer.optimizers:
                optimizer.state.clear()
        if self.verbose:
            rank_zero_info(
                f"GradualPruning: step {step}: pruned {pruned} more units, sparsity "
                f"{self.pruner.sparsity():.4f} (target {self.pruner.target_sparsity(step):.4f})."
            )

    def _log(self, pl_module: pl.LightningModule) -> None:
        # Masks are identical on every rank (same weights after DDP's all-reduce, same seed for
        # random methods), so these values need no reduction across ranks: no torchmetrics, no
        # sync_dist; rank zero's logger writes the same numbers every rank holds.
        pruner = self.pruner
        metrics = {
            "pruning/sparsity": pruner.sparsity(),
            "pruning/target_sparsity": pruner.target_sparsity(),
            "pruning/pruned": float(pruner.pruned_count()),
        }
        if self.log_per_tensor:
            metrics.update(
                {f"pruning/sparsity/{row.name}": row.sparsity for row in pruner.report().rows}
            )
        for name, value in metrics.items():
            # float64: Lightning turns a Python number into float32, exact only up to 2**24 units.
            pl_module.log(
                name,
                torch.tensor(value, dtype=torch.float64),
                on_step=True,
                on_epoch=False,
                prog_bar=name == "pruning/sparsity",
            )

    def _finish(self, trainer: pl.Trainer) -> None:
        if self.verbose:
            rank_zero_info(f"GradualPruning: final sparsity\n{self.pruner.report()}")
        if self.make_permanent:
            self.pruner.make_permanent()


def _schedule_key(schedule: Schedule) -> object:
    # to_dict names a function by import path, stable across processes unlike its repr; a lambda
    # has no such name (and no checkpoint either), so its repr is the best key there is.
    try:
        return schedule.to_dict()
    except ValueError:
        return repr(schedule)


@contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    # Seed a forked RNG so pruning draws neither disturb nor depend on the training RNG stream.
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _check_args(schedule: object, method: str, parameters: list[str] | None) -> None:
    if not isinstance(schedule, Schedule):
        raise TypeError(f"Expected `schedule` to be a Schedule, but got {schedule!r}.")
    resolve_method(method)  # unknown or structured methods fail here, naming `method`
    if parameters is not None and not parameters:
        raise ValueError(
            f"Expected `parameters` to name at least one tensor, but got {parameters!r}."
        )


def _check_options(
    scope: str, min_density: float, rewind: str, rewind_step: int, seed: int | None
) -> None:
    if scope not in _SCOPES:
        raise ValueError(f"Expected `scope` to be one of {_SCOPES}, but got {scope!r}.")
    if not 0.0 <= min_density < 1.0:
        raise ValueError(f"Expected `min_density` to be a float in [0, 1), but got {min_density}.")
    if rewind not in _REWINDS:
        raise ValueError(f"Expected `rewind` to be one of {_REWINDS}, but got {rewind!r}.")
    if isinstance(rewind_step, bool) or not isinstance(rewind_step, int) or rewind_step < 0:
        raise ValueError(
            f"Expected `rewind_step` to be a non-negative int, but got {rewind_step!r}."
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"Expected `seed` to be a non-negative int or None, but got {seed!r}.")


def _check_disjoint(trainer: pl.Trainer, callback: GradualPruning, pruner: Pruner) -> None:
    """Refuse a pruner whose tensors another ``GradualPruning`` of this model already prunes.

    Raises:
        ValueError: naming both callbacks by their index in ``trainer.callbacks`` and every
            shared tensor with all its names.
    """
    callbacks = list(trainer.callbacks)  # type: ignore[attr-defined]
    mine = {id(_owned_parameter(module, name)) for module, name in pruner.pairs}
    for index, other in enumerate(callbacks):
        if other is callback or not isinstance(other, GradualPruning):
            continue
        if other._pruner is None or other._pruner.model is not pruner.model:
            continue
        shared = [
            name
            for name, (module, key) in zip(other._pruner.targets, other._pruner.pairs, strict=True)
            if id(_owned_parameter(module, key)) in mine
        ]
        if shared:
            groups = alias_map(pruner.model)
            described = [" = ".join(groups[name].names) for name in shared]
            raise ValueError(
                "Expected GradualPruning callbacks to prune disjoint tensors, but "
                f"trainer.callbacks[{callbacks.index(callback)}] and trainer.callbacks[{index}] "
                f"both select {described}. Give each callback its own `parameters`, or "
                "`include`/`exclude` patterns that do not overlap."
            )
