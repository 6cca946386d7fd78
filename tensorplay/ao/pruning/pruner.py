"""A stateful, framework-agnostic pruner: a schedule driving ``global_unstructured``.

The pruner owns every pruning decision: the selected tensors (by name), the pruning method, the
schedule, the step counter, rewinding (lottery tickets) with its snapshot, the seed of random
methods and the reset of optimizer state. Each :meth:`Pruner.step` on a pruning step turns the
schedule's cumulative target into the exact number of units still to prune,
``round(target * total) - already_pruned``, and prunes them. Its :meth:`Pruner.state_dict` is
plain data by name plus the snapshot's tensors; together with the model's own state_dict (which
carries every ``<name>_orig`` and ``<name>_mask``) a resumed run continues exactly where it
stopped and never prunes a step twice. Any training loop gets all of it by calling
``pruner.step()`` after ``optimizer.step()``; the Lightning callback is an adapter over it.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.schedules import CubicSchedule
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

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from tensorplay.ao.pruning.amount import caps_under, global_count, layerwise_counts
from tensorplay.ao.pruning.attached_optimizers import AttachedOptimizers
from tensorplay.ao.pruning.base import BasePruningMethod
from tensorplay.ao.pruning.config import (
    Masking,
    PrunerConfig,
    Rewind,
    Scope,
    check_int,
    counts_itself,
)
from tensorplay.ao.pruning.masking import MaskingMode, masking_mode
from tensorplay.ao.pruning.masking.optimizer_hooks import OptimizerAttachment
from tensorplay.ao.pruning.pruner_state import Progress, load_progress, state_dict
from tensorplay.ao.pruning.rewind import copy_back, snapshot_of
from tensorplay.ao.pruning.schedules import Schedule
from tensorplay.ao.pruning.scores import ImportanceFn, target_scores
from tensorplay.ao.pruning.sharded import global_zeros
from tensorplay.ao.pruning.stats import SparsityReport, TensorSparsity
from tensorplay.ao.pruning.targets import KeepDense, ModuleType
from tensorplay.ao.pruning.tied_targets import Pair, resolve_targets

__all__ = ["Pruner"]


class Pruner:
    """Prune a model on a schedule from any training loop.

    Call :meth:`step` once per optimizer step (after ``optimizer.step()``). On the schedule's
    pruning steps it prunes ``round(target * total) - already_pruned`` more units, chosen by
    ``method`` across all targets (``scope="global"``) or within each target on its own
    (``scope="layerwise"``, every tensor pruned to the target).

    A parameter reached under several names (tied weights: an embedding and the LM head, a
    layer shared between blocks) is one target: naming any of its names, or several, selects it
    once, under its first name in module order (see :attr:`aliases`); it is counted once, and
    every module that holds it gets one shared mask, so all of them compute with the masked
    weight. :meth:`make_permanent` ties the modules to the one parameter again.

    Args:
        model: The model to prune.
        schedule: Step to cumulative target sparsity; see
            :mod:`tensorplay.ao.pruning.schedules`.
        parameters: Fully qualified names of the tensors to prune, e.g. ``["fc1.weight"]``;
            default: those :func:`~tensorplay.ao.pruning.targets.select_parameters` selects
            with the five arguments below (the weights of every Linear, Conv, attention and
            Hugging Face ``Conv1D`` layer). Give either ``parameters`` or those.
        module_types: Module classes, class names or import paths whose parameters are
            selected; default :data:`~tensorplay.ao.pruning.targets.DEFAULT_MODULE_TYPES`.
        names: Parameter names inside those modules, e.g. ``["weight", "bias"]``; default
            :data:`~tensorplay.ao.pruning.targets.DEFAULT_NAMES`.
        include: Regexes (``re.search``) a selected name matches at least one of.
        exclude: Regexes a selected name matches none of.
        keep_dense: Any of ``"embeddings"``, ``"first"``, ``"last"``: leave the embeddings (and
            weights tied to them), the first or the last selected module dense.
        method: An unstructured pruning method: a class, a name (``"l1_unstructured"``,
            ``"random_unstructured"``) or an import path. A method whose constructor takes no
            ``amount`` (an N:M method, say) decides its own count: on each pruning step it is
            applied to every target on its own, its ``compute_mask`` given the scores and the
            current mask, and the schedule's target is not used; the exact count is then the
            method's contract, not the pruner's.
        importance_fn: ``(module, name) -> scores`` of the tensor's shape; the method ranks
            units by these instead of the tensor's current values.
        scope: ``"global"`` ranks all targets together, ``"layerwise"`` each on its own.
        min_density: No target is pruned below this fraction of its units kept, in [0, 1). When
            the caps bind, the units a capped tensor cannot give up are taken from the others,
            still lowest score first; if all are capped, fewer units are pruned than asked.
        rewind: After each pruning step that pruned something, reset the unpruned values of the
            targets (lottery tickets, Frankle & Carbin 2019; weight rewinding, Renda et al.
            2020) to their values when the pruner was made (``"init"``) or right after
            :meth:`step` ``rewind_step`` (``"step"``, snapshot taken before that step prunes).
            Other parameters keep training. ``"none"``: no rewinding.
        rewind_step: The step whose values ``rewind="step"`` restores.
        seed: Seed of each pruning step's random draws: step ``t`` draws from ``seed + t`` in a
            forked RNG that neither disturbs nor depends on the training RNG, so masks of
            random methods are the same on every rank and after a resume. ``None``: draw from
            the global RNG.
        optimizers: Optimizers whose per-parameter state (momentum, Adam moments) is cleared
            after each pruning step that pruned something, so training resumes as if fresh; kept
            in :attr:`optimizers`, which may be replaced (e.g. once a framework has made them).
        masking: ``"reparametrize"`` (torch's ``<name>_orig``/float ``<name>_mask``/forward
            hook; state_dicts move to and from ``torch.nn.utils.prune``) or ``"inplace"``: lean
            masks, a bool ``<name>_mask`` buffer per target and the pruned weights zeroed in
            place (:mod:`~tensorplay.ao.pruning.masking.lean_masks`); call :meth:`attach` with the
            optimizers to keep them zero. Pruned values are then gone once pruned; rewinding
            restores from its own snapshot. See :ref:`lean-masks`. Models sharded with FSDP2
            (``DTensor`` parameters) need ``"inplace"``: masks are then sharded like the
            weights, the selection is exact across ranks, and counts and reports are global
            (collectives: call them on every rank); see :mod:`~tensorplay.ao.pruning.sharded`.

    Raises:
        TypeError: ``schedule`` is not a :class:`~tensorplay.ao.pruning.schedules.Schedule`,
            ``importance_fn`` is not callable, or another argument has the wrong type
            (:class:`~tensorplay.ao.pruning.config.PrunerConfig` checks them all).
        ValueError: An unknown ``scope`` or ``rewind``, ``min_density`` outside [0, 1), an empty
            or unknown selection, ``parameters`` together with a selection argument, holders of
            one tied parameter that are not pruned alike, or a method that is not unstructured.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        >>> pruner = Pruner(model, OneShotSchedule(0.5, step=2), scope="layerwise")
        >>> [pruner.step() for _ in range(4)]
        [0, 0, 16, 0]
        >>> [row.pruned for row in pruner.report().rows]
        [8, 8]
    """

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
    ) -> None:
        config = PrunerConfig(
            schedule,
            parameters=parameters,
            module_types=module_types,
            names=names,
            include=include,
            exclude=exclude,
            keep_dense=keep_dense,
            method=method,
            scope=scope,
            min_density=min_density,
            rewind=rewind,
            rewind_step=rewind_step,
            seed=seed,
            masking=masking,
        )
        if importance_fn is not None and not callable(importance_fn):
            raise TypeError(
                f"Expected `importance_fn` to be callable or None, but got {importance_fn!r}."
            )
        targets = resolve_targets(model, config)
        mode = masking_mode(config.masking)
        mode.check_targets(targets)
        self.config = config
        self.model = model
        self.importance_fn = importance_fn
        self._targets = targets
        self._mode = mode
        self._optimizers = AttachedOptimizers(optimizers)
        self._progress = Progress(seed=config.seed)
        if rewind == "init":
            self.take_snapshot()

    # -- configuration and progress, read-only ---------------------------------------------

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
        """``"global"`` or ``"layerwise"`` (``config.scope``)."""
        return self.config.scope

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
    def optimizers(self) -> list[Optimizer]:
        """Optimizers whose state is cleared after each pruning step that pruned something;
        may be replaced (e.g. once a framework has made them)."""
        return self._optimizers.reset

    @optimizers.setter
    def optimizers(self, optimizers: Sequence[Optimizer]) -> None:
        self._optimizers.reset = list(optimizers)

    @property
    def targets(self) -> list[str]:
        """The canonical name of each target (the first of a tied parameter's names)."""
        return [target.name for target in self._targets]

    @property
    def pairs(self) -> list[Pair]:
        """The ``(module, name)`` pair of each target's canonical name, in the order of
        :attr:`targets`; :attr:`aliases` has every pair."""
        return [target.pair for target in self._targets]

    @property
    def aliases(self) -> dict[str, tuple[str, ...]]:
        """Every name of each target, by target: more than one for tied weights.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
            >>> model[1].weight = model[0].weight  # tied
            >>> Pruner(model, OneShotSchedule(0.5), parameters=["1.weight"]).aliases
            {'0.weight': ('0.weight', '1.weight')}
        """
        return {target.name: target.names for target in self._targets}

    def shared_targets(self, other: Pruner) -> list[str]:
        """The targets of ``other`` that are targets of this pruner too (one parameter under any
        of its names), each as all its names joined by ``" = "``; two pruners of one model
        should share none.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
            >>> first = Pruner(model, OneShotSchedule(0.5))
            >>> first.shared_targets(Pruner(model, OneShotSchedule(0.9), parameters=["1.weight"]))
            ['1.weight']
        """
        if other.model is not self.model:
            return []
        mine = {id(target.parameter()) for target in self._targets}
        return [" = ".join(t.names) for t in other._targets if id(t.parameter()) in mine]

    # -- optimizers ------------------------------------------------------------------------

    def attach(self, *optimizers: Optimizer, mask_gradients: bool = True) -> OptimizerAttachment:
        """Keep the pruned weights zero through every step of ``optimizers`` (lean mode).

        Each optimizer gets a step pre-hook that masks the gradients of the targets it holds
        (if ``mask_gradients``; skipped when :meth:`mask_gradients` ran since its last step) and
        a step post-hook that zeroes the pruned weights again, skipped for the optimizers
        whose step provably keeps them zero (SGD, Adam, AdamW:
        :func:`~tensorplay.ao.pruning.masking.optimizer_hooks.keeps_zeros`). For that, each
        pruning step also zeroes the pruned entries of their per-parameter state (momentum,
        Adam moments), as does loading their state_dict. Pruned weights are invisible to the
        forward of the reparametrization mode, so this changes nothing it would compute, only
        the optimizer's state_dict.

        Args:
            *optimizers: ``torch.optim.Optimizer`` instances, each holding at least one target.
            mask_gradients: Whether the pre-step hook masks the gradients; ``False`` when the
                loop calls :meth:`mask_gradients` itself before every step (e.g. before
                gradient clipping, as the Lightning callback does).

        Returns:
            A handle whose ``remove()`` takes the hooks off again.

        Raises:
            ValueError: The pruner's masking is not ``"inplace"``, no optimizer is given, one
                holds no target, or is attached already.
            TypeError: An argument that is not an optimizer, or a ``mask_gradients`` that is not
                a bool.
            RuntimeError: After :meth:`make_permanent`.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> model = nn.Linear(8, 8)
            >>> pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
            >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            >>> handle = pruner.attach(optimizer)
            >>> _ = pruner.step()
            >>> model(torch.randn(4, 8)).sum().backward()
            >>> optimizer.step()
            >>> int((model.weight == 0).sum())
            32
            >>> handle.remove()
        """
        self._mode.check_attach()
        self._check_not_permanent("the masks are gone")

        def held(optimizer: Optimizer) -> Any:
            params = {id(p) for group in optimizer.param_groups for p in group["params"]}
            mine = [t for t in self._targets if id(t.parameter()) in params]
            return (lambda: self._mode.masked(mine)) if mine else None

        return self._optimizers.attach(
            optimizers, held, self._mode.optimizer_hooks, mask_gradients, self.targets
        )

    def mask_gradients(self) -> None:
        """Zero the pruned entries of the targets' gradients now (lean mode: one fused pass).

        Call it after the backward pass and before gradient clipping or grad-norm logging in a
        hand-written loop; the pre-step hook of :meth:`attach` then skips its own pass. With
        ``masking="reparametrize"`` (autograd masks the gradients already) or before any
        pruning it does nothing.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 4)
            >>> pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
            >>> _ = pruner.step()
            >>> model(torch.randn(2, 4)).sum().backward()
            >>> pruner.mask_gradients()
            >>> bool((model.weight.grad[~model.weight_mask] == 0).all())
            True
        """
        self._mode.mask_gradients(self._targets)
        self._optimizers.gradients_masked += 1

    def apply_masks(self) -> None:
        """Zero the pruned entries of the targets' weights now (lean mode; one fused pass).

        For loops without :meth:`attach`, or after the weights were changed by other means (a
        dense state_dict loaded, an EMA copied in). Does nothing with
        ``masking="reparametrize"``, whose forward applies the masks.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 4)
            >>> pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
            >>> _ = pruner.step()
            >>> with torch.no_grad():
            ...     _ = model.weight.add_(1.0)
            >>> pruner.apply_masks()
            >>> int((model.weight == 0).sum())
            8
        """
        self._mode.apply_masks(self._targets)

    # -- stepping --------------------------------------------------------------------------

    def step(self, step: int | None = None) -> int:
        """Advance to ``step`` and prune if it is a pruning step not pruned before.

        In order: take the rewind snapshot if ``step`` is ``rewind_step``; on a pruning step,
        prune (seeded with ``seed + step`` if a seed is set); if that pruned something, rewind
        the targets to the snapshot and clear the optimizers' state.

        Args:
            step: The optimizer step just done; ``None`` for the last one plus 1 (0 at first).

        Returns:
            The number of units newly pruned (0 on other steps).

        Raises:
            RuntimeError: After :meth:`make_permanent`, or with ``rewind="step"`` when a step
                after ``rewind_step`` comes before its snapshot was taken or loaded.
            TypeError: ``step`` is not an int.
            ValueError: A negative ``step``, or scores the method rejects.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import LinearSchedule
            >>> pruner = Pruner(nn.Linear(10, 10), LinearSchedule(0.5, end_step=20, frequency=10))
            >>> [pruner.step(s) for s in (0, 5, 10, 10, 20, 30)]
            [0, 0, 25, 0, 25, 0]
        """
        self._check_not_permanent("the reparametrization is gone, so nothing more can be pruned")
        step = self.last_step + 1 if step is None else check_int("step", step, 0)
        pruning = self.schedule.should_prune(step) and step > self.last_pruned_step
        attached = bool(self._optimizers.hooks)
        if pruning or not attached:
            self._mode.check_weights(self._targets, attached=attached)
        self._take_snapshot(step)
        newly_pruned = 0
        if pruning:
            self._mode.check_step(self._targets, self.method)
            target = self.schedule(step)
            with self._seeded(step):
                newly_pruned = (
                    self._prune_own_count()
                    if counts_itself(self.method)
                    else (self._prune_to(target))
                )
            self._progress.last_pruned_step = step
            if newly_pruned:
                self._progress.history.append((step, target, newly_pruned))
                if self._progress.snapshot is not None:
                    self.rewind(self._progress.snapshot)
                self._optimizers.after_pruning()
        self._progress.last_step = step
        return newly_pruned

    def _take_snapshot(self, step: int) -> None:
        """Snapshot at ``rewind_step``; refuse to go on without one once it is due."""
        config = self.config
        if config.rewind == "none" or self._progress.snapshot is not None:
            return
        if config.rewind == "step" and step <= config.rewind_step:
            if step == config.rewind_step:
                self.take_snapshot()
            return
        due = "the initial values" if config.rewind == "init" else f"step {config.rewind_step}"
        raise RuntimeError(
            f"Expected the rewind snapshot of {due} to be taken or loaded with "
            f"load_state_dict(), but the pruner has none at step {step}."
        )

    @contextmanager
    def _seeded(self, step: int) -> Iterator[None]:
        """Draw from ``seed + step`` in a forked RNG (CPU and the targets' CUDA devices)."""
        if self.seed is None:
            yield
            return
        params = [target.parameter() for target in self._targets]
        devices = {p.device.index or 0 for p in params if p.device.type == "cuda"}
        with torch.random.fork_rng(devices=sorted(devices)):
            torch.manual_seed((self.seed + step) % 2**64)
            yield

    def _prune_own_count(self) -> int:
        """Apply a method that decides its own count to each target on its own; the units
        already pruned stay pruned."""
        before = sum(self._masked_counts())
        self._mode.prune_own_count(self._targets, self._scores(), self.method)
        return sum(self._masked_counts()) - before

    def _prune_to(self, target: float) -> int:
        """Prune up to ``target`` sparsity; return the number of units newly pruned."""
        pruned, numels = self._masked_counts(), self._numels()
        caps = caps_under(self.min_density, pruned, numels)
        if self.scope == "layerwise":
            counts = layerwise_counts(target, pruned, numels, caps)
            scores = self._scores()
            for one, score, count in zip(self._targets, scores, counts, strict=True):
                if count > 0:
                    self._mode.prune([one], [score], self.method, count, None)
            return sum(self._masked_counts()) - sum(pruned)
        limits = caps if self.min_density > 0 else None
        count = global_count(target, pruned, numels, limits)
        if count <= 0:
            return 0
        self._mode.prune(self._targets, self._scores(), self.method, count, limits)
        return sum(self._masked_counts()) - sum(pruned)

    def _scores(self) -> list[Tensor]:
        return target_scores(self._targets, self.importance_fn)

    # -- counts and reports ----------------------------------------------------------------

    def target_sparsity(self, step: int | None = None) -> float:
        """The schedule's target at ``step`` (default: the last step taken).

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> Pruner(nn.Linear(2, 2), OneShotSchedule(0.5, step=3)).target_sparsity(7)
            0.5
        """
        return self.schedule(self.last_step if step is None else step)

    def pruned_count(self) -> int:
        """Units masked out over all targets (a target not yet pruned counts 0).

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> pruner = Pruner(nn.Linear(4, 2), OneShotSchedule(0.25))
            >>> _ = pruner.step()
            >>> pruner.pruned_count()
            2
        """
        return sum(self._pruned_counts())

    def total_count(self) -> int:
        """Units over all targets.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> Pruner(nn.Linear(4, 2), OneShotSchedule(0.25)).total_count()
            8
        """
        return sum(self._numels())

    def sparsity(self) -> float:
        """``pruned_count() / total_count()``.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> pruner = Pruner(nn.Linear(4, 2), OneShotSchedule(0.25))
            >>> pruner.sparsity(), pruner.step(), pruner.sparsity()
            (0.0, 2, 0.25)
        """
        return self.pruned_count() / self.total_count()

    def report(self) -> SparsityReport:
        """Per-target and global sparsity against the current target.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> pruner = Pruner(nn.Linear(4, 2), OneShotSchedule(0.25))
            >>> _ = pruner.step()
            >>> print(pruner.report())
            tensor  shape   numel  pruned  sparsity
            weight  (2, 4)      8       2    25.00%
            total               8       2    25.00%  (target 25.00%)
        """
        rows = (
            TensorSparsity(target.name, tuple(target.parameter().shape), numel, pruned)
            for target, numel, pruned in zip(
                self._targets, self._numels(), self._pruned_counts(), strict=True
            )
        )
        return SparsityReport(tuple(rows), self.target_sparsity())

    def _pruned_counts(self) -> list[int]:
        """Per target, its pruned units as the weights hold them (once permanent, the zeros of
        the tensor itself), read now: exact whatever changed them."""
        if self.permanent:
            return global_zeros([target.parameter() for target in self._targets])
        return self._mode.pruned_counts(self._targets)

    def _masked_counts(self) -> list[int]:
        """Per target, the zeros of its mask: within a step, whose weights were just checked."""
        return self._mode.pruned_counts(self._targets, read_weights=False)

    def _numels(self) -> list[int]:
        return [target.parameter().numel() for target in self._targets]

    # -- masks -----------------------------------------------------------------------------

    def reparametrize(self) -> None:
        """Give every target not pruned yet an all-ones mask (``<name>_orig``/``<name>_mask``).

        A pruned checkpoint holds ``<name>_orig`` and ``<name>_mask``; reparametrizing before
        the first pruning step keeps the model's state_dict keys the same at every step, so a
        run resumed at any step loads its checkpoint strictly. Every holder of a tied target
        gets the same mask buffer.

        With ``masking="inplace"``, every target without a mask gets an all-``True`` bool
        ``<name>_mask`` buffer instead (the parameter stays as it is).

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 2)
            >>> Pruner(model, OneShotSchedule(0.5, step=100)).reparametrize()
            >>> sorted(model.state_dict())
            ['bias', 'weight_mask', 'weight_orig']
            >>> lean = nn.Linear(4, 2)
            >>> Pruner(lean, OneShotSchedule(0.5, step=100), masking="inplace").reparametrize()
            >>> sorted(lean.state_dict()), lean.weight_mask.dtype
            (['bias', 'weight', 'weight_mask'], torch.bool)
        """
        self._mode.ensure_masks(self._targets)

    def make_permanent(self) -> None:
        """Remove the reparametrization of every target, keeping its zeros; pruning then ends.

        Every holder of a tied target gets the one parameter back (``a.weight is b.weight``),
        holding the masked values its holders computed with, so outputs do not change; pruned
        units hold ``+0.0`` (``remove`` alone leaves ``-0.0`` where a negative weight was pruned,
        as torch does). :meth:`pruned_count` then counts the zeros of the targets.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 2)
            >>> pruner = Pruner(model, OneShotSchedule(0.25))
            >>> _ = pruner.step()
            >>> pruner.make_permanent()
            >>> sorted(model.state_dict()), int((model.weight == 0).sum())
            (['bias', 'weight'], 2)

        With ``masking="inplace"`` the mask buffers are dropped (the weights are zero already)
        and the hooks of :meth:`attach` are taken off.
        """
        self._optimizers.remove_hooks()
        self._mode.make_permanent(self._targets)
        self._progress.permanent = True
        self._progress.snapshot = None  # nothing is left to rewind

    def _check_not_permanent(self, why: str) -> None:
        if self.permanent:
            raise RuntimeError(
                "Expected a pruner whose pruning is not permanent, but make_permanent() was "
                f"called: {why}."
            )

    # -- rewinding -------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Tensor]:
        """Clones of the targets' unpruned values (``<name>_orig`` if pruned), by target name
        (one entry per tied parameter).

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 2)
            >>> snapshot = Pruner(model, OneShotSchedule(0.5)).snapshot()
            >>> list(snapshot), snapshot["weight"].equal(model.weight)
            (['weight'], True)
        """
        return snapshot_of(self._targets)

    def take_snapshot(self) -> None:
        """Keep the targets' current values as those rewinding restores.

        ``rewind="init"`` takes the snapshot when the pruner is made and ``rewind="step"`` at
        ``rewind_step``; call this when the weights are replaced afterwards (pretrained weights
        loaded, or DDP's broadcast of rank zero's weights), before the first pruning step.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 2)
            >>> pruner = Pruner(model, OneShotSchedule(0.5), rewind="init")
            >>> with torch.no_grad():
            ...     _ = model.weight.fill_(1.0)  # e.g. pretrained weights loaded
            >>> pruner.take_snapshot()
            >>> _ = pruner.step()
            >>> model.weight_orig.unique().tolist()
            [1.0]
        """
        self._progress.snapshot = self.snapshot()

    def rewind(self, state: Mapping[str, Tensor]) -> None:
        """Copy ``state`` into the targets' unpruned values, keeping the masks (lottery tickets).

        With ``masking="inplace"`` the values are copied into the parameters and their pruned
        entries zeroed again: the pruned values are gone, ``state`` (e.g. the rewind snapshot)
        is the only copy of them.

        Args:
            state: Values by target name (or any alias of it), e.g. from :meth:`snapshot` at
                initialisation; targets not in ``state`` are left alone.

        Raises:
            RuntimeError: After :meth:`make_permanent`.
            ValueError: A name that is not a target, two names of one target, or a value of
                another shape.

        Example:
            >>> import torch
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> model = nn.Linear(4, 2)
            >>> pruner = Pruner(model, OneShotSchedule(0.5))
            >>> initial = pruner.snapshot()
            >>> _ = pruner.step()
            >>> with torch.no_grad():
            ...     _ = model.weight_orig.add_(1.0)
            >>> pruner.rewind(initial)
            >>> model.weight_orig.equal(initial["weight"])
            True
            >>> model.weight.equal(initial["weight"] * model.weight_mask)
            True
        """
        self._check_not_permanent("there are no `_orig` parameters left to rewind")
        copy_back(self._targets, state, self._mode)

    # -- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The pruner's state: plain data by name, and the rewind snapshot's tensors.

        ``{"version": 3, "step", "last_pruned_step", "targets", "schedule", "method", "scope",
        "min_density", "rewind", "rewind_step", "seed", "history", "permanent", "snapshot",
        "masking"}``.
        ``"schedule"`` is its ``{"class_path", "init_args"}`` form, ``None`` when it cannot be
        serialised (a lambda in a :class:`~tensorplay.ao.pruning.schedules.CallableSchedule`);
        like the method, scope, minimum density and rewinding it is informative only: the
        pruner's own configuration is kept on load. ``"snapshot"`` holds the values rewinding
        restores, by target name (``None`` before it is taken or without rewinding).

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> state = Pruner(nn.Linear(4, 2), OneShotSchedule(0.5), seed=3).state_dict()
            >>> state["version"], state["targets"], state["method"], state["seed"]
            (3, ['weight'], 'l1_unstructured', 3)
            >>> state["schedule"]["class_path"], state["snapshot"]
            ('tensorplay.ao.pruning.schedules.OneShotSchedule', None)
        """
        return state_dict(self._progress, self.config, self._targets)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore counters, history, seed and rewind snapshot from :meth:`state_dict`.

        Load the model's state_dict too (it holds the masks; see
        :func:`~tensorplay.ao.pruning.checkpoint.restore_pruning` for a fresh model). The
        pruner's own configuration is kept; a state saved with a different schedule, method,
        scope, minimum density or rewinding only warns. The saved seed replaces the pruner's, so
        a resumed run draws what an uninterrupted one would.

        A version-2 state (saved before the lean mode existed) loads as one with ``"masking":
        "reparametrize"``. A version-1 state (saved by tensorplay 0.1, before the pruner rewound or
        seeded) is accepted: it restores the counters and history and keeps the pruner's seed; it
        has no snapshot (unless it carries the ``"seed"`` and ``"snapshot"`` that 0.1's callback
        kept beside it), so a pruner that rewinds raises at its next step unless the snapshot's step
        is still ahead.

        Raises:
            TypeError: ``state`` or its snapshot is not a mapping.
            ValueError: An unknown version, missing or unknown keys, other targets, bad
                counters, a bad seed, or a snapshot of other names or shapes.

        Example:
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
            >>> first = Pruner(nn.Linear(4, 2), OneShotSchedule(0.5))
            >>> _ = first.step()
            >>> second = Pruner(nn.Linear(4, 2), OneShotSchedule(0.5))
            >>> second.load_state_dict(first.state_dict())
            >>> second.last_step, second.last_pruned_step
            (0, 0)
        """
        self._progress = load_progress(state, self.config, self._targets, self.seed)
