"""Schedules: values on and between pruning steps, windows, serialisation, validation."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest

from tensorplay.ao.pruning.pruner.schedules import (
    CallableSchedule,
    ConstantSchedule,
    CubicSchedule,
    ExponentialSchedule,
    LinearSchedule,
    OneShotSchedule,
    Schedule,
    schedule_from_dict,
)


def zhu_gupta(t: int, s_i: float, s_f: float, t0: int, span: int, power: float = 3.0) -> float:
    return s_f + (s_i - s_f) * (1 - (t - t0) / span) ** power


def half_of_step(step: int) -> float:
    """A module-level function, so a CallableSchedule of it serialises."""
    return min(step / 200, 0.5)


@dataclass(frozen=True)
class StairSchedule(Schedule):
    """A user-defined schedule, serialised under its import path."""

    height: float = 0.1

    def __call__(self, step: int) -> float:
        return min(step // 10 * self.height, 0.9)

    def should_prune(self, step: int) -> bool:
        return step % 10 == 0


# -- values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        pytest.param(0, 0.0, id="t0"),
        pytest.param(1, 0.2439, id="t1"),
        pytest.param(5, 0.7875, id="t5"),
        pytest.param(10, 0.9, id="end"),
        pytest.param(11, 0.9, id="after-end"),
        pytest.param(10_000, 0.9, id="long-after-end"),
    ],
)
def test_cubic_reference_values(step: int, expected: float) -> None:
    schedule = CubicSchedule(final_sparsity=0.9, end_step=10)
    assert schedule(step) == pytest.approx(expected, abs=1e-12)


def test_cubic_matches_formula_on_every_step() -> None:
    schedule = CubicSchedule(0.8, end_step=40, start_step=10, initial_sparsity=0.1, frequency=1)
    for t in range(10, 41):
        assert schedule(t) == pytest.approx(zhu_gupta(t, 0.1, 0.8, 10, 30), abs=1e-12)
    assert schedule(9) == 0.1
    assert schedule(0) == 0.1
    assert schedule(41) == schedule(40) == 0.8


def test_cubic_power_is_configurable() -> None:
    schedule = CubicSchedule(0.6, end_step=8, power=2.0)
    for t in range(9):
        assert schedule(t) == pytest.approx(zhu_gupta(t, 0.0, 0.6, 0, 8, power=2.0), abs=1e-12)
    linear = LinearSchedule(0.6, end_step=8)
    assert [CubicSchedule(0.6, end_step=8, power=1)(t) for t in range(10)] == [
        linear(t) for t in range(10)
    ]


def test_cubic_holds_value_between_pruning_steps() -> None:
    schedule = CubicSchedule(0.9, end_step=12, start_step=2, frequency=5)
    assert [t for t in range(20) if schedule.should_prune(t)] == [2, 7, 12]
    assert [schedule(t) for t in range(2, 7)] == [schedule(2)] * 5
    assert [schedule(t) for t in range(7, 12)] == [schedule(7)] * 5
    assert schedule(7) == pytest.approx(zhu_gupta(7, 0.0, 0.9, 2, 10), abs=1e-12)
    assert [schedule(t) for t in (12, 13, 99)] == [0.9, 0.9, 0.9]


def test_cubic_window_not_a_multiple_of_frequency_reaches_final_at_last_pruning_step() -> None:
    schedule = CubicSchedule(0.9, end_step=10, frequency=4)
    assert [t for t in range(30) if schedule.should_prune(t)] == [0, 4, 8]
    assert schedule(4) == pytest.approx(zhu_gupta(4, 0.0, 0.9, 0, 8), abs=1e-12)
    assert [schedule(t) for t in (8, 9, 10, 11)] == [0.9] * 4


def test_cubic_empty_window_jumps_to_final() -> None:
    schedule = CubicSchedule(0.5, end_step=3, start_step=3, initial_sparsity=0.2)
    assert [schedule(t) for t in (2, 3, 4)] == [0.2, 0.5, 0.5]
    assert [t for t in range(10) if schedule.should_prune(t)] == [3]


def test_linear_values() -> None:
    schedule = LinearSchedule(0.8, end_step=14, start_step=4, initial_sparsity=0.3, frequency=2)
    expected = {4: 0.3, 6: 0.4, 8: 0.5, 10: 0.6, 12: 0.7, 14: 0.8}
    for t, value in expected.items():
        assert schedule(t) == pytest.approx(value, abs=1e-12)
        assert schedule(t + 1) == schedule(t)
    assert schedule(3) == 0.3
    assert [t for t in range(20) if schedule.should_prune(t)] == list(expected)


def test_constant_values_and_window() -> None:
    schedule = ConstantSchedule(0.6, start_step=3, end_step=9, frequency=3)
    assert [schedule(t) for t in range(2, 5)] == [0.0, 0.6, 0.6]
    assert schedule(100) == 0.6
    assert [t for t in range(20) if schedule.should_prune(t)] == [3, 6, 9]
    unbounded = ConstantSchedule(0.6)
    assert all(unbounded.should_prune(t) for t in range(100))


def test_one_shot_values() -> None:
    schedule = OneShotSchedule(0.4, step=5)
    assert [schedule(t) for t in (0, 4, 5, 6, 1000)] == [0.0, 0.0, 0.4, 0.4, 0.4]
    assert [t for t in range(50) if schedule.should_prune(t)] == [5]
    assert OneShotSchedule(0.4).should_prune(0)


def test_exponential_values() -> None:
    schedule = ExponentialSchedule(rate=0.2, every=10, start_step=5, rounds=4)
    assert [t for t in range(100) if schedule.should_prune(t)] == [5, 15, 25, 35]
    for rounds_done, t in enumerate((5, 15, 25, 35), start=1):
        assert schedule(t) == pytest.approx(1 - 0.8**rounds_done, abs=1e-12)
        assert schedule(t + 9) == schedule(t)
    assert schedule(4) == 0.0
    assert schedule(10_000) == pytest.approx(1 - 0.8**4, abs=1e-12)


def test_exponential_end_step_limits_rounds() -> None:
    schedule = ExponentialSchedule(rate=0.5, every=4, end_step=9)
    assert [t for t in range(40) if schedule.should_prune(t)] == [0, 4, 8]
    assert schedule(39) == pytest.approx(0.875, abs=1e-12)
    unbounded = ExponentialSchedule(rate=0.5, every=1)
    assert unbounded(9) == pytest.approx(1 - 0.5**10, abs=1e-12)


def test_callable_is_called_on_last_pruning_step_and_held() -> None:
    calls: list[int] = []

    def fn(step: int) -> float:
        calls.append(step)
        return step / 100

    schedule = CallableSchedule(fn, start_step=10, end_step=30, frequency=10)
    assert [schedule(t) for t in (9, 10, 15, 20, 29, 30, 31, 500)] == [
        0.0,
        0.1,
        0.1,
        0.2,
        0.2,
        0.3,
        0.3,
        0.3,
    ]
    assert calls == [10, 10, 20, 20, 30, 30, 30]
    assert [t for t in range(60) if schedule.should_prune(t)] == [10, 20, 30]


@pytest.mark.parametrize("bad", [1.0, -0.1, "0.5", True], ids=["one", "negative", "str", "bool"])
def test_callable_rejects_bad_return_value(bad: object) -> None:
    schedule = CallableSchedule(lambda step: bad, frequency=5)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match=r"Expected `fn\(5\)` to return a float in \[0, 1\)"):
        schedule(7)


def test_schedules_are_frozen() -> None:
    schedule = CubicSchedule(0.5, end_step=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        schedule.final_sparsity = 0.7  # type: ignore[misc]


# -- serialisation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule",
    [
        pytest.param(
            CubicSchedule(0.9, end_step=100, start_step=10, initial_sparsity=0.1, frequency=5),
            id="cubic",
        ),
        pytest.param(CubicSchedule(0.5, end_step=10, power=2.0), id="cubic-power"),
        pytest.param(LinearSchedule(0.7, end_step=50, frequency=10), id="linear"),
        pytest.param(ConstantSchedule(0.3, start_step=2, end_step=8, frequency=2), id="constant"),
        pytest.param(OneShotSchedule(0.4, step=7), id="one-shot"),
        pytest.param(ExponentialSchedule(0.2, every=10, rounds=3), id="exponential"),
        pytest.param(CallableSchedule(half_of_step, frequency=10), id="callable-function"),
        pytest.param(StairSchedule(0.2), id="user-subclass"),
    ],
)
def test_to_dict_round_trip(schedule: Schedule) -> None:
    data = schedule.to_dict()
    rebuilt = schedule_from_dict(data)
    assert type(rebuilt) is type(schedule)
    assert rebuilt == schedule
    assert [rebuilt(t) for t in range(0, 300, 7)] == [schedule(t) for t in range(0, 300, 7)]
    # jsonargparse, which LightningCLI uses, reads the same dict as a Schedule argument.
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--schedule", type=Schedule)
    parsed = parser.instantiate_classes(parser.parse_object({"schedule": data}))
    assert parsed.schedule == schedule


def test_to_dict_is_class_path_and_init_args() -> None:
    assert CubicSchedule(0.9, end_step=10).to_dict() == {
        "class_path": "tensorplay.ao.pruning.pruner.schedules.CubicSchedule",
        "init_args": {
            "final_sparsity": 0.9,
            "end_step": 10,
            "start_step": 0,
            "initial_sparsity": 0.0,
            "frequency": 1,
            "power": 3.0,
        },
    }
    assert "power" not in LinearSchedule(0.5, end_step=4).to_dict()["init_args"]
    assert CallableSchedule(half_of_step).to_dict()["init_args"]["fn"] == f"{__name__}.half_of_step"
    assert StairSchedule().to_dict()["class_path"] == f"{__name__}.StairSchedule"


class PlainSchedule(Schedule):
    """A user-defined schedule that is not a dataclass."""

    def __call__(self, step: int) -> float:
        return 0.5

    def should_prune(self, step: int) -> bool:
        return step == 0


def test_non_dataclass_schedule_cannot_be_serialised_by_default() -> None:
    with pytest.raises(TypeError, match="Expected a dataclass schedule to serialise"):
        PlainSchedule().to_dict()
    rebuilt = schedule_from_dict({"class_path": f"{__name__}.PlainSchedule"})
    assert type(rebuilt) is PlainSchedule


def test_schedules_without_an_import_path_cannot_be_serialised() -> None:
    with pytest.raises(ValueError, match="Expected `fn` to be a module-level function"):
        CallableSchedule(lambda step: 0.1).to_dict()

    @dataclass(frozen=True)
    class Local(StairSchedule):
        pass

    with pytest.raises(ValueError, match="Expected a schedule class with an import path"):
        Local().to_dict()


CUBIC = "tensorplay.ao.pruning.pruner.schedules.CubicSchedule"


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        pytest.param([CUBIC], TypeError, "Expected `data` to be a mapping", id="not-a-mapping"),
        pytest.param({"init_args": {}}, ValueError, "have the keys 'class_path'", id="no-path"),
        pytest.param({"type": "cubic"}, ValueError, r"but got keys \['type'\]", id="old-format"),
        pytest.param({"class_path": "math.sqrt"}, ValueError, "of a Schedule", id="not-schedule"),
        pytest.param({"class_path": "no_such.Name"}, ValueError, "an import path", id="bad-path"),
        pytest.param({"class_path": CUBIC, "init_args": [1]}, TypeError, "`init_args`", id="args"),
        pytest.param(
            {"class_path": CUBIC, "init_args": {"final": 0.5, "final_sparsity": 0.5}},
            ValueError,
            r"\['final'\] are unknown and \['end_step'\] are missing",
            id="unknown-and-missing",
        ),
        pytest.param(
            {"class_path": CUBIC, "init_args": {"final_sparsity": 1.5, "end_step": 3}},
            ValueError,
            r"Expected `final_sparsity` to be a float in \[0, 1\), but got 1.5.",
            id="validated",
        ),
    ],
)
def test_from_dict_errors(data: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        schedule_from_dict(data)  # type: ignore[arg-type]


# -- validation ------------------------------------------------------------------------------

VALID: dict[type[Schedule], dict[str, object]] = {
    CubicSchedule: {"final_sparsity": 0.5, "end_step": 10},
    LinearSchedule: {"final_sparsity": 0.5, "end_step": 10},
    ConstantSchedule: {"sparsity": 0.5},
    OneShotSchedule: {"sparsity": 0.5},
    ExponentialSchedule: {"rate": 0.2, "every": 5},
    CallableSchedule: {"fn": half_of_step},
}


def check(cls: type[Schedule], changes: dict[str, object], error: type[Exception], message: str):
    with pytest.raises(error) as raised:
        cls(**{**VALID[cls], **changes})
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("cls", "name"),
    [
        (CubicSchedule, "final_sparsity"),
        (CubicSchedule, "initial_sparsity"),
        (LinearSchedule, "final_sparsity"),
        (ConstantSchedule, "sparsity"),
        (OneShotSchedule, "sparsity"),
    ],
)
@pytest.mark.parametrize(
    ("value", "error"),
    [(1.0, ValueError), (-0.1, ValueError), ("0.5", TypeError), (True, TypeError)],
)
def test_sparsities_are_fractions(cls, name, value, error) -> None:
    shown = repr(value) if error is TypeError else value
    check(cls, {name: value}, error, f"Expected `{name}` to be a float in [0, 1), but got {shown}.")


V, T = ValueError, TypeError
Exponential = ExponentialSchedule
ABOVE_FINAL = "`initial_sparsity` to be <= `final_sparsity` (0.5), but got 0.6"
WINDOWED = [CubicSchedule, LinearSchedule, ConstantSchedule, ExponentialSchedule, CallableSchedule]


@pytest.mark.parametrize("cls", WINDOWED)
@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"start_step": 5, "end_step": 4}, V, "`end_step` to be >= `start_step` (5), but got 4"),
        ({"start_step": -1}, V, "`start_step` to be an int >= 0, but got -1"),
        ({"end_step": True}, T, "`end_step` to be an int, but got True"),
        ({"frequency": 0}, V, "`frequency` to be an int >= 1, but got 0"),
        ({"frequency": 2.0}, T, "`frequency` to be an int, but got 2.0"),
    ],
)  # fmt: skip
def test_windows_are_checked(cls, changes, error, message) -> None:
    if cls is ExponentialSchedule and "frequency" in changes:
        changes = {"every": changes["frequency"]}
        message = message.replace("`frequency`", "`every`")
    check(cls, changes, error, f"Expected {message}.")


@pytest.mark.parametrize(
    ("cls", "changes", "error", "message"),
    [
        (CubicSchedule, {"initial_sparsity": 0.6}, V, ABOVE_FINAL),
        (CubicSchedule, {"power": 0}, V, "`power` to be a finite float > 0, but got 0"),
        (CubicSchedule, {"power": math.inf}, V, "`power` to be a finite float > 0, but got inf"),
        (CubicSchedule, {"power": "3"}, T, "`power` to be a float > 0, but got '3'"),
        (OneShotSchedule, {"step": -2}, V, "`step` to be an int >= 0, but got -2"),
        (Exponential, {"rate": 0.0}, V, "`rate` to be a float in (0, 1), but got 0.0"),
        (Exponential, {"rate": 1.0}, V, "`rate` to be a float in (0, 1), but got 1.0"),
        (Exponential, {"rounds": 0}, V, "`rounds` to be an int >= 1, but got 0"),
        (CallableSchedule, {"fn": 0.5}, T, "`fn` to be callable, but got 0.5"),
    ],
)  # fmt: skip
def test_other_arguments_are_checked(cls, changes, error, message) -> None:
    check(cls, changes, error, f"Expected {message}.")
