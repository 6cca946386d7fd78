"""The masking protocol: what the pruner asks of the way its masks are held.

The :class:`~tensorplay.ao.pruning.pruner.Pruner` decides *what* to prune (the schedule, the
budget, the scores); a :class:`MaskingMode` decides *how* a mask is held and kept. There are
two, chosen once from ``masking=`` by :func:`~tensorplay.ao.pruning.masking.masking_mode`:

* :class:`~tensorplay.ao.pruning.masking.reparametrized.ReparametrizedMasks`
  (``"reparametrize"``): torch's ``<name>_orig``, float ``<name>_mask`` and forward pre-hook.
* :class:`~tensorplay.ao.pruning.masking.lean.LeanMasks` (``"inplace"``): a bool
  ``<name>_mask`` beside the plain parameter, pruned weights zeroed in place and kept zero by
  optimizer hooks; the one mode that holds FSDP2 ``DTensor`` targets.

A third mode implements this protocol and is added to the factory's table; nothing else in the
pruner changes. Every method takes the pruner's targets
(:class:`~tensorplay.ao.pruning.targets.tied.Target`: each parameter once, with all its
holders) and checks before it changes anything.

Example:
    >>> from tensorplay.ao.pruning.masking import masking_mode
    >>> isinstance(masking_mode("inplace"), MaskingMode)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from torch import Tensor, nn
from torch.optim import Optimizer

from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.selection.shards import is_sharded

if TYPE_CHECKING:
    from tensorplay.ao.pruning.masking.optimizer_hooks import OptimizerHooks
    from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["MaskingMode", "check_shards", "masked_targets", "own_masks"]


@runtime_checkable
class MaskingMode(Protocol):
    """How a pruner holds, applies and keeps its masks.

    Attributes:
        name: The ``masking=`` value that chooses the mode.
        holds_dtensors: Whether targets may be FSDP2 ``DTensor`` shards.
        hooks_optimizers: Whether optimizers must be attached (``Pruner.attach``) to keep the
            pruned weights pruned through their steps.
    """

    name: str
    holds_dtensors: bool
    hooks_optimizers: bool

    def check_targets(self, targets: Sequence[Target]) -> None:
        """Refuse targets this mode cannot hold (pruned the other way, sharded, ...)."""

    def check_step(self, targets: Sequence[Target], method: type[BasePruningMethod]) -> None:
        """Refuse, before anything changes, a pruning step with ``method`` it cannot take."""

    def mask(self, module: nn.Module, name: str) -> Tensor | None:
        """The mask this mode holds for ``module.<name>`` (0/``False``: pruned), if any."""

    def ensure_masks(self, targets: Sequence[Target]) -> None:
        """Give every target without a mask an all-kept one (checkpoint keys stay the same)."""

    def prune(
        self,
        targets: Sequence[Target],
        scores: Sequence[Tensor],
        method: type[BasePruningMethod],
        count: int,
        caps: Sequence[int] | None,
    ) -> None:
        """Prune ``count`` more units over ``targets`` together, lowest ``scores`` first as
        ``method`` orders them; with ``caps``, at most ``caps[i]`` from target ``i``."""

    def prune_own_count(
        self,
        targets: Sequence[Target],
        scores: Sequence[Tensor],
        method: type[BasePruningMethod],
    ) -> None:
        """Apply a method that decides its own count to each target on its own."""

    def prune_each(
        self,
        targets: Sequence[Target],
        scores: Sequence[Tensor],
        clear: Callable[[int, Tensor, Tensor], None],
    ) -> None:
        """Let ``clear(i, scores, keep)`` clear bits of target ``i``'s bool keep mask (this
        rank's pieces of both; ``True``: kept), then hold the result as the target's mask
        (``scope="row"``: :mod:`~tensorplay.ao.pruning.structured.units.row_pruning` chooses the
        units)."""

    def pruned_counts(self, targets: Sequence[Target], *, read_weights: bool = True) -> list[int]:
        """Per target, the units that are pruned, as the weights hold them; without
        ``read_weights`` as the masks say (within a step, right after the weights were
        checked)."""

    def after_rewind(self, target: Target) -> None:
        """Re-apply the mask of ``target`` after its values were replaced."""

    def make_permanent(self, targets: Sequence[Target]) -> None:
        """Drop the masks, keeping the zeros; ties are restored."""

    def mask_gradients(self, targets: Sequence[Target]) -> None:
        """Zero the pruned entries of the targets' gradients (where autograd does not)."""

    def apply_masks(self, targets: Sequence[Target]) -> None:
        """Zero the pruned entries of the targets' weights (where the forward does not)."""

    def check_weights(self, targets: Sequence[Target], *, attached: bool) -> None:
        """At a pruner step: make sure the weights hold what the masks say, or say why not."""

    def check_attach(self) -> None:
        """Refuse optimizer hooks if the mode needs none."""

    def optimizer_hooks(
        self,
        optimizer: Optimizer,
        targets: Callable[[], tuple[list[Tensor], list[Tensor]]],
        mask_gradients: bool,
        generation: Callable[[], int],
    ) -> OptimizerHooks:
        """The hooks that keep ``optimizer``'s steps from reviving pruned weights."""

    def masked(self, targets: Sequence[Target]) -> tuple[list[Tensor], list[Tensor]]:
        """The parameters and masks of the targets that have a mask, read now."""


def masked_targets(
    mask: Callable[[nn.Module, str], Tensor | None], targets: Sequence[Target]
) -> tuple[list[Tensor], list[Tensor]]:
    """The parameters (``<name>_orig`` while reparametrized) and masks of the targets that
    ``mask`` (a mode's :meth:`MaskingMode.mask`) finds one for, read now.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.targets.tied import Target
        >>> layer = nn.Linear(2, 1)
        >>> targets = [Target(("weight",), ((layer, "weight"),))]
        >>> masked_targets(lambda module, name: torch.ones(1, 2), targets)[0][0] is layer.weight
        True
    """
    params: list[Tensor] = []
    masks: list[Tensor] = []
    for target in targets:
        found = mask(*target.pair)
        if found is not None:
            params.append(target.parameter())
            masks.append(found)
    return params, masks


def own_masks(
    method: BasePruningMethod,
    targets: Sequence[Target],
    scores: Sequence[Tensor],
    defaults: Sequence[Tensor],
) -> list[Tensor]:
    """Each target's new mask from ``method.compute_mask`` (a method that decides its own count),
    given its scores and its current mask; every mask is computed and checked before any is
    used.

    Raises:
        ValueError: A mask of another shape than the target's, naming the target.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.parity.methods import Identity
        >>> from tensorplay.ao.pruning.targets.tied import Target
        >>> layer = nn.Linear(2, 1)
        >>> target = Target(("weight",), ((layer, "weight"),))
        >>> own_masks(Identity(), [target], [layer.weight.detach()], [torch.ones(1, 2)])
        [tensor([[1., 1.]])]
    """
    masks = []
    for target, score, default in zip(targets, scores, defaults, strict=True):
        new_mask = method.compute_mask(score, default_mask=default.clone())
        if not isinstance(new_mask, Tensor) or new_mask.shape != default.shape:
            got = tuple(new_mask.shape) if isinstance(new_mask, Tensor) else repr(new_mask)
            raise ValueError(
                f"Expected {type(method).__name__}.compute_mask to return a mask of shape "
                f"{tuple(default.shape)} for {target.name!r}, but got {got}."
            )
        masks.append(new_mask.detach())
    return masks


def check_shards(mode: MaskingMode, targets: Sequence[Target]) -> None:
    """Refuse ``DTensor`` (FSDP2) targets for a mode that cannot hold them, before anything is
    built on them (a structure's units are recorded on the model).

    Raises:
        ValueError: Naming the first sharded target and the mode that holds it.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.masking import masking_mode
        >>> from tensorplay.ao.pruning.targets.tied import Target
        >>> layer = nn.Linear(2, 1)
        >>> check_shards(masking_mode("reparametrize"), [Target(("weight",), ((layer, "weight"),))])
    """
    if mode.holds_dtensors:
        return
    for target in targets:
        if is_sharded(target.parameter()):
            raise ValueError(
                f"Expected plain tensors with masking={mode.name!r}, but {target.name!r} is a "
                "DTensor (FSDP2): the reparametrization cannot hold sharded parameters; use "
                "masking='inplace'."
            )
