"""The reparametrization as a masking mode: torch's ``<name>_orig``, ``<name>_mask`` and hook.

``masking="reparametrize"`` (the default). The parameter becomes ``<name>_orig``, its mask a
buffer ``<name>_mask`` of the parameter's dtype, and ``module.<name> = mask * orig`` is
recomputed by a forward pre-hook before every forward, as :mod:`torch.nn.utils.prune` does, so
state_dicts move between the two libraries. Autograd masks the gradients and the pruned values
stay recoverable in ``<name>_orig`` until :meth:`ReparametrizedMasks.make_permanent`.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.methods import L1Unstructured
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(4, 2)
    >>> targets = [Target(("weight",), ((layer, "weight"),))]
    >>> mode = ReparametrizedMasks()
    >>> mode.prune(targets, [layer.weight.detach()], L1Unstructured, 3, None)
    >>> mode.pruned_counts(targets), sorted(layer.state_dict())
    ([3], ['bias', 'weight_mask', 'weight_orig'])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from tensorplay.ao.pruning.masking.lean_masks import is_lean_tensor
from tensorplay.ao.pruning.masking.mode import masked_targets, own_masks
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.global_unstructured import prune_globally, share_mask
from tensorplay.ao.pruning.parity.methods import remove
from tensorplay.ao.pruning.parity.reparametrization import is_pruned_tensor, pruned_parts
from tensorplay.ao.pruning.selection.shards import global_zeros, is_sharded

if TYPE_CHECKING:
    from tensorplay.ao.pruning.pair import Pair
    from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["ReparametrizedMasks"]


class ReparametrizedMasks:
    """``masking="reparametrize"``: see the module docstring.

    Example:
        >>> ReparametrizedMasks().name, ReparametrizedMasks().holds_dtensors
        ('reparametrize', False)
    """

    name = "reparametrize"
    holds_dtensors = False
    hooks_optimizers = False

    def check_targets(self, targets: Sequence[Target]) -> None:
        """Refuse ``DTensor`` targets and targets that carry a lean bool mask.

        Raises:
            ValueError: naming the tensor and what it is.
        """
        for target in targets:
            for (module, name), fq_name in zip(target.pairs, target.names, strict=False):
                label = f"({type(module).__name__}, {name!r}) ({fq_name!r})"
                if is_sharded(module._parameters.get(name)):
                    raise ValueError(
                        f"Expected {label} to be a plain tensor, since the pruner has "
                        "masking='reparametrize', but it is a DTensor (FSDP2): the "
                        "reparametrization cannot hold sharded parameters; use masking='inplace'."
                    )
                if is_lean_tensor(module, name):
                    raise ValueError(
                        f"Expected {label} not to carry a lean bool mask, since the pruner has "
                        f"masking='reparametrize', but it has the bool buffer `{name}_mask`: use "
                        "masking='inplace'."
                    )

    def check_step(self, targets: Sequence[Target], method: type[BasePruningMethod]) -> None:
        """Refuse ``DTensor`` targets (sharded after the pruner was made).

        Raises:
            ValueError: Some target is a ``DTensor``.
        """
        if any(is_sharded(target.parameter()) for target in targets):
            names = [target.name for target in targets]
            raise ValueError(
                f"Expected plain tensors with masking='reparametrize', but {names} are "
                "DTensors (FSDP2): use masking='inplace'."
            )

    def mask(self, module: nn.Module, name: str) -> Tensor | None:
        """The float ``<name>_mask`` of a reparametrized tensor, else ``None``."""
        parts = pruned_parts(module, name)
        return None if parts is None else parts.mask

    def ensure_masks(self, targets: Sequence[Target]) -> None:
        """Reparametrize every target not pruned yet with an all-ones mask that every holder of
        a tied target shares."""
        for target in targets:
            if not any(is_pruned_tensor(module, name) for module, name in target.pairs):
                ones = torch.ones_like(target.parameter(), memory_format=torch.contiguous_format)
                share_mask(list(target.pairs), ones.detach())

    def prune(
        self,
        targets: Sequence[Target],
        scores: Sequence[Tensor],
        method: type[BasePruningMethod],
        count: int,
        caps: Sequence[int] | None,
    ) -> None:
        """``global_unstructured`` over every pair of ``targets``; the pairs of a tied target
        share its scores (one tensor), so they share one mask."""
        pairs: list[Pair] = []
        shared: dict[Pair, Tensor] = {}
        for target, score in zip(targets, scores, strict=True):
            for pair in target.pairs:
                pairs.append(pair)
                shared[pair] = score
        limits = None
        if caps is not None:
            limits = {target.pair: cap for target, cap in zip(targets, caps, strict=True)}
        prune_globally(pairs, method, shared, {"amount": count}, caps=limits)

    def prune_own_count(
        self,
        targets: Sequence[Target],
        scores: Sequence[Tensor],
        method: type[BasePruningMethod],
    ) -> None:
        """Each target's mask becomes ``method``'s mask times its current one."""
        defaults = [self._mask_or_ones(target) for target in targets]
        new_masks = own_masks(method(), targets, scores, defaults)
        for target, new_mask, mask in zip(targets, new_masks, defaults, strict=True):
            combined = new_mask.to(dtype=mask.dtype) * mask
            share_mask(target.pairs, combined.to(dtype=target.parameter().dtype))

    def prune_each(
        self,
        targets: Sequence[Target],
        scores: Sequence[Tensor],
        clear: Callable[[int, Tensor, Tensor], None],
    ) -> None:
        """Every new bool keep mask is computed, then each becomes the target's float mask."""
        keeps = []
        for index, (target, score) in enumerate(zip(targets, scores, strict=True)):
            keep = self._mask_or_ones(target) != 0
            clear(index, score.detach().to(keep.device), keep)
            keeps.append(keep)
        for target, keep in zip(targets, keeps, strict=True):
            share_mask(target.pairs, keep.to(dtype=target.parameter().dtype))

    def _mask_or_ones(self, target: Target) -> Tensor:
        mask = self.mask(*target.pair)
        return torch.ones_like(target.parameter()) if mask is None else mask.detach()

    def pruned_counts(self, targets: Sequence[Target], *, read_weights: bool = True) -> list[int]:
        """The zeros of each target's mask (0 where not reparametrized): the forward computes
        ``mask * orig``, so the weights hold them whatever ``orig`` holds."""
        return global_zeros([self.mask(*target.pair) for target in targets])

    def after_rewind(self, target: Target) -> None:
        """Recompute ``module.<name>`` as the forward pre-hook would, so it is not stale."""
        for module, name in target.pairs:
            parts = pruned_parts(module, name)
            if parts is not None:
                setattr(module, name, parts.mask.to(dtype=parts.orig.dtype) * parts.orig)

    def make_permanent(self, targets: Sequence[Target]) -> None:
        """``remove`` every holder; pruned units hold ``+0.0``."""
        for target in targets:
            for module, name in target.pairs:
                if is_pruned_tensor(module, name):
                    # The second holder of a tied parameter recomputes mask * (masked values):
                    # the same values, and the same Parameter object is registered again.
                    remove(module, name)
            with torch.no_grad():
                # mask * orig is -0.0 where a negative weight was pruned; +0.0 is the same value
                # and lets a bit-exact sparse export (save_sparse) store every pruned unit as 0.
                target.parameter().add_(0.0)

    def mask_gradients(self, targets: Sequence[Target]) -> None:
        """Nothing: autograd masks the gradients through ``mask * orig``."""

    def apply_masks(self, targets: Sequence[Target]) -> None:
        """Nothing: the forward pre-hook applies the masks."""

    def check_weights(self, targets: Sequence[Target], *, attached: bool) -> None:
        """Nothing: the forward computes with ``mask * orig`` whatever ``orig`` holds."""

    def optimizer_hooks(
        self,
        optimizer: Optimizer,
        targets: Callable[[], tuple[list[Tensor], list[Tensor]]],
        mask_gradients: bool,
        generation: Callable[[], int],
    ) -> NoReturn:
        """Refused, as :meth:`check_attach`.

        Raises:
            ValueError: Always.
        """
        self.check_attach()
        raise AssertionError("unreachable")  # check_attach raises

    def check_attach(self) -> NoReturn:
        """Refused: the reparametrization masks through autograd and needs no optimizer hooks.

        Raises:
            ValueError: Always.
        """
        raise ValueError(
            "Expected a pruner with masking='inplace' to attach optimizers to, but got "
            f"masking={self.name!r}: the reparametrization masks through autograd and "
            "needs no optimizer hooks."
        )

    def masked(self, targets: Sequence[Target]) -> tuple[list[Tensor], list[Tensor]]:
        """The ``<name>_orig`` parameters and float masks of the reparametrized targets."""
        return masked_targets(self.mask, targets)
