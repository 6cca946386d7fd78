"""The importance scores by name: the one table ``importance=`` is looked up in.

A new score is one module in this package (a subclass of
:class:`~tensorplay.ao.pruning.importance.score.Importance`) and its line below; the
configuration, the pruner, the callbacks and YAML then accept its name.

Example:
    >>> sorted(IMPORTANCES)
    ['activation', 'frequency', 'magnitude', 'movement', 'reap', 'taylor', 'wanda']
    >>> make_importance("taylor", "bfloat16").dtype
    torch.bfloat16
"""

from __future__ import annotations

import torch

from tensorplay.ao.pruning.importance.activation import Activation
from tensorplay.ao.pruning.importance.expert_routing import Frequency, Reap
from tensorplay.ao.pruning.importance.magnitude import Magnitude
from tensorplay.ao.pruning.importance.movement import Movement
from tensorplay.ao.pruning.importance.score import Importance
from tensorplay.ao.pruning.importance.taylor import Taylor
from tensorplay.ao.pruning.importance.wanda import Wanda

__all__ = ["ACCUMULATOR_DTYPES", "IMPORTANCES", "make_importance"]

IMPORTANCES: dict[str, type[Importance]] = {
    Magnitude.name: Magnitude,
    Movement.name: Movement,
    Taylor.name: Taylor,
    Wanda.name: Wanda,
    Activation.name: Activation,
    Reap.name: Reap,
    Frequency.name: Frequency,
}
"""Each ``importance=`` value and its score's class."""

ACCUMULATOR_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""Each ``accumulator_dtype=`` value and its dtype."""


def make_importance(name: str, accumulator_dtype: str = "float32") -> Importance:
    """A new score object for ``importance=name`` (checked by ``PrunerConfig``).

    Raises:
        ValueError: An unknown name or dtype.
    """
    kind = IMPORTANCES.get(name)
    if kind is None:
        raise ValueError(
            f"Expected `importance` to be one of {tuple(IMPORTANCES)}, but got {name!r}."
        )
    dtype = ACCUMULATOR_DTYPES.get(accumulator_dtype)
    if dtype is None:
        raise ValueError(
            f"Expected `accumulator_dtype` to be one of {tuple(ACCUMULATOR_DTYPES)}, but got "
            f"{accumulator_dtype!r}."
        )
    return kind(dtype)
