"""Sparsity schedules: an optimizer step in, a cumulative target sparsity out.

A schedule is a small frozen dataclass. Calling it with a step gives the fraction of the selected
units that should be pruned once that step is done; :meth:`Schedule.should_prune` says whether the
step is a pruning step, and :meth:`Schedule.latest_pruning_step` finds the last one in a range of
steps (a step counter that jumps past a pruning step prunes at the first step after it).
Between pruning steps the target is held at the value of the last pruning step, and after the
window it is held at its final value, so the value never depends on how often it is asked.
Schedules speak in *cumulative* sparsity; the pruner turns a target into an exact count,
``round(target * total) - already_pruned``.

Every schedule serialises with :meth:`Schedule.to_dict` to the form jsonargparse and
LightningCLI write, ``{"class_path": "<import path>", "init_args": {...}}``, and comes back with
:func:`schedule_from_dict`, so one format serves checkpoints, the pruner's state and YAML
configs. This module does not import torch.

Example:
    >>> schedule = CubicSchedule(final_sparsity=0.9, end_step=10)
    >>> [round(schedule(step), 4) for step in (0, 1, 5, 10, 20)]
    [0.0, 0.2439, 0.7875, 0.9, 0.9]
    >>> schedule_from_dict(schedule.to_dict()) == schedule
    True
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tensorplay.ao.pruning.imports import import_object, import_path

__all__ = [
    "CallableSchedule",
    "ConstantSchedule",
    "CubicSchedule",
    "ExponentialSchedule",
    "LinearSchedule",
    "OneShotSchedule",
    "Schedule",
    "schedule_from_dict",
]


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Expected `{name}` to be an int, but got {value!r}.")
    if value < minimum:
        raise ValueError(f"Expected `{name}` to be an int >= {minimum}, but got {value}.")


def _check_fraction(name: str, value: object, *, open_low: bool = False) -> None:
    low = "(0" if open_low else "[0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Expected `{name}` to be a float in {low}, 1), but got {value!r}.")
    if not (0.0 <= value < 1.0) or (open_low and value == 0.0):
        raise ValueError(f"Expected `{name}` to be a float in {low}, 1), but got {value}.")


def _check_window(start_step: int, end_step: int | None, frequency: int, freq_name: str) -> None:
    _check_int("start_step", start_step, 0)
    _check_int(freq_name, frequency, 1)
    if end_step is not None:
        _check_int("end_step", end_step, 0)
        if end_step < start_step:
            raise ValueError(
                f"Expected `end_step` to be >= `start_step` ({start_step}), but got {end_step}."
            )


def _in_window(step: int, start_step: int, end_step: int | None, frequency: int) -> bool:
    if step < start_step or (end_step is not None and step > end_step):
        return False
    return (step - start_step) % frequency == 0


def _latest_in_window(
    after: int, until: int, start_step: int, end_step: int | None, frequency: int
) -> int | None:
    """The last step of ``start_step + k * frequency`` (up to ``end_step``) in (after, until]."""
    if until < start_step:
        return None
    latest = _last_pruning_step(until, start_step, end_step, frequency)
    return latest if latest > after else None


def _last_pruning_step(step: int, start_step: int, end_step: int | None, frequency: int) -> int:
    """The last pruning step at or before ``step`` (``step`` must be >= ``start_step``)."""
    if end_step is not None:
        step = min(step, end_step)
    return start_step + (step - start_step) // frequency * frequency


class Schedule(ABC):
    """Base class of sparsity schedules.

    Subclasses are frozen dataclasses. They implement :meth:`__call__` and :meth:`should_prune`;
    :meth:`to_dict` works for any subclass defined at the top level of an importable module whose
    fields are plain data.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class EveryTenth(Schedule):
        ...     def __call__(self, step: int) -> float:
        ...         return min(step // 10, 8) / 10
        ...     def should_prune(self, step: int) -> bool:
        ...         return step % 10 == 0
        >>> EveryTenth()(25), EveryTenth().should_prune(25)
        (0.2, False)
    """

    @abstractmethod
    def __call__(self, step: int) -> float:
        """The cumulative target sparsity, in [0, 1), once ``step`` is done."""

    @abstractmethod
    def should_prune(self, step: int) -> bool:
        """Whether ``step`` is a pruning step."""

    def has_target(self) -> bool:
        """Whether the schedule names its own final sparsity; one that does not (a
        ``final_sparsity`` or ``sparsity`` left out) gives the fraction of the way to a
        parameter budget, ``target_params``, from 0 to 1."""
        return True

    def latest_pruning_step(self, after: int, until: int) -> int | None:
        """The last pruning step in ``(after, until]``, or ``None`` if there is none.

        A step counter may pass a pruning step without landing on it (two optimizers each
        advancing it, a loop stepping the pruner every other step): the pruner asks this to
        prune at the first step past one. The built-in schedules answer in closed form; this
        generic version asks :meth:`should_prune` of each step from ``until`` down, so a
        subclass whose pruning steps are far apart may override it.

        Example:
            >>> OneShotSchedule(0.5, step=5).latest_pruning_step(4, 6)
            5
            >>> LinearSchedule(0.5, end_step=20, frequency=5).latest_pruning_step(11, 14) is None
            True
        """
        for step in range(until, max(after, -1), -1):
            if self.should_prune(step):
                return step
        return None

    def to_dict(self) -> dict[str, Any]:
        """``{"class_path", "init_args"}``, as jsonargparse writes it; see :func:`schedule_from_dict`.

        Raises:
            TypeError: The schedule is not a dataclass (override :meth:`init_args`).
            ValueError: Its class has no import path (defined in ``__main__`` or in a function).

        Example:
            >>> OneShotSchedule(0.5, step=3).to_dict()
            {'class_path': 'tensorplay.ao.pruning.pruner.schedules.OneShotSchedule', 'init_args': {'sparsity': 0.5, 'step': 3}}
        """  # noqa: E501
        cls = type(self)
        path = import_path(cls)
        if path is None:
            raise ValueError(
                f"Expected a schedule class with an import path to serialise, but got "
                f"{cls.__qualname__} of module {cls.__module__!r}; define it at the top level of "
                "an importable module."
            )
        return {"class_path": path, "init_args": self.init_args()}

    def init_args(self) -> dict[str, Any]:
        """The constructor arguments that rebuild this schedule, as plain data.

        Raises:
            TypeError: The schedule is not a dataclass; override this method then.

        Example:
            >>> LinearSchedule(0.5, end_step=4).init_args()
            {'final_sparsity': 0.5, 'end_step': 4, 'start_step': 0, 'initial_sparsity': 0.0, 'frequency': 1}
        """  # noqa: E501
        if not dataclasses.is_dataclass(self):
            raise TypeError(
                f"Expected a dataclass schedule to serialise, but {type(self).__name__} is not "
                "one; decorate it with @dataclass(frozen=True) or override init_args()."
            )
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class _PolynomialSchedule(Schedule):
    final_sparsity: float | None = None
    end_step: int = dataclasses.field(kw_only=True)
    start_step: int = 0
    initial_sparsity: float = 0.0
    frequency: int = 1

    def __post_init__(self) -> None:
        if self.final_sparsity is not None:
            _check_fraction("final_sparsity", self.final_sparsity)
        _check_fraction("initial_sparsity", self.initial_sparsity)
        if self.initial_sparsity > self.final:
            raise ValueError(
                "Expected `initial_sparsity` to be <= `final_sparsity` "
                f"({self.final_sparsity}), but got {self.initial_sparsity}."
            )
        _check_window(self.start_step, self.end_step, self.frequency, "frequency")

    @property
    def exponent(self) -> float:
        return 1.0

    @property
    def final(self) -> float:
        """``final_sparsity``, or 1 without it: the whole way to a parameter budget."""
        return 1.0 if self.final_sparsity is None else self.final_sparsity

    def has_target(self) -> bool:
        return self.final_sparsity is not None

    def __call__(self, step: int) -> float:
        if step < self.start_step:
            return float(self.initial_sparsity)
        # The final value is reached at the last pruning step of the window.
        horizon = _last_pruning_step(self.end_step, self.start_step, None, self.frequency)
        horizon -= self.start_step
        if horizon == 0:
            return float(self.final)
        t = _last_pruning_step(step, self.start_step, self.end_step, self.frequency)
        remaining = 1.0 - (t - self.start_step) / horizon
        span = self.initial_sparsity - self.final
        return float(self.final + span * remaining**self.exponent)

    def should_prune(self, step: int) -> bool:
        return _in_window(step, self.start_step, self.end_step, self.frequency)

    def latest_pruning_step(self, after: int, until: int) -> int | None:
        return _latest_in_window(after, until, self.start_step, self.end_step, self.frequency)


@dataclass(frozen=True)
class CubicSchedule(_PolynomialSchedule):
    r"""Gradual magnitude pruning (Zhu & Gupta, 2017), a polynomial ramp of configurable power.

    Pruning steps are ``start_step, start_step + frequency, ...`` up to ``end_step``. At a pruning
    step :math:`t`, with :math:`t_0` = ``start_step`` and :math:`n\,\Delta t` the distance from
    ``start_step`` to the last pruning step of the window,

    .. math::

        s_t = s_f + (s_i - s_f)\left(1 - \frac{t - t_0}{n\,\Delta t}\right)^{p}

    where :math:`s_i` = ``initial_sparsity``, :math:`s_f` = ``final_sparsity`` and :math:`p` =
    ``power`` (3 in the paper). Between pruning steps the value is held; after the window it is
    :math:`s_f`; before ``start_step`` it is :math:`s_i`. If ``end_step - start_step`` is not a
    multiple of ``frequency``, :math:`s_f` is reached at the last pruning step before ``end_step``.

    Args:
        final_sparsity: :math:`s_f`, in [0, 1); left out with a pruner's ``target_params``,
            when the schedule gives the fraction of the way to the budget (:math:`s_f = 1`).
        end_step: The last step of the window (keyword only).
        start_step: The first pruning step.
        initial_sparsity: :math:`s_i`, in [0, ``final_sparsity``].
        frequency: Steps between two pruning steps, >= 1.
        power: The exponent :math:`p`, > 0.

    Raises:
        ValueError: A sparsity outside [0, 1), ``initial_sparsity > final_sparsity``,
            ``end_step < start_step``, ``frequency < 1`` or ``power <= 0``.

    Example:
        >>> schedule = CubicSchedule(final_sparsity=0.9, end_step=10)
        >>> round(schedule(1), 4), round(schedule(5), 4), schedule(10), schedule(11)
        (0.2439, 0.7875, 0.9, 0.9)
        >>> every_4 = CubicSchedule(0.9, end_step=10, frequency=4)
        >>> [every_4.should_prune(t) for t in (0, 3, 4, 10)], every_4(7) == every_4(4)
        ([True, False, True, False], True)
    """

    power: float = 3.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.power, bool) or not isinstance(self.power, (int, float)):
            raise TypeError(f"Expected `power` to be a float > 0, but got {self.power!r}.")
        if not (self.power > 0 and math.isfinite(self.power)):
            raise ValueError(f"Expected `power` to be a finite float > 0, but got {self.power}.")

    @property
    def exponent(self) -> float:
        return float(self.power)


@dataclass(frozen=True)
class LinearSchedule(_PolynomialSchedule):
    """A linear ramp from ``initial_sparsity`` to ``final_sparsity``: :class:`CubicSchedule` with
    power 1.

    Args:
        final_sparsity: The sparsity reached at the end of the window, in [0, 1); left out
            with a pruner's ``target_params`` (as :class:`CubicSchedule`).
        end_step: The last step of the window (keyword only).
        start_step: The first pruning step.
        initial_sparsity: The sparsity at ``start_step``, in [0, ``final_sparsity``].
        frequency: Steps between two pruning steps, >= 1.

    Raises:
        ValueError: As :class:`CubicSchedule`.

    Example:
        >>> schedule = LinearSchedule(final_sparsity=0.8, end_step=4)
        >>> [round(schedule(t), 4) for t in range(6)]
        [0.0, 0.2, 0.4, 0.6, 0.8, 0.8]
    """


@dataclass(frozen=True)
class ConstantSchedule(Schedule):
    """A fixed target from ``start_step`` on, re-applied every ``frequency`` steps in the window.

    Args:
        sparsity: The target, in [0, 1).
        start_step: The first pruning step; before it the target is 0.
        end_step: The last step that may prune; ``None`` for no end.
        frequency: Steps between two pruning steps, >= 1.

    Raises:
        ValueError: ``sparsity`` outside [0, 1), ``end_step < start_step`` or ``frequency < 1``.

    Example:
        >>> schedule = ConstantSchedule(0.5, start_step=2)
        >>> [schedule(t) for t in range(4)], schedule.should_prune(1), schedule.should_prune(9)
        ([0.0, 0.0, 0.5, 0.5], False, True)
    """

    sparsity: float
    start_step: int = 0
    end_step: int | None = None
    frequency: int = 1

    def __post_init__(self) -> None:
        _check_fraction("sparsity", self.sparsity)
        _check_window(self.start_step, self.end_step, self.frequency, "frequency")

    def __call__(self, step: int) -> float:
        return float(self.sparsity) if step >= self.start_step else 0.0

    def should_prune(self, step: int) -> bool:
        return _in_window(step, self.start_step, self.end_step, self.frequency)

    def latest_pruning_step(self, after: int, until: int) -> int | None:
        return _latest_in_window(after, until, self.start_step, self.end_step, self.frequency)


@dataclass(frozen=True)
class OneShotSchedule(Schedule):
    """Prune once, at ``step``, to ``sparsity``.

    Args:
        sparsity: The target, in [0, 1); left out with a pruner's ``target_params`` (the
            whole way to the budget at ``step``).
        step: The only pruning step; before it the target is 0.

    Raises:
        ValueError: ``sparsity`` outside [0, 1) or a negative ``step``.

    Example:
        >>> schedule = OneShotSchedule(0.7, step=100)
        >>> schedule(99), schedule(100), schedule.should_prune(100), schedule.should_prune(101)
        (0.0, 0.7, True, False)
    """

    sparsity: float | None = None
    step: int = 0

    def __post_init__(self) -> None:
        if self.sparsity is not None:
            _check_fraction("sparsity", self.sparsity)
        _check_int("step", self.step, 0)

    def has_target(self) -> bool:
        return self.sparsity is not None

    def __call__(self, step: int) -> float:
        if step < self.step:
            return 0.0
        return 1.0 if self.sparsity is None else float(self.sparsity)

    def should_prune(self, step: int) -> bool:
        return step == self.step

    def latest_pruning_step(self, after: int, until: int) -> int | None:
        return self.step if after < self.step <= until else None


@dataclass(frozen=True)
class ExponentialSchedule(Schedule):
    r"""Prune ``rate`` of what remains every ``every`` steps (iterative lottery-ticket pruning).

    Rounds happen at ``start_step, start_step + every, ...``, at most ``rounds`` of them and none
    after ``end_step``. After :math:`n` rounds the target is :math:`1 - (1 - \text{rate})^n`.

    Args:
        rate: The fraction of the remaining units pruned per round, in (0, 1).
        every: Steps between two rounds, >= 1.
        start_step: The step of the first round.
        end_step: No round after this step; ``None`` for no end.
        rounds: The number of rounds, >= 1; ``None`` for no limit.

    Raises:
        ValueError: ``rate`` outside (0, 1), ``every < 1``, ``end_step < start_step`` or
            ``rounds < 1``.

    Example:
        >>> schedule = ExponentialSchedule(rate=0.2, every=100, start_step=100, rounds=3)
        >>> [round(schedule(t), 3) for t in (99, 100, 250, 300, 900)]
        [0.0, 0.2, 0.36, 0.488, 0.488]
        >>> schedule.should_prune(300), schedule.should_prune(400)
        (True, False)
    """

    rate: float
    every: int
    start_step: int = 0
    end_step: int | None = None
    rounds: int | None = None

    def __post_init__(self) -> None:
        _check_fraction("rate", self.rate, open_low=True)
        _check_window(self.start_step, self.end_step, self.every, "every")
        if self.rounds is not None:
            _check_int("rounds", self.rounds, 1)

    def _rounds_done(self, step: int) -> int:
        if step < self.start_step:
            return 0
        last = _last_pruning_step(step, self.start_step, self.end_step, self.every)
        done = (last - self.start_step) // self.every + 1
        return done if self.rounds is None else min(done, self.rounds)

    def __call__(self, step: int) -> float:
        return float(1.0 - (1.0 - self.rate) ** self._rounds_done(step))

    def should_prune(self, step: int) -> bool:
        if not _in_window(step, self.start_step, self.end_step, self.every):
            return False
        return self.rounds is None or (step - self.start_step) // self.every < self.rounds

    def latest_pruning_step(self, after: int, until: int) -> int | None:
        end = self.end_step
        if self.rounds is not None:
            last_round = self.start_step + (self.rounds - 1) * self.every
            end = last_round if end is None else min(end, last_round)
        return _latest_in_window(after, until, self.start_step, end, self.every)


@dataclass(frozen=True)
class CallableSchedule(Schedule):
    """Any function of the step, evaluated on pruning steps and held in between.

    The function is called with the last pruning step at or before the asked step (clipped to the
    window), so the value is held between pruning steps and after ``end_step``. It must return a
    float in [0, 1). Before ``start_step`` the target is 0.

    :meth:`to_dict` stores a module-level function by its import path (as jsonargparse reads a
    ``Callable`` from YAML); a lambda or a nested function cannot be serialised.

    Args:
        fn: ``step -> cumulative target sparsity``.
        start_step: The first pruning step.
        end_step: The last step that may prune; ``None`` for no end.
        frequency: Steps between two pruning steps, >= 1.

    Raises:
        TypeError: ``fn`` is not callable.
        ValueError: ``end_step < start_step`` or ``frequency < 1``; at call time, ``fn`` returned
            a value outside [0, 1).

    Example:
        >>> schedule = CallableSchedule(lambda step: min(step / 100, 0.5), frequency=10)
        >>> schedule(25), schedule(1000)
        (0.2, 0.5)
        >>> import math
        >>> CallableSchedule(math.sin, end_step=1).to_dict()["init_args"]["fn"]
        'math.sin'
    """

    fn: Callable[[int], float]
    start_step: int = 0
    end_step: int | None = None
    frequency: int = 1

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"Expected `fn` to be callable, but got {self.fn!r}.")
        _check_window(self.start_step, self.end_step, self.frequency, "frequency")

    def __call__(self, step: int) -> float:
        if step < self.start_step:
            return 0.0
        t = _last_pruning_step(step, self.start_step, self.end_step, self.frequency)
        value = self.fn(t)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"Expected `fn({t})` to return a float in [0, 1), but got {value!r}.")
        return float(value)

    def should_prune(self, step: int) -> bool:
        return _in_window(step, self.start_step, self.end_step, self.frequency)

    def latest_pruning_step(self, after: int, until: int) -> int | None:
        return _latest_in_window(after, until, self.start_step, self.end_step, self.frequency)

    def init_args(self) -> dict[str, Any]:
        """The arguments with ``fn`` as its import path.

        Raises:
            ValueError: ``fn`` has no import path (a lambda, a nested function).
        """
        path = import_path(self.fn)
        if path is None:
            raise ValueError(
                f"Expected `fn` to be a module-level function to serialise the schedule, but got "
                f"{self.fn!r}; define it at the top level of an importable module."
            )
        return {**super().init_args(), "fn": path}


def schedule_from_dict(data: Mapping[str, Any]) -> Schedule:
    """Rebuild a schedule from ``{"class_path", "init_args"}`` (:meth:`Schedule.to_dict`).

    ``class_path`` is the import path of a :class:`Schedule` subclass; ``init_args`` (optional)
    holds its constructor arguments, a :class:`CallableSchedule`'s ``fn`` as an import path. This
    is the form LightningCLI writes and reads in YAML.

    Raises:
        TypeError: ``data`` or ``init_args`` is not a mapping.
        ValueError: Keys other than ``class_path`` and ``init_args``, a path that is not a
            Schedule subclass, unknown or missing arguments, or arguments the schedule rejects.

    Example:
        >>> schedule = schedule_from_dict({
        ...     "class_path": "tensorplay.ao.pruning.pruner.schedules.LinearSchedule",
        ...     "init_args": {"final_sparsity": 0.5, "end_step": 10},
        ... })
        >>> schedule == LinearSchedule(final_sparsity=0.5, end_step=10), schedule(5)
        (True, 0.25)
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"Expected `data` to be a mapping, but got {data!r}.")
    if "class_path" not in data or not set(data) <= {"class_path", "init_args"}:
        raise ValueError(
            "Expected `data` to have the keys 'class_path' and optionally 'init_args', but got "
            f"keys {sorted(data)}."
        )
    cls = _schedule_class(data["class_path"])
    kwargs = data.get("init_args", {})
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"Expected `init_args` to be a mapping, but got {kwargs!r}.")
    _check_init_args(cls, kwargs)
    kwargs = dict(kwargs)
    if issubclass(cls, CallableSchedule) and isinstance(kwargs.get("fn"), str):
        kwargs["fn"] = import_object(kwargs["fn"])
    return cls(**kwargs)


def _schedule_class(path: object) -> type[Schedule]:
    found = import_object(path) if isinstance(path, str) else None
    if not (isinstance(found, type) and issubclass(found, Schedule)):
        raise ValueError(
            f"Expected `class_path` to be the import path of a Schedule subclass, but got {path!r}."
        )
    return found


def _check_init_args(cls: type[Schedule], kwargs: Mapping[str, Any]) -> None:
    """Unknown and missing constructor arguments, read from the signature."""
    params = inspect.signature(cls).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    named = {p.name: p for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    unknown = sorted(set(kwargs) - set(named))
    missing = [name for name, p in named.items() if p.default is p.empty and name not in kwargs]
    if unknown or missing:
        raise ValueError(
            f"Expected the `init_args` of {cls.__name__} to be among {list(named)}, but "
            f"{unknown} are unknown and {missing} are missing."
        )
