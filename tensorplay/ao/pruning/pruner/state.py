"""The pruner's state: what changes as it runs, as plain data by name, and its versions.

:class:`Progress` is everything a :class:`~tensorplay.ao.pruning.pruner.Pruner` learns while it
runs (its configuration does not change): the steps taken and pruned, the history, whether
pruning is permanent, the seed in use and the rewind snapshot. :func:`state_dict` writes it with
the configuration it ran under; :func:`load_progress` reads any version this library has
written, upgrading the older ones, and checks every key before the pruner takes it.

Versions: 1 (tensorplay 0.1: no rewinding, no seed), 2 (rewinding and seeds), 3 (``masking``),
4 (``importance`` and ``importance_state``: the accumulators of a gradient score or Wanda's
input norms, so a run resumed mid-accumulation continues bit for bit; an older state upgrades to
``"magnitude"`` with no accumulators), 5 (``structure`` and ``multiple_of``; an older state
upgrades to ``"element"`` and 1).

Example:
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.config import PrunerConfig
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> from tensorplay.ao.pruning.pruner.selected_targets import resolve_targets
    >>> config = PrunerConfig(OneShotSchedule(0.5))
    >>> targets = resolve_targets(nn.Linear(2, 2), config)
    >>> saved = state_dict(Progress(seed=None), config, targets)
    >>> saved["version"], saved["step"], load_progress(saved, config, targets).last_step
    (5, -1, -1)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from tensorplay.ao.pruning.frames import user_stacklevel
from tensorplay.ao.pruning.pruner.config import PrunerConfig, check_int
from tensorplay.ao.pruning.pruner.rewind import check_values
from tensorplay.ao.pruning.pruner.schedules import Schedule
from tensorplay.ao.pruning.targets.parameters import method_name
from tensorplay.ao.pruning.targets.tied import Target
from tensorplay.moved import new_name

__all__ = ["LATENCY_TABLE", "STATE_VERSION", "Progress", "load_progress", "state_dict"]

STATE_VERSION = 5
LATENCY_TABLE = "latency_table"
"""The key of a pruner with ``target_latency``: the latency table its units are priced from
(:meth:`~tensorplay.ao.pruning.structured.units.latency.LatencyTable.to_dict`), which a resumed
pruner takes in place of the one it measured, so it prunes exactly as the first run. Written by
such pruners only, besides the keys of the version; a pruner without the budget ignores it."""
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
_STATE_KEYS_V3 = (*_STATE_KEYS_V2, "masking")
_STATE_KEYS_V4 = (*_STATE_KEYS_V3, "importance", "importance_state")
_STATE_KEYS = (*_STATE_KEYS_V4, "structure", "multiple_of")
# A version-1 state may carry the seed and snapshot that the 0.1 callback kept beside it.
_V1_OPTIONAL = ("seed", "snapshot")
_CONFIG_KEYS = (
    *("schedule", "method", "scope", "min_density", "rewind", "rewind_step", "masking"),
    *("importance", "structure", "multiple_of"),
)

HistoryEntry = tuple[int, float, int]


@dataclass
class Progress:
    """What a pruner has done so far.

    Attributes:
        seed: The seed of random methods (the configuration's, or the one a state loaded).
        last_step: The last step taken (-1 before the first).
        last_pruned_step: The last pruning step taken, whether it pruned or not (-1: none).
        history: ``(step, target sparsity, units pruned)`` of each step that pruned.
        permanent: Whether pruning was made permanent.
        snapshot: The values rewinding restores, by target name, if taken.
        importance: The importance score's state (its accumulators), as its ``state_dict()``
            wrote it; ``{}`` if it has none or ran under another score.
        latency_table: The latency table a ``target_latency`` pruner priced its units from
            (:data:`LATENCY_TABLE`), as a state held it; ``None`` if it held none.
    """

    seed: int | None
    last_step: int = -1
    last_pruned_step: int = -1
    history: list[HistoryEntry] = field(default_factory=list)
    permanent: bool = False
    snapshot: dict[str, Tensor] | None = None
    importance: dict[str, Any] = field(default_factory=dict)
    latency_table: dict[str, Any] | None = None

    def pruning_due(self, schedule: Schedule, step: int) -> bool:
        """Whether ``step`` prunes: a pruning step of ``schedule`` lies between the last step
        taken (or pruned) and ``step`` (a counter that jumps past a pruning step prunes at the
        first step after it, to the schedule's target there), or ``step`` is a pruning step not
        pruned yet.

        Example:
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> progress = Progress(seed=None, last_step=4)
            >>> [progress.pruning_due(OneShotSchedule(0.5, step=5), step) for step in (4, 6)]
            [False, True]
        """
        if step > self.last_step:
            after = max(self.last_step, self.last_pruned_step)
            return schedule.latest_pruning_step(after, step) is not None
        return schedule.should_prune(step) and step > self.last_pruned_step


def state_dict(
    progress: Progress,
    config: PrunerConfig,
    targets: Sequence[Target],
    importance: Mapping[str, Any] | None = None,
    latency_table: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``progress`` with the configuration it ran under, as the pruner's ``state_dict()``;
    ``importance`` is the score's own state (``Importance.state_dict()``), its tensors cloned;
    ``latency_table`` the table a ``target_latency`` pruner prices from, under
    :data:`LATENCY_TABLE` (no such key without one)."""
    try:
        schedule: dict[str, Any] | None = config.schedule.to_dict()
    except (TypeError, ValueError):
        schedule = None
    table = {} if latency_table is None else {LATENCY_TABLE: dict(latency_table)}
    return {
        "version": STATE_VERSION,
        "step": progress.last_step,
        "last_pruned_step": progress.last_pruned_step,
        "targets": [target.name for target in targets],
        "schedule": schedule,
        "method": method_name(config.method_class),
        "scope": config.scope,
        "min_density": float(config.min_density),
        "rewind": config.rewind,
        "rewind_step": config.rewind_step,
        "seed": progress.seed,
        "history": list(progress.history),
        "permanent": progress.permanent,
        "snapshot": None if progress.snapshot is None else dict(progress.snapshot),
        "masking": config.masking,
        "importance": config.importance,
        "importance_state": _cloned(importance or {}),
        "structure": config.structure,
        "multiple_of": config.multiple_of,
        **table,
    }


def _cloned(value: Any) -> Any:
    """``value`` with every tensor cloned (the accumulators go on changing after a save)."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {key: _cloned(item) for key, item in value.items()}
    return value


def load_progress(
    state: Mapping[str, Any],
    config: PrunerConfig,
    targets: Sequence[Target],
    seed: int | None = None,
) -> Progress:
    """The progress a saved state holds, checked; warns where it ran under another
    configuration (the pruner keeps its own).

    Args:
        state: What ``state_dict()`` returned, of any version.
        config: The loading pruner's configuration.
        targets: The loading pruner's targets.
        seed: The loading pruner's seed, kept by a version-1 state that has none.

    Raises:
        TypeError: ``state`` or its snapshot is not a mapping.
        ValueError: An unknown version, missing or unknown keys, other targets, bad counters,
            a bad seed, or a snapshot of other names or shapes.
    """
    state = _with_current_paths(_upgraded(state, config, seed))
    _check_targets(state["targets"], targets)
    for key in ("step", "last_pruned_step"):
        value = state[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            raise ValueError(f"Expected `{key}` to be an int >= -1, but got {value!r}.")
    history = [_history_entry(entry) for entry in state["history"]]
    if not isinstance(state["permanent"], bool):
        raise ValueError(f"Expected `permanent` to be a bool, but got {state['permanent']!r}.")
    if state["seed"] is not None:
        check_int("seed", state["seed"], 0)
    snapshot = state["snapshot"]
    if snapshot is not None:
        found = check_values(snapshot, targets, "snapshot")
        snapshot = {targets[i].name: value for i, value in found.items()}
    _warn_on_config_change(state, state_dict(Progress(seed), config, targets))
    same_score = state["importance"] == config.importance
    if not isinstance(state["importance_state"], Mapping):
        raise TypeError(
            f"Expected `importance_state` to be a mapping, but got {state['importance_state']!r}."
        )
    return Progress(
        seed=state["seed"],
        last_step=state["step"],
        last_pruned_step=state["last_pruned_step"],
        history=history,
        permanent=state["permanent"],
        snapshot=snapshot if config.rewind != "none" else None,
        importance=dict(state["importance_state"]) if same_score else {},
        latency_table=state.get(LATENCY_TABLE),
    )


def _upgraded(state: object, config: PrunerConfig, seed: int | None) -> dict[str, Any]:
    """``state`` checked for its version's keys and brought to the current version."""
    if not isinstance(state, Mapping):
        raise TypeError(f"Expected `state` to be a mapping, but got {state!r}.")
    version = state.get("version")
    if version not in (1, 2, 3, 4, STATE_VERSION):
        raise ValueError(
            f"Expected a pruner state of version 1, 2, 3, 4 or {STATE_VERSION}, but got version "
            f"{version!r}."
        )
    expected = {1: _STATE_KEYS_V1, 2: _STATE_KEYS_V2, 3: _STATE_KEYS_V3, 4: _STATE_KEYS_V4}.get(
        version, _STATE_KEYS
    )
    optional = (*(_V1_OPTIONAL if version == 1 else ()), LATENCY_TABLE)
    missing = [key for key in expected if key not in state]
    unknown = sorted(key for key in state if key not in expected + optional)
    if missing or unknown:
        raise ValueError(
            f"Expected a version-{version} pruner state to have keys {list(expected)}, but "
            f"{missing} are missing and {unknown} are unknown."
        )
    if version == 1:
        # Saved before rewinding and seeds: the pruner's own rewinding, its seed and no snapshot
        # unless given; its schedule (in the old ``{"type"}`` form) is left out of the comparison.
        return {
            "seed": seed,
            "snapshot": None,
            **state,
            "version": STATE_VERSION,
            "schedule": None,
            "rewind": config.rewind,
            "rewind_step": config.rewind_step,
            "masking": None,
            **_MAGNITUDE,
            **_ELEMENT,
        }
    if version == 2:  # saved before the lean mode existed: reparametrized
        upgraded = {**state, "masking": "reparametrize", **_MAGNITUDE, **_ELEMENT}
        return {**upgraded, "version": STATE_VERSION}
    if version == 3:  # saved before importance scores: magnitude, no accumulators
        return {**state, "version": STATE_VERSION, **_MAGNITUDE, **_ELEMENT}
    if version == 4:  # saved before structures: single weights
        return {**state, "version": STATE_VERSION, **_ELEMENT}
    return dict(state)


def _with_current_paths(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its schedule's ``class_path`` as this version names it: a state saved
    before a module moved names the same class by its earlier path
    (:mod:`tensorplay.moved`), which is not another configuration."""
    schedule = state.get("schedule")
    if isinstance(schedule, Mapping) and isinstance(schedule.get("class_path"), str):
        current = new_name(schedule["class_path"])
        if current is not None:
            state = {**state, "schedule": {**schedule, "class_path": current}}
    return state


_MAGNITUDE: dict[str, Any] = {"importance": "magnitude", "importance_state": {}}
_ELEMENT: dict[str, Any] = {"structure": "element", "multiple_of": 1}


def _check_targets(saved: Sequence[str], targets: Sequence[Target]) -> None:
    """A state may name a tied target by another of its names (its first name in module order
    is the pruner's); any name of it is the same target."""
    canonical = {alias: target.name for target in targets for alias in target.names}
    mine = [target.name for target in targets]
    if list(dict.fromkeys(canonical.get(name, name) for name in saved)) != mine:
        raise ValueError(
            f"Expected the state's targets to be the pruner's, {mine}, but got {list(saved)}."
        )


def _history_entry(entry: object) -> HistoryEntry:
    if not isinstance(entry, (tuple, list)) or len(entry) != 3:
        raise ValueError(
            f"Expected `history` entries to be (step, target, pruned), but got {entry!r}."
        )
    step, target, pruned = entry
    return int(step), float(target), int(pruned)


def _warn_on_config_change(state: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
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
            stacklevel=user_stacklevel(),
        )
