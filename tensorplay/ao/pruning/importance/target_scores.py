"""Importance scores: what a pruning step ranks each target's units by.

By default a target's units are ranked by its current unpruned values (``<name>_orig`` while
reparametrized, rather than ``module.<name>``, which the forward pre-hook last computed before
the latest optimizer step); a pruner's ``importance`` (:mod:`~tensorplay.ao.pruning.importance`:
movement, Taylor, Wanda) or an ``importance_fn(module, name)`` gives scores of its own.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(2, 1)
    >>> targets = [Target(("weight",), ((layer, "weight"),))]
    >>> target_scores(targets, None)[0].equal(layer.weight)
    True
    >>> target_scores(targets, lambda module, name: torch.ones(1, 2))[0].tolist()
    [[1.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor, nn

from tensorplay.ao.pruning.importance.score import Importance
from tensorplay.ao.pruning.selection.shards import check_scores
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["ImportanceFn", "target_scores"]

ImportanceFn = Callable[[nn.Module, str], Tensor]


def target_scores(
    targets: Sequence[Target],
    importance_fn: ImportanceFn | None,
    importance: Importance | None = None,
) -> list[Tensor]:
    """Each target's scores, detached: ``importance_fn``'s of its canonical pair, else
    ``importance``'s (:meth:`~tensorplay.ao.pruning.importance.score.Importance.scores`), else
    its current unpruned values.

    Raises:
        ValueError: ``importance_fn`` returned something other than a tensor of the target's
            shape (placed like it, for a sharded target).
    """
    if importance_fn is None:
        return [score.detach() for score in (importance or Importance()).scores(targets)]
    scores = []
    for target in targets:
        param = target.parameter()
        score = importance_fn(*target.pair)
        if not isinstance(score, Tensor) or score.shape != param.shape:
            got = tuple(score.shape) if isinstance(score, Tensor) else repr(score)
            raise ValueError(
                f"Expected `importance_fn` to return a tensor of shape {tuple(param.shape)} "
                f"for {target.name!r}, but got {got}."
            )
        check_scores(score, param, repr(target.name))
        scores.append(score.detach())
    return scores
