"""The lean masks as a masking mode: a bool mask beside the plain parameter, zeros in place.

``masking="inplace"``. The parameter stays the same :class:`~torch.nn.Parameter` (or FSDP2
``DTensor``), its mask is a bool buffer ``<name>_mask``
(:mod:`~tensorplay.ao.pruning.masking.lean_masks`) and its pruned entries are zero. Nothing is
recomputed per forward; attached optimizers keep the zeros
(:mod:`~tensorplay.ao.pruning.masking.optimizer_hooks`), and each target's gradient is masked as
soon as autograd accumulates it, before any clipping reads it
(:mod:`~tensorplay.ao.pruning.masking.gradient_masks`). Sharded targets are this mode's concern
alone: :meth:`LeanMasks.check_step` checks their layout once per pruning step, the selection runs
across ranks, and counts are global.

**Never silently dense.** A lean model's zeros are only as good as the loop that keeps them: an
optimizer that is not attached, or a hand edit, brings pruned weights back. At every pruner
``step()`` without an attached optimizer (and at every pruning step with one),
:meth:`LeanMasks.check_weights` reads the weights; pruned weights that are not zero are zeroed
again, and the first time it happens a warning names each tensor, how many came back, and the
fix. Counts (:meth:`LeanMasks.pruned_counts`, hence ``sparsity()`` and ``report()``) are the
pruned units that the weights hold as zero, never more.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.methods import L1Unstructured
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(4, 2)
    >>> targets = [Target(("weight",), ((layer, "weight"),))]
    >>> mode = LeanMasks()
    >>> mode.prune(targets, [layer.weight.detach()], L1Unstructured, 3, None)
    >>> mode.pruned_counts(targets), layer.weight_mask.dtype, int((layer.weight == 0).sum())
    ([3], torch.bool, 3)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.frames import user_stacklevel
from tensorplay.ao.pruning.masking.gradient_masks import GradientMasks
from tensorplay.ao.pruning.masking.lean_masks import (
    apply_masks,
    install_mask,
    lean_mask,
    local_tensor,
    mask_gradients,
    mask_like,
    pruned_zero_counts,
    remove_mask,
    revived_counts,
)
from tensorplay.ao.pruning.masking.mode import masked_targets, own_masks
from tensorplay.ao.pruning.masking.optimizer_hooks import OptimizerHooks
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.method_selection import (
    STREAMING,
    counts_itself,
    has_streaming_keys,
    select_in_place,
)
from tensorplay.ao.pruning.parity.reparametrization import is_pruned_tensor
from tensorplay.ao.pruning.selection.shards import (
    Sharding,
    global_zeros,
    is_sharded,
    sharding_of,
    sum_over_ranks,
)

if TYPE_CHECKING:
    from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["LeanMasks"]


class LeanMasks:
    """``masking="inplace"``: see the module docstring.

    Example:
        >>> LeanMasks().name, LeanMasks().holds_dtensors
        ('inplace', True)
    """

    name = "inplace"
    holds_dtensors = True
    hooks_optimizers = True

    def __init__(self) -> None:
        self._warned = False
        # The version of each weight when its zeros were last written or read: an in-place
        # write (an optimizer step, a copy) changes it, so an unchanged one needs no reading.
        self._settled: dict[int, int] = {}
        self._gradient_masks = GradientMasks()

    def check_targets(self, targets: Sequence[Target]) -> None:
        """Refuse targets that the reparametrization prunes; hook the gradients of those that
        hold a lean mask already (a restored checkpoint).

        Raises:
            ValueError: naming the tensor.
        """
        for target in targets:
            for (module, name), fq_name in zip(target.pairs, target.names, strict=False):
                if is_pruned_tensor(module, name):
                    label = f"({type(module).__name__}, {name!r}) ({fq_name!r})"
                    raise ValueError(
                        f"Expected {label} not to be pruned by the reparametrization, since the "
                        f"pruner has masking='inplace', but it has `{name}_orig`: make its "
                        "pruning permanent first (remove()), or use masking='reparametrize'."
                    )
        self._gradient_masks.install([t for t in targets if lean_mask(*t.pair) is not None])

    def check_step(self, targets: Sequence[Target], method: type[BasePruningMethod]) -> None:
        """Sharded targets: the layout FSDP2 gives, and a method that streams.

        Raises:
            ValueError: Targets sharded unlike FSDP2, or a method that needs the full tensors
                (its own ``compute_mask``, or its own count).
        """
        if _sharding(targets).shards is None:
            return
        if counts_itself(method) or not has_streaming_keys(method):
            streaming = " or ".join(known.name for known in STREAMING.values())
            raise ValueError(
                f"Expected {streaming} for the sharded (DTensor) targets "
                f"{[t.name for t in targets]}, but got {method.__name__}: its mask needs the "
                "full tensors, which no rank holds."
            )

    def mask(self, module: nn.Module, name: str) -> Tensor | None:
        """The bool ``<name>_mask`` of a lean tensor, else ``None``."""
        return lean_mask(module, name)

    def ensure_masks(self, targets: Sequence[Target]) -> None:
        """Give every target without a mask an all-``True`` bool ``<name>_mask``."""
        for target in targets:
            if lean_mask(*target.pair) is None:
                install_mask(target.pairs, self._mask_or_new(target))
        self._gradient_masks.install(targets)

    def _mask_or_new(self, target: Target) -> Tensor:
        """The target's lean mask (about to change in place), or a new all-``True`` one (not
        installed yet)."""
        mask = lean_mask(*target.pair)
        if mask is None:
            return mask_like(target.parameter())
        changes.keep_values(mask)
        return mask

    def prune(
        self,
        targets: Sequence[Target],
        scores: Sequence[Tensor],
        method: type[BasePruningMethod],
        count: int,
        caps: Sequence[int] | None,
    ) -> None:
        """Clear ``count`` more units of the targets' masks (the units ``global_unstructured``
        would prune), zeroing them in the weights in the selection's own writing pass."""
        keeps = [self._mask_or_new(target) for target in targets]
        params = [target.parameter() for target in targets]
        labels = [target.label for target in targets]
        sharding = sharding_of(params, labels)
        # This rank's pieces (all of each tensor unless sharded); counts and caps are global.
        sources = [
            local_tensor(score).to(local_tensor(param).device)
            for score, param in zip(scores, params, strict=True)
        ]
        local_keeps = [local_tensor(keep) for keep in keeps]
        for param in params:
            changes.keep_values(param)  # zeroed by the selection's writing pass
        zero = [local_tensor(param.detach()) for param in params]
        limits = None if caps is None else list(caps)
        select_in_place(method, count, sources, local_keeps, labels, limits, sharding, zero=zero)
        for target, keep in zip(targets, keeps, strict=True):
            install_mask(target.pairs, keep)
        self._gradient_masks.install(targets)
        _settle(self._settled, params)

    def prune_each(
        self,
        targets: Sequence[Target],
        scores: Sequence[Tensor],
        clear: Callable[[int, Tensor, Tensor], None],
    ) -> None:
        """``clear`` works on this rank's pieces of the masks; the weights are zeroed after."""
        keeps = [self._mask_or_new(target).clone() for target in targets]
        for index, (score, keep) in enumerate(zip(scores, keeps, strict=True)):
            local = local_tensor(keep)
            clear(index, local_tensor(score.detach()).to(local.device), local)
        for target, keep in zip(targets, keeps, strict=True):
            install_mask(target.pairs, keep)
        self._gradient_masks.install(targets)
        self._zero([target.parameter() for target in targets], keeps)

    def prune_own_count(
        self,
        targets: Sequence[Target],
        scores: Sequence[Tensor],
        method: type[BasePruningMethod],
    ) -> None:
        """Every new mask is computed, then each is ANDed into the target's mask."""
        current = [self._mask_or_new(target) for target in targets]
        defaults = [
            keep.to(target.parameter().dtype) for keep, target in zip(current, targets, strict=True)
        ]
        keeps = [new != 0 for new in own_masks(method(), targets, scores, defaults)]
        for mask, keep in zip(current, keeps, strict=True):
            mask.logical_and_(keep)
        for target, mask in zip(targets, current, strict=True):
            install_mask(target.pairs, mask)
        self._gradient_masks.install(targets)
        self._zero(*self.masked(targets))

    def pruned_counts(self, targets: Sequence[Target], *, read_weights: bool = True) -> list[int]:
        """Per target, its pruned units (over all ranks): those the weights hold as zero, or
        without ``read_weights`` the zeros of its mask (a pruning step, whose weights were
        just checked)."""
        masks = [lean_mask(*target.pair) for target in targets]
        if not read_weights:
            return global_zeros(masks)
        held = [(t.parameter(), m) for t, m in zip(targets, masks, strict=True) if m is not None]
        found = iter(
            sum_over_ranks(
                pruned_zero_counts([p for p, _ in held], [m for _, m in held]),
                [p for p, _ in held],
            )
        )
        return [0 if mask is None else next(found) for mask in masks]

    def _revived(self, params: Sequence[Tensor], masks: Sequence[Tensor | None]) -> list[int]:
        """Per target, its pruned weights that are not zero (0 where known to be none); the
        weights read and found clean are settled at their current version. Sharded weights
        are always read: every rank must take part in the same collectives."""
        sharded = any(is_sharded(param) for param in params)
        read = {
            i: mask
            for i, (param, mask) in enumerate(zip(params, masks, strict=True))
            if mask is not None and (sharded or self._settled.get(id(param)) != _version(param))
        }
        found = _global_revived([params[i] for i in read], list(read.values()))
        counts = [0] * len(params)
        for index, count in zip(read, found, strict=True):
            counts[index] = count
        _settle(self._settled, [params[i] for i in read if not counts[i]])
        return counts

    def _zero(self, params: Sequence[Tensor], masks: Sequence[Tensor]) -> None:
        apply_masks(params, masks)
        _settle(self._settled, params)

    def after_rewind(self, target: Target) -> None:
        """Zero the pruned entries of the values just copied in."""
        self.apply_masks([target])

    def make_permanent(self, targets: Sequence[Target]) -> None:
        """Zero the pruned weights and drop the masks and gradient hooks; pruned units hold
        ``+0.0``."""
        self._gradient_masks.remove()
        self.apply_masks(targets)
        with torch.no_grad():
            for target in targets:
                remove_mask(target.pairs)
                local_tensor(target.parameter().detach()).add_(0.0)  # -0.0 -> +0.0
        self._settled.clear()

    def mask_gradients(self, targets: Sequence[Target]) -> None:
        """Zero the pruned entries of the targets' gradients (one fused pass), but for those the
        gradient hooks provably masked already
        (:meth:`~tensorplay.ao.pruning.masking.gradient_masks.GradientMasks.unmasked`)."""
        mask_gradients(*self._gradient_masks.unmasked(*self.masked(targets)))

    def apply_masks(self, targets: Sequence[Target]) -> None:
        """Zero the pruned entries of the targets' weights (one fused pass)."""
        self._zero(*self.masked(targets))

    def check_weights(self, targets: Sequence[Target], *, attached: bool) -> None:
        """Zero pruned weights that came back, warning the first time (see the module).

        Args:
            targets: The pruner's targets.
            attached: Whether an optimizer is attached (its hooks keep the zeros: only a hand
                edit can revive a weight then).
        """
        masks = [lean_mask(*target.pair) for target in targets]
        revived = self._revived([target.parameter() for target in targets], masks)
        if not any(revived):
            return
        self._zero(*self.masked([t for t, count in zip(targets, revived, strict=True) if count]))
        if self._warned:
            return
        self._warned = True
        found = ", ".join(
            f"{count} of {target.name!r}"
            for target, count in zip(targets, revived, strict=True)
            if count
        )
        cause = (
            "were changed by other means than the attached optimizers (a hand edit, a state "
            "loaded into the weights)"
            if attached
            else "were trained back: no optimizer is attached to the pruner"
        )
        warnings.warn(
            f"Pruned weights were not zero ({found}): they {cause}. They are zeroed again now, "
            "and the pruner checks the weights at every step() while no optimizer is attached. "
            "Call pruner.attach(optimizer) right after making the optimizer, so every step "
            "keeps them zero and no weight is trained back between pruner steps.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )

    def check_attach(self) -> None:
        """Nothing to refuse: the lean masks need the hooks."""

    def optimizer_hooks(
        self,
        optimizer: Optimizer,
        targets: Callable[[], tuple[list[Tensor], list[Tensor]]],
        mask_gradients: bool,
        generation: Callable[[], int],
    ) -> OptimizerHooks:
        """The gradient, weight and state hooks of one optimizer."""
        return OptimizerHooks(optimizer, targets, mask_gradients, generation, self._gradient_masks)

    def masked(self, targets: Sequence[Target]) -> tuple[list[Tensor], list[Tensor]]:
        """The parameters and lean masks of the targets that have one, read now."""
        return masked_targets(self.mask, targets)


def _sharding(targets: Sequence[Target]) -> Sharding:
    """The targets' sharding, checked by ``dtensor_targets.sharding_of``."""
    labels = [f"{target.label} ({target.name!r})" for target in targets]
    return sharding_of([target.parameter() for target in targets], labels)


def _version(param: Tensor) -> int:
    return int(local_tensor(param.detach())._version)


def _settle(settled: dict[int, int], params: Sequence[Tensor]) -> None:
    for param in params:
        settled[id(param)] = _version(param)


def _global_revived(params: Sequence[Tensor], masks: Sequence[Tensor]) -> list[int]:
    """:func:`~tensorplay.ao.pruning.masking.lean_masks.revived_counts` over all ranks."""
    return sum_over_ranks(revived_counts(params, masks), params)
