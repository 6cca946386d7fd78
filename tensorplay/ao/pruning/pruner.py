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

import functools
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from tensorplay.ao.pruning.aliases import TiedParameter, alias_map
from tensorplay.ao.pruning.amount import compute_nparams_to_prune
from tensorplay.ao.pruning.base import BasePruningMethod
from tensorplay.ao.pruning.config import (
    Masking,
    PrunerConfig,
    Rewind,
    Scope,
    check_int,
    counts_itself,
)
from tensorplay.ao.pruning.global_pruning import (
    global_unstructured,
    has_streaming_keys,
    prune_globally,
    share_mask,
)
from tensorplay.ao.pruning.masking.lean_masks import (
    apply_masks,
    install_mask,
    is_lean_tensor,
    lean_mask,
    local_tensor,
    mask_like,
    remove_mask,
)
from tensorplay.ao.pruning.masking.lean_masks import mask_gradients as mask_grads
from tensorplay.ao.pruning.masking.optimizer_hooks import OptimizerAttachment, OptimizerHooks
from tensorplay.ao.pruning.method_selection import select_in_place
from tensorplay.ao.pruning.methods import remove
from tensorplay.ao.pruning.reparametrization import (
    is_pruned_tensor,
    parameter_of,
    pruned_parts,
)
from tensorplay.ao.pruning.schedules import Schedule
from tensorplay.ao.pruning.sharded import (
    Sharding,
    check_scores,
    global_zeros,
    is_sharded,
    local_values,
    sharding_of,
)
from tensorplay.ao.pruning.stats import SparsityReport, TensorSparsity
from tensorplay.ao.pruning.targets import (
    DEFAULT_MODULE_TYPES,
    DEFAULT_NAMES,
    KeepDense,
    ModuleType,
    method_name,
    resolve_parameters,
    select_parameters,
)

__all__ = ["Pruner"]

STATE_VERSION = 3
_STATE_KEYS_V1 = (
    "version",
    "step",
    "last_pruned_step",
    "targets",
    "schedule",
    "method",
    "scope",
    "min_density",
    "history",
    "permanent",
)
_STATE_KEYS_V2 = (*_STATE_KEYS_V1, "rewind", "rewind_step", "seed", "snapshot")
_STATE_KEYS = (*_STATE_KEYS_V2, "masking")
# A version-1 state may carry the seed and snapshot that the 0.1 callback kept beside it.
_V1_OPTIONAL = ("seed", "snapshot")
_CONFIG_KEYS = ("schedule", "method", "scope", "min_density", "rewind", "rewind_step", "masking")

ImportanceFn = Callable[[nn.Module, str], Tensor]


def _min_kept(numel: int, min_density: float) -> int:
    """The fewest units to keep so that ``kept / numel >= min_density`` holds in float math."""
    keep = min(numel, math.ceil(min_density * numel))
    while keep > 0 and (keep - 1) / numel >= min_density:
        keep -= 1
    while keep < numel and keep / numel < min_density:
        keep += 1
    return keep


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
        groups = _tied_groups(model, _target_names(model, config))
        _check_masking_of(groups, config.masking)
        self.config = config
        self.model = model
        self.schedule = schedule
        self.method = config.method_class
        self.targets: list[str] = [group.name for group in groups]
        self.importance_fn = importance_fn
        self.scope: Scope = scope
        self.min_density = float(min_density)
        self.seed = seed
        self.optimizers: list[Optimizer] = list(optimizers)
        self.last_step = -1
        self.last_pruned_step = -1
        self.history: list[tuple[int, float, int]] = []
        self._groups = groups
        self._pairs = [group.pairs[0] for group in groups]
        self._permanent = False
        self.masking: Masking = config.masking
        self._hooks: list[OptimizerHooks] = []
        self._grads_masked = 0  # counts mask_gradients() calls: the hooks skip a second pass
        # The values rewinding restores; for "init", those of the model as it is now.
        self._snapshot: dict[str, Tensor] | None = None
        if rewind == "init":
            self.take_snapshot()

    @property
    def pairs(self) -> list[tuple[nn.Module, str]]:
        """The ``(module, name)`` pair of each target's canonical name, in the order of
        :attr:`targets`; :attr:`aliases` has every pair."""
        return list(self._pairs)

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
        return {group.name: group.names for group in self._groups}

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
        mine = {id(parameter_of(module, name)) for module, name in self._pairs}
        return [
            " = ".join(group.names)
            for group in other._groups
            if id(parameter_of(*group.pairs[0])) in mine
        ]

    @property
    def permanent(self) -> bool:
        """Whether :meth:`make_permanent` has been called."""
        return self._permanent

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
        if self.masking != "inplace":
            raise ValueError(
                "Expected a pruner with masking='inplace' to attach optimizers to, but got "
                f"masking={self.masking!r}: the reparametrization masks through autograd and "
                "needs no optimizer hooks."
            )
        self._check_not_permanent()
        if not isinstance(mask_gradients, bool):
            raise TypeError(f"Expected `mask_gradients` to be a bool, but got {mask_gradients!r}.")
        if not optimizers:
            raise ValueError("Expected at least one optimizer to attach, but got none.")
        attached = {id(hooks.optimizer) for hooks in self._attached()}
        held_pairs = []
        for position, optimizer in enumerate(optimizers):
            if not isinstance(optimizer, Optimizer):
                raise TypeError(
                    "Expected each optimizer to be a torch.optim.Optimizer, but got "
                    f"{type(optimizer).__name__} at position {position}."
                )
            if id(optimizer) in attached:
                raise ValueError(
                    f"Expected each optimizer to be attached once, but {type(optimizer).__name__} "
                    f"at position {position} is attached already."
                )
            attached.add(id(optimizer))
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            pairs = [pair for pair in self._pairs if id(self._parameter(*pair)) in held]
            if not pairs:
                raise ValueError(
                    f"Expected each optimizer to hold at least one target, but "
                    f"{type(optimizer).__name__} at position {position} holds none of "
                    f"{self.targets}."
                )
            held_pairs.append(pairs)
        made = []
        for optimizer, pairs in zip(optimizers, held_pairs, strict=True):
            hooks = OptimizerHooks(
                optimizer,
                functools.partial(self._lean_targets, pairs),
                mask_gradients,
                lambda: self._grads_masked,
            )
            hooks.zero_state()
            made.append(hooks)
        self._hooks.extend(made)
        return OptimizerAttachment(made)

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
        if self.masking == "inplace":
            mask_grads(*self._lean_targets())
            self._grads_masked += 1

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
        if self.masking == "inplace":
            apply_masks(*self._lean_targets())

    def _check_not_permanent(self) -> None:
        if self._permanent:
            raise RuntimeError(
                "Expected a pruner whose pruning is not permanent, but make_permanent() was "
                "called: the masks are gone."
            )

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
        if self._permanent:
            raise RuntimeError(
                "Expected a pruner whose pruning is not permanent, but make_permanent() was "
                "called: the reparametrization is gone, so nothing more can be pruned."
            )
        step = self.last_step + 1 if step is None else check_int("step", step, 0)
        self._take_snapshot(step)
        newly_pruned = 0
        if self.schedule.should_prune(step) and step > self.last_pruned_step:
            self._check_sharded()
            target = self.schedule(step)
            with self._seeded(step):
                if counts_itself(self.method):
                    newly_pruned = self._prune_own_count()
                else:
                    newly_pruned = self._prune_to(target)
            self.last_pruned_step = step
            if newly_pruned:
                self.history.append((step, target, newly_pruned))
                self._after_pruning()
        self.last_step = step
        return newly_pruned

    def _take_snapshot(self, step: int) -> None:
        """Snapshot at ``rewind_step``; refuse to go on without one once it is due."""
        config = self.config
        if config.rewind == "none" or self._snapshot is not None:
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
        devices = {p.device.index or 0 for p in self._parameters() if p.device.type == "cuda"}
        with torch.random.fork_rng(devices=sorted(devices)):
            torch.manual_seed((self.seed + step) % 2**64)
            yield

    def _after_pruning(self) -> None:
        if self._snapshot is not None:
            self.rewind(self._snapshot)
        for optimizer in self.optimizers:
            optimizer.state.clear()
        for hooks in self._attached():
            hooks.zero_state()

    def _prune_own_count(self) -> int:
        """Apply a method that decides its own count to each target on its own; the units
        already pruned stay pruned. Every mask is computed before any is installed."""
        before = sum(self._pruned_counts())
        scores = self._scores()
        method = self.method()
        if self.masking == "inplace":
            self._lean_own_count(method, scores)
            return sum(self._pruned_counts()) - before
        new_masks: list[Tensor] = []
        for fq_name, pair in zip(self.targets, self._pairs, strict=True):
            param = self._parameter(*pair)
            parts = pruned_parts(*pair)
            mask = torch.ones_like(param) if parts is None else parts.mask.detach()
            new_mask = method.compute_mask(scores[pair], default_mask=mask.clone())
            if not isinstance(new_mask, Tensor) or new_mask.shape != mask.shape:
                got = tuple(new_mask.shape) if isinstance(new_mask, Tensor) else repr(new_mask)
                raise ValueError(
                    f"Expected {self.method.__name__}.compute_mask to return a mask of shape "
                    f"{tuple(mask.shape)} for {fq_name!r}, but got {got}."
                )
            new_masks.append((new_mask.to(dtype=mask.dtype) * mask).detach())
        for group, new_mask in zip(self._groups, new_masks, strict=True):
            share_mask(group.pairs, new_mask.to(dtype=self._parameter(*group.pairs[0]).dtype))
        return sum(self._pruned_counts()) - before

    def _lean_own_count(
        self, method: BasePruningMethod, scores: Mapping[tuple[nn.Module, str], Tensor]
    ) -> None:
        """:meth:`_prune_own_count` on lean masks: every new mask is computed, then each is
        ANDed into the target's mask."""
        current = [self._lean_keep(index) for index in range(len(self._groups))]
        keeps: list[Tensor] = []
        for keep, fq_name, pair in zip(current, self.targets, self._pairs, strict=True):
            param = self._parameter(*pair)
            new_mask = method.compute_mask(scores[pair], default_mask=keep.to(param.dtype))
            if not isinstance(new_mask, Tensor) or new_mask.shape != keep.shape:
                got = tuple(new_mask.shape) if isinstance(new_mask, Tensor) else repr(new_mask)
                raise ValueError(
                    f"Expected {self.method.__name__}.compute_mask to return a mask of shape "
                    f"{tuple(keep.shape)} for {fq_name!r}, but got {got}."
                )
            keeps.append(new_mask.detach() != 0)
        for mask, keep in zip(current, keeps, strict=True):
            mask.logical_and_(keep)
        self._install_lean(range(len(self._groups)), current)

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
            TensorSparsity(fq_name, tuple(self._parameter(m, n).shape), numel, pruned)
            for fq_name, (m, n), numel, pruned in zip(
                self.targets, self._pairs, self._numels(), self._pruned_counts(), strict=True
            )
        )
        return SparsityReport(tuple(rows), self.target_sparsity())

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
        if self.masking == "inplace":
            for index, group in enumerate(self._groups):
                if lean_mask(*group.pairs[0]) is None:
                    install_mask(group.pairs, self._lean_keep(index))
            return
        for group in self._groups:
            if not any(is_pruned_tensor(module, name) for module, name in group.pairs):
                param = self._parameter(*group.pairs[0])
                ones = torch.ones_like(param, memory_format=torch.contiguous_format)
                share_mask(list(group.pairs), ones.detach())

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
        if self.masking == "inplace":
            self._lean_permanent()
            return
        for group in self._groups:
            for module, name in group.pairs:
                if is_pruned_tensor(module, name):
                    # The second holder of a tied parameter recomputes mask * (masked values):
                    # the same values, and the same Parameter object is registered again.
                    remove(module, name)
            with torch.no_grad():
                # mask * orig is -0.0 where a negative weight was pruned; +0.0 is the same value
                # and lets a bit-exact sparse export (save_sparse) store every pruned unit as 0.
                self._parameter(*group.pairs[0]).add_(0.0)
        self._permanent = True
        self._snapshot = None  # nothing is left to rewind

    def _lean_permanent(self) -> None:
        apply_masks(*self._lean_targets())
        for hooks in self._attached():
            hooks.remove()
        self._hooks = []
        with torch.no_grad():
            for group in self._groups:
                remove_mask(group.pairs)
                param = self._parameter(*group.pairs[0]).detach()
                local_tensor(param).add_(0.0)  # -0.0 -> +0.0, as above
        self._permanent = True
        self._snapshot = None

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
        return {
            fq_name: self._parameter(module, name).detach().clone()
            for fq_name, (module, name) in zip(self.targets, self._pairs, strict=True)
        }

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
        self._snapshot = self.snapshot()

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
        if self._permanent:
            raise RuntimeError(
                "Expected a pruner whose pruning is not permanent, but make_permanent() was "
                "called: there are no `_orig` parameters left to rewind."
            )
        for index, value in self._check_values(state, "state").items():
            group = self._groups[index]
            param = self._parameter(*group.pairs[0])
            with torch.no_grad():  # a shard (FSDP2) takes its own rows of a full value
                local_tensor(param.detach()).copy_(local_values(value, param))
            if self.masking == "inplace":
                apply_masks(*self._lean_targets([group.pairs[0]]))
                continue
            for module, name in group.pairs:
                if is_pruned_tensor(module, name):
                    # What the forward pre-hook would compute, so `module.<name>` is not stale.
                    mask: Tensor = getattr(module, name + "_mask")
                    orig: Tensor = getattr(module, name + "_orig")
                    setattr(module, name, mask.to(dtype=orig.dtype) * orig)

    def _check_values(self, values: object, key: str) -> dict[int, Tensor]:
        """``values`` (target name -> tensor of its shape) by target index.

        Raises:
            TypeError: ``values`` is not a mapping.
            ValueError: A name that is not a target, two names of one target, or a value of
                another shape.
        """
        if not isinstance(values, Mapping):
            raise TypeError(
                f"Expected `{key}` to be a mapping of name to tensor, but got {values!r}."
            )
        index = {alias: i for i, group in enumerate(self._groups) for alias in group.names}
        found: dict[int, Tensor] = {}
        seen: dict[int, str] = {}
        for fq_name, value in values.items():
            if fq_name not in index:
                raise ValueError(
                    f"Expected the keys of `{key}` to be targets of the pruner, but got "
                    f"{fq_name!r}; targets: {self.targets}."
                )
            if index[fq_name] in seen:
                raise ValueError(
                    f"Expected one value per target in `{key}`, but {seen[index[fq_name]]!r} and "
                    f"{fq_name!r} name the same tied parameter."
                )
            seen[index[fq_name]] = fq_name
            shape = tuple(self._parameter(*self._pairs[index[fq_name]]).shape)
            if not isinstance(value, Tensor) or tuple(value.shape) != shape:
                got = tuple(value.shape) if isinstance(value, Tensor) else repr(value)
                raise ValueError(
                    f"Expected `{key}[{fq_name!r}]` to be a tensor of shape {shape}, but got {got}."
                )
            found[index[fq_name]] = value
        return found

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
        try:
            schedule: dict[str, Any] | None = self.schedule.to_dict()
        except (TypeError, ValueError):
            schedule = None
        return {
            "version": STATE_VERSION,
            "step": self.last_step,
            "last_pruned_step": self.last_pruned_step,
            "targets": list(self.targets),
            "schedule": schedule,
            "method": method_name(self.method),
            "scope": self.scope,
            "min_density": self.min_density,
            "rewind": self.config.rewind,
            "rewind_step": self.config.rewind_step,
            "seed": self.seed,
            "history": list(self.history),
            "permanent": self._permanent,
            "snapshot": None if self._snapshot is None else dict(self._snapshot),
            "masking": self.masking,
        }

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
        if not isinstance(state, Mapping):
            raise TypeError(f"Expected `state` to be a mapping, but got {state!r}.")
        version = state.get("version")
        if version not in (1, 2, STATE_VERSION):
            raise ValueError(
                f"Expected a pruner state of version 1, 2 or {STATE_VERSION}, but got version "
                f"{version!r}."
            )
        expected = {1: _STATE_KEYS_V1, 2: _STATE_KEYS_V2}.get(version, _STATE_KEYS)
        optional = _V1_OPTIONAL if version == 1 else ()
        missing = [key for key in expected if key not in state]
        unknown = sorted(key for key in state if key not in expected + optional)
        if missing or unknown:
            raise ValueError(
                f"Expected a version-{version} pruner state to have keys {list(expected)}, but "
                f"{missing} are missing and {unknown} are unknown."
            )
        if version == 1:
            state = self._upgrade_v1(state)
        elif version == 2:  # saved before the lean mode existed: reparametrized
            state = {**state, "version": STATE_VERSION, "masking": "reparametrize"}
        # A state may name a tied target by another of its names (its first name in module
        # order is the pruner's); any name of it is the same target.
        canonical = {alias: group.name for group in self._groups for alias in group.names}
        saved = list(dict.fromkeys(canonical.get(name, name) for name in state["targets"]))
        if saved != self.targets:
            raise ValueError(
                f"Expected the state's targets to be the pruner's, {self.targets}, but got "
                f"{list(state['targets'])}."
            )
        step = state["step"]
        last_pruned = state["last_pruned_step"]
        for key, value in (("step", step), ("last_pruned_step", last_pruned)):
            if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                raise ValueError(f"Expected `{key}` to be an int >= -1, but got {value!r}.")
        history = [_history_entry(entry) for entry in state["history"]]
        if not isinstance(state["permanent"], bool):
            raise ValueError(f"Expected `permanent` to be a bool, but got {state['permanent']!r}.")
        seed = state["seed"]
        if seed is not None:
            check_int("seed", seed, 0)
        snapshot = state["snapshot"]
        if snapshot is not None:
            found = self._check_values(snapshot, "snapshot")
            snapshot = {self.targets[i]: value for i, value in found.items()}
        self._warn_on_config_change(state)
        self.last_step = step
        self.last_pruned_step = last_pruned
        self.history = history
        self._permanent = state["permanent"]
        self.seed = seed
        self._snapshot = snapshot if self.config.rewind != "none" else None

    def _upgrade_v1(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A version-1 state as version 2: the pruner's own rewinding, its seed and no snapshot
        unless given; its schedule (in the old ``{"type"}`` form) is left out of the
        comparison."""
        return {
            "seed": self.seed,
            "snapshot": None,
            **state,
            "version": STATE_VERSION,
            "schedule": None,
            "rewind": self.config.rewind,
            "rewind_step": self.config.rewind_step,
            "masking": None,
        }

    def _warn_on_config_change(self, state: Mapping[str, Any]) -> None:
        mine = self.state_dict()
        changed = [
            key
            for key in _CONFIG_KEYS
            if state[key] is not None and mine[key] is not None and state[key] != mine[key]
        ]
        if changed:
            details = ", ".join(f"{key}: {state[key]!r} -> {mine[key]!r}" for key in changed)
            warnings.warn(
                f"The pruner state was saved with another configuration ({details}); the "
                "pruner keeps its own.",
                UserWarning,
                stacklevel=3,
            )

    # -- pruning ---------------------------------------------------------------------------

    @staticmethod
    def _parameter(module: nn.Module, name: str) -> nn.Parameter:
        param = parameter_of(module, name)
        if param is None:
            raise ValueError(
                f"Expected ({type(module).__name__}, {name!r}) to be a parameter or a pruned "
                "tensor, but it is neither; was the module changed after the pruner was made?"
            )
        return param

    def _pruned_counts(self) -> list[int]:
        """The zeros of each target's mask (of the tensor itself once permanent), read now.

        Exact whatever changed the masks (an edit through ``.data`` leaves no version to
        trust): one reduction per tensor and one transfer per device, cheap enough to log
        every step.
        """
        return global_zeros([self._counted(m, n) for m, n in self._pairs])

    def _counted(self, module: nn.Module, name: str) -> Tensor | None:
        parts = pruned_parts(module, name)
        if parts is not None:
            return parts.mask
        mask = lean_mask(module, name)
        if mask is not None:
            return mask
        return module._parameters.get(name) if self._permanent else None

    def _numels(self) -> list[int]:
        return [self._parameter(m, n).numel() for m, n in self._pairs]

    def _parameters(self) -> list[nn.Parameter]:
        return [self._parameter(m, n) for m, n in self._pairs]

    def _caps(self, pruned: list[int], numels: list[int]) -> list[int]:
        """How many more units each target may lose under ``min_density``."""
        return [
            max(0, numel - _min_kept(numel, self.min_density) - done)
            for numel, done in zip(numels, pruned, strict=True)
        ]

    def _scores(self) -> dict[tuple[nn.Module, str], Tensor]:
        """Scores per target's canonical pair: ``importance_fn``'s, else the current unpruned
        values.

        The current ``<name>_orig`` is used rather than ``module.<name>``, which the forward
        pre-hook last computed before the latest optimizer step.
        """
        scores: dict[tuple[nn.Module, str], Tensor] = {}
        for fq_name, (module, name) in zip(self.targets, self._pairs, strict=True):
            param = self._parameter(module, name)
            if self.importance_fn is None:
                scores[(module, name)] = param.detach()
                continue
            score = self.importance_fn(module, name)
            if not isinstance(score, Tensor) or score.shape != param.shape:
                got = tuple(score.shape) if isinstance(score, Tensor) else repr(score)
                raise ValueError(
                    f"Expected `importance_fn` to return a tensor of shape {tuple(param.shape)} "
                    f"for {fq_name!r}, but got {got}."
                )
            check_scores(score, param, repr(fq_name))
            scores[(module, name)] = score.detach()
        return scores

    def _prune_to(self, target: float) -> int:
        """Prune up to ``target`` sparsity; return the number of units newly pruned."""
        pruned, numels = self._pruned_counts(), self._numels()
        caps = self._caps(pruned, numels)
        if self.scope == "layerwise":
            counts = [
                min(compute_nparams_to_prune(target, numel) - done, cap)
                for numel, done, cap in zip(numels, pruned, caps, strict=True)
            ]
            scores = self._scores()
            for index, count in enumerate(counts):
                if count > 0:
                    self._prune_pairs([index], scores, self.method, count)
            return sum(self._pruned_counts()) - sum(pruned)
        count = compute_nparams_to_prune(target, sum(numels)) - sum(pruned)
        if self.min_density > 0:
            count = min(count, sum(caps))
        if count <= 0:
            return 0
        scores = self._scores()
        if self.min_density > 0:
            self._prune_capped(count, caps, scores)
        else:
            self._prune_pairs(range(len(self._groups)), scores, self.method, count)
        return sum(self._pruned_counts()) - sum(pruned)

    def _prune_pairs(
        self,
        indices: Iterable[int],
        scores: Mapping[tuple[nn.Module, str], Tensor],
        method: type[BasePruningMethod],
        count: int,
    ) -> None:
        """``global_unstructured`` over every pair of the targets ``indices``; the pairs of a
        tied target share its canonical pair's scores (one tensor), so they share one mask."""
        if self.masking == "inplace":
            self._lean_prune(list(indices), scores, method, count)
            return
        pairs: list[tuple[nn.Module, str]] = []
        shared: dict[tuple[nn.Module, str], Tensor] = {}
        for index in indices:
            score = scores[self._pairs[index]]
            for pair in self._groups[index].pairs:
                pairs.append(pair)
                shared[pair] = score
        global_unstructured(pairs, method, importance_scores=shared, amount=count)

    def _prune_capped(
        self, count: int, caps: list[int], scores: dict[tuple[nn.Module, str], Tensor]
    ) -> None:
        """Global selection of ``count`` units with at most ``caps[i]`` from target ``i``: the
        units lowest score first, skipping those of a target that has reached its cap (the
        selection's per-tensor caps, exact)."""
        if self.masking == "inplace":
            self._lean_prune(list(range(len(self._groups))), scores, self.method, count, caps)
            return
        pairs: list[tuple[nn.Module, str]] = []
        shared: dict[tuple[nn.Module, str], Tensor] = {}
        for index, group in enumerate(self._groups):
            for pair in group.pairs:
                pairs.append(pair)
                shared[pair] = scores[self._pairs[index]]
        limits = dict(zip(self._pairs, caps, strict=True))
        prune_globally(pairs, self.method, shared, {"amount": count}, caps=limits)

    # -- lean masks ------------------------------------------------------------------------

    def _lean_keep(self, index: int) -> Tensor:
        """Target ``index``'s lean mask, or a new all-True one (not installed yet)."""
        mask = lean_mask(*self._pairs[index])
        return mask_like(self._parameter(*self._pairs[index])) if mask is None else mask

    def _lean_prune(
        self,
        indices: list[int],
        scores: Mapping[tuple[nn.Module, str], Tensor],
        method: type[BasePruningMethod],
        count: int,
        caps: list[int] | None = None,
    ) -> None:
        """Clear ``count`` more units of the lean masks of the targets ``indices`` (the units
        ``global_unstructured`` would prune), then zero them in the weights."""
        keeps = [self._lean_keep(index) for index in indices]
        params = [self._parameter(*self._pairs[index]) for index in indices]
        labels = [self._label(index) for index in indices]
        sharding = sharding_of(params, labels)
        # This rank's pieces (all of each tensor unless sharded); counts and caps are global.
        sources = [
            local_tensor(scores[self._pairs[index]]).to(local_tensor(param).device)
            for index, param in zip(indices, params, strict=True)
        ]
        local_keeps = [local_tensor(keep) for keep in keeps]
        # The weights are zeroed by the selection's writing pass, chunk by chunk while in cache.
        zero = [local_tensor(param.detach()) for param in params]
        select_in_place(method, count, sources, local_keeps, labels, caps, sharding, zero=zero)
        self._install_lean(indices, keeps, zeroed=True)

    def _label(self, index: int) -> str:
        module, name = self._pairs[index]
        return f"({type(module).__name__}, {name!r})"

    def _sharding(self) -> Sharding:
        """The targets' sharding, checked (:func:`~tensorplay.ao.pruning.sharded.sharding_of`)."""
        labels = [f"{self._label(i)} ({fq!r})" for i, fq in enumerate(self.targets)]
        return sharding_of(self._parameters(), labels)

    def _check_sharded(self) -> None:
        """Refuse, before anything changes, a pruning step the sharded targets cannot take.

        Raises:
            ValueError: Targets sharded unlike FSDP2, with ``masking="reparametrize"``, or with
                a method that needs the full tensors (its own ``compute_mask``, or its own count).
        """
        if self._sharding().shards is None:
            return
        if self.masking != "inplace":
            raise ValueError(
                f"Expected plain tensors with masking='reparametrize', but {self.targets} are "
                "DTensors (FSDP2): use masking='inplace'."
            )
        if counts_itself(self.method) or not has_streaming_keys(self.method):
            raise ValueError(
                "Expected l1_unstructured or random_unstructured for the sharded (DTensor) "
                f"targets {self.targets}, but got {self.method.__name__}: its mask needs the "
                "full tensors, which no rank holds."
            )

    def _install_lean(
        self, indices: Iterable[int], keeps: Sequence[Tensor], zeroed: bool = False
    ) -> None:
        """Make ``keeps`` the masks of the targets ``indices`` (every holder of a tied one
        shares it) and zero the pruned weights (unless ``zeroed`` already)."""
        indices = list(indices)
        for index, keep in zip(indices, keeps, strict=True):
            install_mask(self._groups[index].pairs, keep)
        if not zeroed:
            apply_masks([self._parameter(*self._pairs[index]) for index in indices], keeps)

    def _lean_targets(
        self, pairs: Sequence[tuple[nn.Module, str]] | None = None
    ) -> tuple[list[Tensor], list[Tensor]]:
        """The parameters and lean masks of the targets (of ``pairs``, default all) that have
        one, read now."""
        params: list[Tensor] = []
        masks: list[Tensor] = []
        for module, name in self._pairs if pairs is None else pairs:
            mask = lean_mask(module, name)
            if mask is not None:
                params.append(self._parameter(module, name))
                masks.append(mask)
        return params, masks

    def _attached(self) -> list[OptimizerHooks]:
        self._hooks = [hooks for hooks in self._hooks if hooks.active]
        return self._hooks


def _history_entry(entry: object) -> tuple[int, float, int]:
    if not isinstance(entry, (tuple, list)) or len(entry) != 3:
        raise ValueError(
            f"Expected `history` entries to be (step, target, pruned), but got {entry!r}."
        )
    step, target, pruned = entry
    return int(step), float(target), int(pruned)


class _Target(NamedTuple):
    """Every name and ``(module, name)`` pair of one target's parameter (one of each unless
    tied). It holds no reference to the parameter itself: the functional API's test for other
    holders (the parameter's reference count) then needs no scan when the pruner prunes."""

    names: tuple[str, ...]
    pairs: tuple[tuple[nn.Module, str], ...]

    @property
    def name(self) -> str:
        return self.names[0]


def _target_names(model: nn.Module, config: PrunerConfig) -> list[str]:
    """The names ``config.parameters`` gives, or those its selection arguments select."""
    if config.parameters is None:
        return select_parameters(
            model,
            module_types=DEFAULT_MODULE_TYPES
            if config.module_types is None
            else config.module_types,
            names=DEFAULT_NAMES if config.names is None else config.names,
            include=config.include,
            exclude=config.exclude,
            keep_dense=config.keep_dense,
        )
    if isinstance(config.parameters, str):
        return [config.parameters]
    return list(config.parameters)


def _tied_groups(model: nn.Module, names: list[str]) -> list[_Target]:
    """The parameters ``names`` reach, each once, in the order of their first mention.

    Raises:
        ValueError: A name that is not a tensor of the model, or names holders of one tied
            parameter that are not pruned alike.
    """
    resolve_parameters(model, names)  # names each module and tensor that does not exist
    aliases = alias_map(model)
    groups: dict[int, TiedParameter] = {}
    for fq_name in names:
        group = aliases.get(fq_name)
        if group is None:
            raise ValueError(
                f"Expected {fq_name!r} to name a tensor of the model, but it is the parameter "
                f"of a pruned tensor: name the tensor, {fq_name.removesuffix('_orig')!r}."
            )
        groups.setdefault(id(group.parameter), group)
    for group in groups.values():
        _check_pruned_alike(group)
    return [_Target(group.names, group.pairs) for group in groups.values()]


def _check_masking_of(groups: Sequence[_Target], masking: str) -> None:
    """No target may be pruned the other way than ``masking`` says.

    Raises:
        ValueError: naming the tensor and the way it is pruned.
    """
    for group in groups:
        for (module, name), fq_name in zip(group.pairs, group.names, strict=False):
            label = f"({type(module).__name__}, {name!r}) ({fq_name!r})"
            if masking == "inplace" and is_pruned_tensor(module, name):
                raise ValueError(
                    f"Expected {label} not to be pruned by the reparametrization, since the "
                    f"pruner has masking='inplace', but it has `{name}_orig`: make its pruning "
                    "permanent first (remove()), or use masking='reparametrize'."
                )
            if masking == "reparametrize" and is_sharded(module._parameters.get(name)):
                raise ValueError(
                    f"Expected {label} to be a plain tensor, since the pruner has "
                    "masking='reparametrize', but it is a DTensor (FSDP2): the reparametrization "
                    "cannot hold sharded parameters; use masking='inplace'."
                )
            if masking == "reparametrize" and is_lean_tensor(module, name):
                raise ValueError(
                    f"Expected {label} not to carry a lean bool mask, since the pruner has "
                    f"masking='reparametrize', but it has the bool buffer `{name}_mask`: use "
                    "masking='inplace'."
                )


def _check_pruned_alike(group: TiedParameter) -> None:
    """The holders of a tied parameter must all be unpruned, or pruned with equal masks."""
    masks = [
        parts.mask if (parts := pruned_parts(module, name)) is not None else lean_mask(module, name)
        for module, name in group.pairs
    ]
    first = masks[0]
    label = f"({type(group.pairs[0][0]).__name__}, {group.pairs[0][1]!r})"
    for (module, name), mask in zip(group.pairs, masks, strict=True):
        if mask is first or (mask is not None and first is not None and torch.equal(mask, first)):
            continue
        other = f"({type(module).__name__}, {name!r})"
        if mask is not None and first is not None:
            state = f"{other} and {label} are pruned with different masks"
        else:
            pruned, unpruned = (other, label) if first is None else (label, other)
            state = f"{pruned} is pruned and {unpruned} is not"
        raise ValueError(
            f"Expected the holders of the tied parameter {group.name!r} {group.names} to be "
            f"pruned alike, but {state}: prune all its pairs in one global_unstructured call, "
            "or remove() the pruning first."
        )
