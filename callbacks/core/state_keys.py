"""The adapters' state, as tensorplay 0.1 wrote it: no framework is imported here.

:func:`state_key_fields` (with :func:`schedule_key`) gives the fields of a callback's state key as
0.1's ``GradualPruning`` wrote them, and :func:`pruner_state` the pruner's state out of 0.1's
callback state, so checkpoints written by 0.1 stay resumable. Both adapters (Lightning's
``GradualPruning``, the Hugging Face ``GradualPruningCallback``) use them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.pruner.schedules import Schedule

__all__ = ["pruner_state", "schedule_key", "state_key_fields"]


def state_key_fields(config: PrunerConfig) -> dict[str, Any]:
    """The fields of ``GradualPruning``'s state key, in the order tensorplay 0.1 wrote them;
    ``names`` and ``keep_dense`` only when set, so keys written before they existed stay valid.

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> state_key_fields(PrunerConfig(OneShotSchedule(0.5), names=["fc"]))
        {'schedule': {'type': 'one_shot', 'sparsity': 0.5, 'step': 0},
         'method': 'l1_unstructured', 'parameters': None, 'module_types': None,
         'include': None, 'exclude': None, 'names': ['fc']}
    """
    fields: dict[str, Any] = {"schedule": schedule_key(config.schedule), "method": config.method}
    fields.update({key: _listed(getattr(config, key)) for key in _KEY_FIELDS})
    if config.names is not None:
        fields["names"] = list(config.names)
    if config.keep_dense:
        fields["keep_dense"] = list(config.keep_dense)
    return fields


_KEY_FIELDS = ("parameters", "module_types", "include", "exclude")


def _listed(value: Sequence[Any] | None) -> list[Any] | None:
    return None if value is None else list(value)


def schedule_key(schedule: Schedule) -> object:
    """The schedule as tensorplay 0.1 wrote it into the state key: ``{"type", **init_args}``,
    a built-in by its snake-case name (``CubicSchedule``: ``"cubic"``), a lambda by its repr.

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> schedule_key(OneShotSchedule(0.5))
        {'type': 'one_shot', 'sparsity': 0.5, 'step': 0}
    """
    try:
        data = schedule.to_dict()
    except (TypeError, ValueError):
        return repr(schedule)
    path = data["class_path"]
    cls = type(schedule)
    if cls.__module__ == Schedule.__module__:  # a built-in: by its name, wherever it lives
        path = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__.removesuffix("Schedule")).lower()
    return {"type": path, **data["init_args"]}


def pruner_state(state: dict[str, Any]) -> dict[str, Any]:
    """The pruner's state in ``state``: itself, or in a 0.1 checkpoint its ``"pruner"`` entry
    with the seed and snapshot that 0.1's callback kept beside it.

    Raises:
        ValueError: A state with a ``"pruner"`` entry whose version is not 1.

    Example:
        >>> old = {"version": 1, "pruner": {"version": 1, "step": 3}, "seed": 7, "snapshot": None}
        >>> pruner_state(old)
        {'version': 1, 'step': 3, 'seed': 7, 'snapshot': None}
    """
    if "pruner" not in state:
        return state
    if state.get("version") != 1:
        raise ValueError(
            f"Expected `GradualPruning` state version 1 or a pruner state, but got "
            f"{state.get('version')!r}."
        )
    return {**state["pruner"], "seed": state["seed"], "snapshot": state["snapshot"]}
