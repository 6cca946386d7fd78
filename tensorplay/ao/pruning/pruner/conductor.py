"""A stateful, framework-agnostic pruner: a schedule driving the exact selection.

The pruner is the conductor: it resolves its targets once, decides when a step prunes (the
schedule's pruning steps, none skipped, none twice), seeds random methods, rewinds, keeps the
history and reports. It delegates each other decision to one owner, asked, never string-tested:
the scope (:mod:`~tensorplay.ao.pruning.pruner.scopes`) turns the schedule's cumulative target into
counts over the units (``round(target * total) - already_pruned`` globally), the structure
(:mod:`~tensorplay.ao.pruning.structured.units`) says what a unit is and where its scores come from,
the masking mode (:mod:`~tensorplay.ao.pruning.masking`) holds the masks, and the importance
(:mod:`~tensorplay.ao.pruning.importance`) scores the units. Its dealings with optimizers
(attaching, gradient scores, gradient masks) are
:class:`~tensorplay.ao.pruning.pruner.optimizers.OptimizerLinks`'. Any training loop calls
``pruner.step()`` after ``optimizer.step()``; the framework callbacks are adapters over it. With
the model's state_dict, its :meth:`Pruner.state_dict` resumes a run exactly.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.schedules import CubicSchedule
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 10))
    >>> pruner = Pruner(model, CubicSchedule(final_sparsity=0.5, end_step=4))
    >>> for step in range(6):
    ...     # ... forward, backward, optimizer.step() ...
    ...     _ = pruner.step()
    >>> pruner.pruned_count(), pruner.total_count(), pruner.sparsity()
    (100, 200, 0.5)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from torch import Tensor, nn
from torch.optim import Optimizer

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.edits.spent import ShrinkWatch, SpentPrunerError
from tensorplay.ao.pruning.importance import Importance, make_importance
from tensorplay.ao.pruning.importance.target_scores import ImportanceFn, target_scores
from tensorplay.ao.pruning.masking import MaskingMode, masking_mode
from tensorplay.ao.pruning.masking.mode import check_shards
from tensorplay.ao.pruning.masking.stats import SparsityReport, TensorSparsity
from tensorplay.ao.pruning.pair import Pair
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.pruner.attached_optimizers import AttachedOptimizers
from tensorplay.ao.pruning.pruner.config import (
    AccumulatorDtype,
    Masking,
    PrunerConfig,
    Rewind,
    Scope,
    Structure,
    check_int,
    counts_itself,
)
from tensorplay.ao.pruning.pruner.optimizers import OptimizerLinks
from tensorplay.ao.pruning.pruner.rewind import copy_back, snapshot_due, snapshot_of
from tensorplay.ao.pruning.pruner.schedules import Schedule
from tensorplay.ao.pruning.pruner.scopes import make_scope
from tensorplay.ao.pruning.pruner.seeding import cuda_devices, seeded
from tensorplay.ao.pruning.pruner.selected_targets import resolve_targets
from tensorplay.ao.pruning.pruner.state import Progress, load_progress, state_dict
from tensorplay.ao.pruning.structured.units import PruningStructure, make_structure
from tensorplay.ao.pruning.structured.units.budget_target import BudgetReport, make_budget
from tensorplay.ao.pruning.structured.units.latency import LatencyTable
from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget
from tensorplay.ao.pruning.structured.units.structure import UnitScores
from tensorplay.ao.pruning.targets.parameters import KeepDense, ModuleType
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["PrunedStep", "Pruner"]

_FAR_STEP = 2**62  # any step after the schedule's last: its final target


class Pruner(OptimizerLinks):
    """Prune a model on a schedule from any training loop.

    Call :meth:`step` once per optimizer step (after ``optimizer.step()``); on the schedule's
    pruning steps it prunes the units still due, chosen by ``method`` across all targets or
    within each (``scope``). A tied parameter is one target (:attr:`aliases`), with one mask.

    Once :func:`~tensorplay.ao.pruning.shrink` has removed units from the model (or made the
    masks of any target permanent), the pruner is spent: its units, masks and counts are those
    of the model before. Every method that reads or changes the model through its targets then
    raises :class:`~tensorplay.ao.pruning.SpentPrunerError` (its record stays readable:
    :attr:`history`, :attr:`last_step`, :attr:`targets`, :meth:`target_sparsity`). Read
    :meth:`report` and save :meth:`state_dict` before shrinking; to prune or count the shrunk
    model, build a new pruner on it.

    Every argument but ``model``, ``importance_fn`` and ``optimizers`` is a field of
    :class:`~tensorplay.ao.pruning.pruner.config.PrunerConfig`, documented there (the Lightning
    callback takes the same).

    Args:
        model: The model to prune.
        importance_fn: ``(module, name) -> scores`` of the tensor's shape; the method ranks
            units by these instead of the tensor's current values.
        optimizers: Optimizers whose state (momentum, Adam moments) is cleared after each
            pruning step that pruned something (:attr:`optimizers` may be replaced later).
        example_inputs: With a ``structure`` of channels on a plain PyTorch model, the inputs
            of its forward (a tensor or a tuple of positional inputs) that tracing it takes
            (:mod:`~tensorplay.ao.pruning.structured.dependency.tracing`); Hugging Face families
            need none.

    Raises:
        TypeError, ValueError: As :class:`~tensorplay.ao.pruning.pruner.config.PrunerConfig`; also
        an
            ``importance_fn`` that is not callable, an unknown or empty selection, holders of a
            tied parameter not pruned alike, or targets the masking mode cannot hold; a
            ``structure`` the model has no units of, or a model it cannot analyse, naming the
            submodule (:mod:`~tensorplay.ao.pruning.structured.units`).

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        >>> pruner = Pruner(model, OneShotSchedule(0.5, step=2), scope="layerwise")
        >>> [pruner.step() for _ in range(4)]
        [0, 0, 16, 0]
        >>> [row.pruned for row in pruner.report().rows]
        [8, 8]

        Units of a structure (here the hidden channels of a traced model, each with its weight
        row, its bias and the next layer's input column):

        >>> import torch
        >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> channels = Pruner(mlp, OneShotSchedule(0.25), structure="channel",
        ...                   example_inputs=torch.randn(2, 4))
        >>> channels.step(), channels.total_count(), int((mlp[0].bias_mask == 0).sum())
        (2, 8, 2)
    """

    _pending: PrunedStep | None = None  # pruned by prune_step(), not finished yet

    @changes.atomic
    def __init__(
        self,
        model: nn.Module,
        schedule: Schedule,
        *,
        parameters: Sequence[str] | None = None,
        module_types: Sequence[ModuleType] | None = None,
        names: Sequence[str] | None = None,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        keep_dense: Sequence[KeepDense] = (),
        method: str | type[BasePruningMethod] = "l1_unstructured",
        importance_fn: ImportanceFn | None = None,
        scope: Scope = "global",
        min_density: float = 0.0,
        rewind: Rewind = "none",
        rewind_step: int = 0,
        seed: int | None = None,
        optimizers: Sequence[Optimizer] = (),
        masking: Masking = "reparametrize",
        importance: str = "magnitude",
        accumulator_dtype: AccumulatorDtype = "float32",
        structure: Structure | tuple[Structure, ...] = "element",
        multiple_of: int = 1,
        example_inputs: Tensor | tuple[Any, ...] | None = None,
        target_params: int | float | None = None,
        target_active_params: int | float | None = None,
        target_memory: MemoryBudget | None = None,
        target_latency: LatencyBudget | None = None,
    ) -> None:
        config = PrunerConfig(  # in the order of its fields
            *(schedule, parameters, module_types, names, include, exclude, keep_dense),
            *(method, scope, min_density, rewind, rewind_step, seed, masking),
            *(importance, accumulator_dtype, structure, multiple_of, target_params),
            *(target_active_params, target_memory, target_latency),
        )
        if importance_fn is not None and not callable(importance_fn):
            raise TypeError(
                f"Expected `importance_fn` to be callable or None, but got {importance_fn!r}."
            )
        if importance_fn is not None and importance != "magnitude":
            raise ValueError(
                f"Expected either `importance_fn` or `importance`, but got both (importance="
                f"{importance!r}): an importance_fn gives the scores itself."
            )
        self.config = config
        self.model = model
        self.importance_fn = importance_fn
        selected = resolve_targets(model, config)
        self._mode = masking_mode(config.masking)
        check_shards(self._mode, selected)  # before a structure records its units
        self._structure: PruningStructure = make_structure(
            config.structure, model, selected, example_inputs, config.multiple_of
        )
        self._targets = self._structure.targets
        self._scored_targets = self._structure.scored
        self._mode.check_targets(self._targets)
        self._budget = make_budget(model, config, self._structure, self._mode)
        self._shrink_watch = ShrinkWatch(pair for target in self._targets for pair in target.pairs)
        score = cast(str, config.importance)  # one name: only a searched run's is a mapping
        self._importance = make_importance(score, config.accumulator_dtype)
        self._importance.bind(self._scored_targets, self._structure.groups)
        self._optimizers = AttachedOptimizers(optimizers)
        self._progress = Progress(seed=config.seed)
        self._scope = make_scope(config.scope, config.min_density)
        self._check_reachable()
        if rewind == "init":
            self.take_snapshot()

    @property
    def schedule(self) -> Schedule:
        """The schedule (``config.schedule``)."""
        return self.config.schedule

    @property
    def method(self) -> type[BasePruningMethod]:
        """The pruning method's class (``config.method_class``)."""
        return self.config.method_class

    @property
    def scope(self) -> Scope:
        """``"global"``, ``"layerwise"`` or ``"row"`` (``config.scope``)."""
        return self.config.scope

    @property
    def structure(self) -> PruningStructure:
        """What a unit is (:mod:`~tensorplay.ao.pruning.structured.units`), chosen by
        ``config.structure``."""
        return self._structure

    @property
    def min_density(self) -> float:
        """The least fraction of each target kept (``config.min_density``)."""
        return float(self.config.min_density)

    @property
    def masking(self) -> Masking:
        """``"reparametrize"`` or ``"inplace"`` (``config.masking``)."""
        return self.config.masking

    @property
    def mode(self) -> MaskingMode:
        """How the masks are held (:mod:`~tensorplay.ao.pruning.masking`), chosen by ``masking``."""
        return self._mode

    @property
    def importance(self) -> Importance:
        """The importance score (:mod:`~tensorplay.ao.pruning.importance`), chosen by
        ``config.importance``; an ``importance_fn`` replaces its scores."""
        return self._importance

    @property
    def seed(self) -> int | None:
        """The seed in use: the configuration's, or the one a loaded state carried."""
        return self._progress.seed

    @property
    def last_step(self) -> int:
        """The last step taken (-1 before the first)."""
        return self._progress.last_step

    @property
    def last_pruned_step(self) -> int:
        """The last pruning step taken (-1 before the first): it is never pruned twice."""
        return self._progress.last_pruned_step

    @property
    def history(self) -> list[tuple[int, float, int]]:
        """``(step, target sparsity, units pruned)`` of each step that pruned something."""
        return self._progress.history

    @property
    def permanent(self) -> bool:
        """Whether :meth:`make_permanent` has been called."""
        return self._progress.permanent

    @property
    def targets(self) -> list[str]:
        """The canonical name of each target (the first of a tied parameter's names)."""
        return [target.name for target in self._targets]

    @property
    def pairs(self) -> list[Pair]:
        """The ``(module, name)`` of each of :attr:`targets` (:attr:`aliases`: every name)."""
        return [target.pair for target in self._targets]

    @property
    def aliases(self) -> dict[str, tuple[str, ...]]:
        """Every name of each target, by target: more than one for tied weights.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
            >>> model[1].weight = model[0].weight  # tied
            >>> Pruner(model, OneShotSchedule(0.5), parameters=["1.weight"]).aliases
            {'0.weight': ('0.weight', '1.weight')}
        """
        return {target.name: target.names for target in self._targets}

    def shared_targets(self, other: Pruner) -> list[str]:
        """The targets of ``other`` that are this pruner's too, each as its names joined by
        ``" = "``; two pruners of one model should share none.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
            >>> first = Pruner(model, OneShotSchedule(0.5))
            >>> first.shared_targets(Pruner(model, OneShotSchedule(0.9), parameters=["1.weight"]))
            ['1.weight']
        """
        if other.model is not self.model:
            return []
        mine = {id(target.parameter()) for target in self._targets}
        return [" = ".join(t.names) for t in other._targets if id(t.parameter()) in mine]

    @changes.atomic
    def apply_masks(self) -> None:
        """Zero the pruned entries of the targets' weights now (lean masks; the forward does it for
        the reparametrization), e.g. after an EMA or a dense state_dict was copied in.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 4)
            >>> pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
            >>> _ = pruner.step()
            >>> with torch.no_grad():
            ...     _ = model.weight.add_(1.0)
            >>> pruner.apply_masks()
            >>> int((model.weight == 0).sum())
            8
        """
        self._check_not_spent("apply_masks()")
        self._mode.apply_masks(self._targets)

    @changes.atomic
    def step(self, step: int | None = None) -> int:
        """Advance to ``step``: check the weights against the masks (the masking mode's
        :meth:`~tensorplay.ao.pruning.masking.mode.MaskingMode.check_weights`), take the rewind
        snapshot if due, and if a pruning step lies between the last step and ``step`` (``step``
        itself, or one the counter jumped over:
        :meth:`~tensorplay.ao.pruning.pruner.schedules.Schedule.latest_pruning_step`) prune to the
        schedule's target at ``step`` (seeded with ``seed + step``; :attr:`history` records
        ``step``), then rewind and reset the optimizers' state if it pruned something. No pruning
        step is skipped, and none is pruned twice.

        Args:
            step: The optimizer step just done; ``None`` for the last one plus 1 (0 at first).

        Returns:
            The number of units newly pruned (0 on other steps).

        Raises:
            RuntimeError: After :meth:`make_permanent`, or a rewind snapshot due and missing.
            SpentPrunerError: After :func:`~tensorplay.ao.pruning.shrink` changed a target
                (as every method that reads the targets; see the class).
            TypeError: ``step`` is not an int.
            ValueError: A negative ``step``, or scores the method rejects.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
            >>> pruner = Pruner(nn.Linear(10, 10), LinearSchedule(0.5, end_step=20, frequency=10))
            >>> [pruner.step(s) for s in (0, 5, 10, 10, 20, 30)]
            [0, 0, 25, 0, 25, 0]
            >>> every_other = Pruner(nn.Linear(10, 10), OneShotSchedule(0.5, step=5))
            >>> [every_other.step(s) for s in (0, 2, 4, 6, 8)], every_other.history
            ([0, 0, 0, 50, 0], [(6, 0.5, 50)])
        """
        return self.prune_step(step).finish()

    @changes.atomic
    def prune_step(self, step: int | None = None) -> PrunedStep:
        """The first half of :meth:`step`, which changes the masks alone: check ``step``, take
        the rewind snapshot if due, and prune to the schedule's target if a pruning step is due;
        :meth:`PrunedStep.finish` does the rest (records the step, resets the scores, rewinds,
        clears the optimizers' state). A conductor of several pruners prunes with every one
        before it finishes any, all inside one
        :func:`~tensorplay.ao.pruning.edits.changes.transaction`: a method that rejects one
        pruner's scores then leaves every pruner, and the model, as they were.

        Raises:
            As :meth:`step`; also a step pruned before and not finished.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> pruner = Pruner(nn.Linear(4, 2), OneShotSchedule(0.5))
            >>> pruned = pruner.prune_step()
            >>> pruned.units, pruner.last_step  # the masks are pruned, the step not yet taken
            (4, -1)
            >>> pruned.finish(), pruner.last_step, pruner.history
            (4, 0, [(0, 0.5, 4)])
        """
        step = self.check_step(step)
        if snapshot_due(self.config, step, self.last_step, self._progress.snapshot is not None):
            previous = self._progress.snapshot
            self.take_snapshot()
            changes.on_undo(functools.partial(setattr, self._progress, "snapshot", previous))
        pruned = PrunedStep(self, step, None, 0)
        if self._progress.pruning_due(self.schedule, step):
            target = self.schedule(step)
            devices = cuda_devices([target.parameter() for target in self._targets])
            with seeded(self.seed, step, devices):
                pruned = PrunedStep(self, step, target, self._prune_to(target, step))
        self._pending = pruned
        changes.on_undo(functools.partial(setattr, self, "_pending", None))
        return pruned

    def _finish_step(self, pruned: PrunedStep) -> int:
        """Take the step whose masks :meth:`prune_step` pruned (see :class:`PrunedStep`)."""
        if self._pending is not pruned:
            raise RuntimeError(
                f"Expected to finish the step {pruned.step} that prune_step() pruned once, but "
                "it is finished already."
            )
        self._pending = None
        if pruned.target is not None:
            self._progress.last_pruned_step = pruned.step
            self._importance.after_pruning()
            if pruned.units:
                self._progress.history.append((pruned.step, pruned.target, pruned.units))
                if self._progress.snapshot is not None:
                    self.rewind(self._progress.snapshot)
                self._optimizers.after_pruning()
        self._progress.last_step = pruned.step
        return pruned.units

    def check_step(self, step: int | None = None) -> int:
        """Raise what :meth:`step` would refuse ``step`` for, before it changes anything; the
        step it would take (``None``: the last one plus 1). A conductor of several pruners asks
        each before any of them steps, so that a refusal leaves none of them a step ahead.

        Raises:
            As :meth:`step`, but scores the method rejects (known only as it ranks them).

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> pruner = Pruner(nn.Linear(4, 4), OneShotSchedule(0.5))
            >>> pruner.check_step(), pruner.last_step
            (0, -1)
        """
        self._check_not_spent("step()")
        self._check_not_permanent("the reparametrization is gone, so nothing more can be pruned")
        if self._pending is not None:
            raise RuntimeError(
                f"Expected the step {self._pending.step} that prune_step() pruned to be finished "
                "(PrunedStep.finish()) before another step."
            )
        step = self.last_step + 1 if step is None else check_int("step", step, 0)
        pruning = self._progress.pruning_due(self.schedule, step)
        own = counts_itself(self.method)
        if pruning and self.importance_fn is None and (own or self.schedule(step) > 0):
            self._importance.check_ready(self._scored_targets)  # a target of 0 needs no scores
        attached = bool(self._optimizers.hooks)
        if pruning or not attached:
            self._mode.check_weights(self._targets, attached=attached)
        if pruning:
            self._mode.check_step(self._targets, self.method)
        return step

    def _check_reachable(self) -> None:
        """Refuse, when the pruner is built, a schedule whose final target its units can never
        reach (an expert layer left fewer than its ``top_k`` experts, a group below its floor):
        the step that would reach it refuses the same way, but only once the run got there."""
        schedule = self.config.schedule
        if self._budget is not None or counts_itself(self.method) or not schedule.has_target():
            return
        final = schedule(_FAR_STEP)
        if final > 0:
            space = self._structure.space(self._mode, self.method, self._scores, self._units)
            self._scope.check_target(space, final)

    def _prune_to(self, target: float, step: int) -> int:
        """Prune up to ``target`` sparsity as the scope ranks the units (a method that decides
        its own count: each target on its own); the units newly pruned."""
        if counts_itself(self.method):
            return self._structure.prune_own_count(self._mode, self.method, self._scores)
        if target <= 0:  # every count is 0 or less, in every scope: no scores needed
            return 0
        space = self._structure.space(self._mode, self.method, self._scores, self._units)
        if self._budget is not None:
            return self._budget.prune_to(space, target)
        return self._scope.prune_to(space, target, step)

    def _scores(self, targets: Sequence[Target]) -> list[Tensor]:
        return target_scores(targets, self.importance_fn, self._importance)

    @property
    def _units(self) -> UnitScores | None:
        """The importance's own unit scores (none with an ``importance_fn``: its element
        scores are reduced per unit)."""
        return None if self.importance_fn is not None else self._importance.unit_scores

    def target_sparsity(self, step: int | None = None) -> float:
        """The schedule's target at ``step`` (default: the last step taken).

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> Pruner(nn.Linear(2, 2), OneShotSchedule(0.5, step=3)).target_sparsity(7)
            0.5
        """
        return self.schedule(self.last_step if step is None else step)

    def pruned_count(self) -> int:
        """Units pruned over all targets, as the weights hold them (read now: exact whatever
        changed them; a lean weight trained back is not counted); with a ``structure`` of
        channels, heads or layers, the units of that kind masked in every slice.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> pruner = Pruner(nn.Linear(4, 2), OneShotSchedule(0.25))
            >>> _ = pruner.step()
            >>> pruner.pruned_count(), pruner.total_count(), pruner.sparsity()
            (2, 8, 0.25)
        """
        return sum(row.pruned for row in self._rows("pruned_count()"))

    def total_count(self) -> int:
        """Units over all targets (see :meth:`pruned_count`)."""
        return sum(row.numel for row in self._rows("total_count()"))

    def sparsity(self) -> float:
        """``pruned_count() / total_count()`` (see :meth:`pruned_count`)."""
        rows = self._rows("sparsity()")
        return sum(row.pruned for row in rows) / sum(row.numel for row in rows)

    def report(self) -> SparsityReport:
        """Per-target (with a structure of units: per-group) and global sparsity against the
        current target (none with a budget, which counts parameters or bytes, not units:
        :meth:`budget_report` says where the model stands); the first column says which
        (``tensor``, ``channel group``, ``head group``, ``layer group``), and a group's numbers
        count its units. Under the table, a line names the selected tensors that the structure
        leaves dense, if any (:mod:`~tensorplay.ao.pruning.structured.units.coverage`).

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> pruner = Pruner(nn.Linear(4, 2), OneShotSchedule(0.25))
            >>> _ = pruner.step()
            >>> print(pruner.report())
            tensor  shape   numel  pruned  sparsity
            weight  (2, 4)      8       2    25.00%
            total               8       2    25.00%  (target 25.00%)
            >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            >>> channels = Pruner(mlp, OneShotSchedule(0.25), structure="channel",
            ...                   example_inputs=torch.randn(2, 4))
            >>> _ = channels.step()
            >>> print(channels.report())  # the hidden channels of mlp[0], as one group
            channel group  shape  numel  pruned  sparsity
            0              (8,)       8       2    25.00%
            total                     8       2    25.00%  (target 25.00%)
        """
        rows = tuple(self._rows("report()"))
        target = None if self._budget is not None else self.target_sparsity()  # parameters
        return SparsityReport(rows, target, self._structure.row_label, self._structure.notes)

    def budget_report(self) -> BudgetReport:
        """The model :func:`~tensorplay.ao.pruning.shrink` would leave from the units pruned
        now, against the budgets (``target_params``, ``target_active_params``,
        ``target_memory``, ``target_latency``): its parameters always, its active parameters,
        memory and estimated latency (in seconds) where budgeted, each before pruning, as
        budgeted and after
        (:class:`~tensorplay.ao.pruning.structured.units.budget_target.BudgetReport`). Read it
        before shrinking (the pruner is spent after).

        Raises:
            ValueError: A pruner without a budget.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            >>> pruner = Pruner(mlp, OneShotSchedule(), structure="channel", target_params=40,
            ...                 example_inputs=torch.randn(2, 4))
            >>> _ = pruner.step()
            >>> print(pruner.budget_report())  # a channel is 7 parameters: 3 went
            measure     before  budget  after
            parameters      58      40     37
        """
        if self._budget is None:
            raise ValueError(
                "Expected a pruner with a budget (`target_params`, `target_active_params`, "
                "`target_memory` or `target_latency`) for budget_report(), but it prunes to the "
                "schedule's sparsity: read report()."
            )
        pruned = [row.pruned for row in self._rows("budget_report()")]
        return self._budget.report(pruned)

    def _rows(self, method: str) -> list[TensorSparsity]:
        """Per group of units, its size and pruned units as the weights hold them (once
        permanent, the zeros of the tensors themselves), read now (for ``method``)."""
        self._check_not_spent(method)
        return self._structure.rows(self._mode, permanent=self.permanent)

    @changes.atomic
    def reparametrize(self) -> None:
        """Give every target without a mask an all-kept one, so the state_dict keys are the same
        at every step and a resumed run loads its checkpoint strictly.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 2)
            >>> Pruner(model, OneShotSchedule(0.5, step=100)).reparametrize()
            >>> sorted(model.state_dict())
            ['bias', 'weight_mask', 'weight_orig']
            >>> lean = nn.Linear(4, 2)
            >>> Pruner(lean, OneShotSchedule(0.5, step=100), masking="inplace").reparametrize()
            >>> sorted(lean.state_dict()), lean.weight_mask.dtype
            (['bias', 'weight', 'weight_mask'], torch.bool)
        """
        self._check_not_spent("reparametrize()")
        self._mode.ensure_masks(self._targets)

    @changes.atomic
    def make_permanent(self) -> None:
        """Drop every target's mask, keeping its zeros (``+0.0``) and ties (``a.weight is
        b.weight``); the hooks of :meth:`attach` are taken off and pruning ends.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 2)
            >>> pruner = Pruner(model, OneShotSchedule(0.25))
            >>> _ = pruner.step()
            >>> pruner.make_permanent()
            >>> sorted(model.state_dict()), int((model.weight == 0).sum())
            (['bias', 'weight'], 2)
        """
        self._check_not_spent("make_permanent()")
        self._optimizers.remove_hooks()
        self._importance.close()
        self._mode.make_permanent(self._targets)
        self._progress.permanent = True
        self._progress.snapshot = None  # nothing is left to rewind

    def _check_not_permanent(self, why: str) -> None:
        if self.permanent:
            raise RuntimeError(
                "Expected a pruner whose pruning is not permanent, but make_permanent() was "
                f"called: {why}."
            )

    def _check_not_spent(self, method: str) -> None:
        """Refuse ``method`` once shrinking has spanned a target
        (:mod:`~tensorplay.ao.pruning.edits.spent`): the units, masks and shapes the pruner holds
        are
        those of the model before."""
        spanned = self._shrink_watch.spanned()
        if spanned is None:
            return
        target = next(target for target in self._targets if spanned in target.pairs)
        raise SpentPrunerError(
            f"Expected a pruner whose targets are as they were when it was made, but shrink() "
            f"has changed {target.label} ({target.name!r}) since: the pruner is spent, and "
            f"{method} would use the units, masks and counts of the model before shrinking. "
            "Read pruner.report() and save pruner.state_dict() before shrinking; to prune or "
            "count the shrunk model, build a new Pruner on it."
        )

    def snapshot(self) -> dict[str, Tensor]:
        """Clones of the targets' unpruned values, by target name (one per tied parameter).

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 2)
            >>> Pruner(model, OneShotSchedule(0.5)).snapshot()["weight"].equal(model.weight)
            True
        """
        self._check_not_spent("snapshot()")
        return snapshot_of(self._targets)

    def take_snapshot(self) -> None:
        """Keep the targets' current values as those rewinding restores: ``rewind="init"`` takes
        it when the pruner is made, ``"step"`` at ``rewind_step``; call this when the weights are
        replaced afterwards (pretrained weights loaded, DDP's broadcast), before pruning.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 2)
            >>> pruner = Pruner(model, OneShotSchedule(0.5), rewind="init")
            >>> with torch.no_grad():
            ...     _ = model.weight.fill_(1.0)  # e.g. pretrained weights loaded
            >>> pruner.take_snapshot()
            >>> _ = pruner.step()
            >>> model.weight_orig.unique().tolist()
            [1.0]
        """
        self._check_not_spent("take_snapshot()")
        self._progress.snapshot = self.snapshot()

    @changes.atomic
    def rewind(self, state: Mapping[str, Tensor]) -> None:
        """Copy ``state`` (values by target name or alias; others are left alone) into the targets'
        unpruned values, keeping the masks (lottery tickets). Lean masks keep no pruned values:
        ``state`` (e.g. the rewind snapshot) is then their only copy.

        Raises:
            RuntimeError: After :meth:`make_permanent`.
            TypeError, ValueError: As :func:`~tensorplay.ao.pruning.pruner.rewind.check_values`.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 2)
            >>> pruner = Pruner(model, OneShotSchedule(0.5))
            >>> initial = pruner.snapshot()
            >>> _ = pruner.step()
            >>> with torch.no_grad():
            ...     _ = model.weight_orig.add_(1.0)
            >>> pruner.rewind(initial)
            >>> model.weight.equal(initial["weight"] * model.weight_mask)
            True
        """
        self._check_not_spent("rewind()")
        self._check_not_permanent("there are no `_orig` parameters left to rewind")
        copy_back(self._targets, state, self._mode)

    def state_dict(self) -> dict[str, Any]:
        """The pruner's state: plain data by name and the rewind snapshot's tensors
        (:func:`~tensorplay.ao.pruning.pruner.state.state_dict` lists the keys). The schedule,
        method, scope, minimum density, rewinding and masking in it are informative only.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> state = Pruner(nn.Linear(4, 2), OneShotSchedule(0.5), seed=3).state_dict()
            >>> state["version"], state["targets"], state["method"], state["seed"]
            (5, ['weight'], 'l1_unstructured', 3)
        """
        self._check_not_spent("state_dict()")
        table = None if self._budget is None else self._budget.latency_table
        return state_dict(
            self._progress,
            self.config,
            self._targets,
            self._importance.state_dict(),
            None if table is None else table.to_dict(),  # a resumed run prices as this one
        )

    @changes.atomic
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore counters, history, seed and rewind snapshot from :meth:`state_dict` of any
        version (:mod:`~tensorplay.ao.pruning.pruner.state`); load the model's state_dict too
        (a fresh model: :func:`~tensorplay.ao.pruning.masking.restore.restore_pruning`). The pruner
        keeps its configuration, warning where the state's differs; the saved seed is taken.

        Raises:
            TypeError, ValueError: As :func:`~tensorplay.ao.pruning.pruner.state.load_progress`.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> first = Pruner(nn.Linear(4, 2), OneShotSchedule(0.5))
            >>> _ = first.step()
            >>> second = Pruner(nn.Linear(4, 2), OneShotSchedule(0.5))
            >>> second.load_state_dict(first.state_dict())
            >>> second.last_step, second.last_pruned_step
            (0, 0)
        """
        self._check_not_spent("load_state_dict()")
        progress = load_progress(state, self.config, self._targets, self.seed)
        saved, progress.latency_table = progress.latency_table, None  # the budget holds it
        if (
            saved is not None
            and self._budget is not None
            and self.config.target_latency is not None
        ):
            self._budget.use_latency_table(self.model, LatencyTable.from_dict(saved))
        self._importance.load_state_dict(progress.importance, self._targets)
        progress.importance = {}  # the score holds it now
        self._progress = progress


@dataclass(frozen=True)
class PrunedStep:
    """A step of a :class:`Pruner` whose masks are pruned and that is not taken yet
    (:meth:`Pruner.prune_step`): the pruner's step counter, history, scores, optimizers and
    rewinding are as they were until :meth:`finish`.

    Args:
        pruner: The pruner stepping.
        step: The step checked.
        target: The schedule's target at ``step``, if it is a pruning step; else ``None``.
        units: The units newly pruned.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> pruner = Pruner(nn.Linear(4, 2), OneShotSchedule(0.5, step=1))
        >>> pruner.prune_step()  # step 0 prunes nothing
        PrunedStep(step=0, target=None, units=0)
    """

    pruner: Pruner = field(repr=False)
    step: int
    target: float | None
    units: int

    def finish(self) -> int:
        """Take the step: the pruner records it, resets its scores where it pruned, rewinds
        and clears its optimizers' state where it pruned something; the units newly pruned.

        Raises:
            RuntimeError: The step is finished already.
        """
        return self.pruner._finish_step(self)
