"""Scores accumulated from gradients, once per optimizer step: the shared machinery.

A gradient score keeps one accumulator per target, of the target's shape, on its device (a
``DTensor`` placed like it under FSDP2), in ``float32`` (4 bytes per pruned parameter) or
``bfloat16`` (2 bytes), made at the first step that has a gradient. Each call of
:meth:`GradientScore.accumulate` adds one step's term from the parameter (``<name>_orig`` while
reparametrized: the unpruned values) and its gradient (the optimizer's, masked: a pruned unit
adds nothing), and counts the step for that target. What the term is and when it is reset are
the subclass's (:mod:`~tensorplay.ao.pruning.importance.movement`,
:mod:`~tensorplay.ao.pruning.importance.taylor`).

A step whose gradients are not all finite adds nothing (:attr:`GradientScore.skipped` counts
it): it is the step AMP's ``GradScaler`` skips, and one ``inf`` would otherwise stay in a total
for good. Under FSDP2 the ranks agree on it (one small ``all_reduce``).

Under DDP the gradients are all-reduced before the optimizer step, so every rank accumulates
the same values and the masks stay identical with no extra collective.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from tensorplay.ao.pruning.importance.score import Importance, UnitLayout
from tensorplay.ao.pruning.selection.sharding import local_part
from tensorplay.ao.pruning.selection.shards import sum_over_ranks
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["GradientScore"]


class GradientScore(Importance):
    """Accumulators of a per-step term of ``(weight, gradient)``, by target name.

    Attributes:
        resets: Whether the accumulators restart after each pruning step.
        skipped: Steps not accumulated because a gradient held ``inf`` or ``NaN`` (since this
            object was made; not part of the state).
    """

    needs_gradients: ClassVar[bool] = True
    resets: ClassVar[bool] = False

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(dtype)
        self._sums: dict[str, Tensor] = {}
        self._steps: dict[str, int] = {}
        self.skipped = 0

    def add(self, total: Tensor, weight: Tensor, grad: Tensor) -> None:
        """Add one step's term to ``total`` in place."""
        raise NotImplementedError

    def rank(self, total: Tensor) -> Tensor:
        """The scores the method ranks, from the accumulated ``total`` (lowest pruned first)."""
        return total

    def bind(self, targets: Sequence[Target], units: Sequence[UnitLayout] = ()) -> None:
        """Every target starts at zero steps."""
        del units  # element scores: the structure reduces them per unit
        self._steps = {target.name: self._steps.get(target.name, 0) for target in targets}

    def accumulate(self, targets: Sequence[Target]) -> int:
        """Add the targets' current gradients (those without one are left out); add nothing
        if any of them is not finite."""
        held = [target for target in targets if target.parameter().grad is not None]
        with torch.no_grad():
            grads = [target.parameter().grad for target in held]
            if not _all_finite([grad for grad in grads if grad is not None]):
                self.skipped += 1
                return 0
            for target in held:
                param = target.parameter()
                assert param.grad is not None
                self.add(self._total(target.name, param), param.detach(), param.grad.detach())
                self._steps[target.name] = self._steps.get(target.name, 0) + 1
        return len(held)

    def _total(self, name: str, param: Tensor) -> Tensor:
        total = self._sums.get(name)
        if total is None or total.device != param.device:
            fresh = torch.zeros_like(param, dtype=self.dtype, memory_format=torch.contiguous_format)
            total = fresh if total is None else total.to(param.device)
            self._sums[name] = total
        return total

    def check_ready(self, targets: Sequence[Target]) -> None:
        """Raises:
        RuntimeError: A target that no accumulated step had a gradient for, naming them.
        """
        unseen = [target.name for target in targets if not self._steps.get(target.name)]
        if unseen:
            raise RuntimeError(
                f"Expected importance={self.name!r} to have accumulated gradients of every "
                f"target before a pruning step, but {unseen} have none: call "
                "pruner.accumulate() before each optimizer step (after backward, once the "
                "gradients are unscaled), or pruner.attach(optimizer) to have its steps do it."
            )

    def scores(self, targets: Sequence[Target]) -> list[Tensor]:
        """:meth:`rank` of each target's accumulated total."""
        return [self.rank(self._sums[target.name]) for target in targets]

    def after_pruning(self) -> None:
        """Zero the totals and step counts if :attr:`resets`."""
        if not self.resets:
            return
        for total in self._sums.values():
            total.zero_()
        self._steps = dict.fromkeys(self._steps, 0)

    def totals(self) -> dict[str, Tensor]:
        """The accumulated totals by target name (movement's ``-sum_t w_t * g_t``, Taylor's
        ``sum_t |w_t * g_t|``), not cloned."""
        return dict(self._sums)

    def steps(self) -> dict[str, int]:
        """Steps accumulated, by target name, since the last reset."""
        return dict(self._steps)

    def state_dict(self) -> dict[str, Any]:
        """``{"dtype", "steps", "sums"}``: the totals by target name (not cloned)."""
        return {
            "dtype": str(self.dtype).removeprefix("torch."),
            "steps": dict(self._steps),
            "sums": dict(self._sums),
        }

    def load_state_dict(self, state: Mapping[str, Any], targets: Sequence[Target]) -> None:
        """Copy the saved totals onto the targets' devices, in this score's dtype (``{}``: start
        afresh, as a state saved before importance scores or under another score).

        Raises:
            ValueError: Other keys, unknown targets, or totals of another shape.
        """
        if not state:
            self._sums, self._steps = {}, dict.fromkeys(self._steps, 0)
            return
        if set(state) != {"dtype", "steps", "sums"}:
            raise ValueError(
                f"Expected an importance state with keys ['dtype', 'steps', 'sums'] for "
                f"importance={self.name!r}, but got {sorted(state)}."
            )
        params = {target.name: target.parameter() for target in targets}
        unknown = sorted(set(state["steps"]) - set(params))
        if unknown or not set(state["sums"]) <= set(params):
            raise ValueError(
                f"Expected the importance state's targets to be the pruner's, {list(params)}, "
                f"but got {sorted(set(state['steps']) | set(state['sums']))}."
            )
        sums = {}
        for name, value in state["sums"].items():
            if tuple(value.shape) != tuple(params[name].shape):
                raise ValueError(
                    f"Expected the accumulated {self.name} scores of {name!r} to have shape "
                    f"{tuple(params[name].shape)}, but got {tuple(value.shape)}."
                )
            fresh = torch.zeros_like(
                params[name], dtype=self.dtype, memory_format=torch.contiguous_format
            )
            sums[name] = fresh.copy_(value)
        self._sums = sums
        self._steps = {name: int(state["steps"].get(name, 0)) for name in params}


def _all_finite(grads: Sequence[Tensor]) -> bool:
    """Whether every entry of every gradient is finite, on every rank that holds a piece."""
    # A sum is NaN or inf iff an entry is (or the float32 sum overflows, past 1e38 / numel a
    # value): one vectorized read, about 40 times cheaper on the CPU than isfinite().all().
    flags = [local_part(grad).sum(dtype=torch.float32).isfinite().logical_not() for grad in grads]
    # All the checks are queued before the first read, so a GPU waits once.
    bad = [int(flag.item()) for flag in flags]
    return not any(sum_over_ranks(bad, grads))
