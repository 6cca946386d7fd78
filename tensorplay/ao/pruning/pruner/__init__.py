"""The pruner: a schedule driving the exact selection, from any training loop.

:class:`~tensorplay.ao.pruning.pruner.conductor.Pruner` is the conductor; its configuration,
state, schedules, scopes, targets, optimizers, rewinding and seeding live beside it, and
:func:`~tensorplay.ao.pruning.pruner.one_shot.prune_one_shot` runs it once after calibration.
"""

from tensorplay.ao.pruning.pruner.conductor import PrunedStep, Pruner

__all__ = ["PrunedStep", "Pruner"]
