"""Schedules: values on and between pruning steps, windows, serialisation, validation."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest

from tensorplay.ao.pruning.schedules import (
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


def test_to_dict_is_plain_data() -> None:
    assert CubicSchedule(0.9, end_step=10).to_dict() == {
        "type": "cubic",
        "final_sparsity": 0.9,
        "end_step": 10,
        "start_step": 0,
        "initial_sparsity": 0.0,
        "frequency": 1,
        "power": 3.0,
    }
    assert LinearSchedule(0.5, end_step=4).to_dict()["type"] == "linear"
    assert "power" not in LinearSchedule(0.5, end_step=4).to_dict()
    assert CallableSchedule(half_of_step).to_dict()["fn"] == f"{__name__}.half_of_step"
    assert StairSchedule().to_dict()["type"] == f"{__name__}.StairSchedule"


class PlainSchedule(Schedule):
    """A user-defined schedule that is not a dataclass."""

    def __call__(self, step: int) -> float:
        return 0.5

    def should_prune(self, step: int) -> bool:
        return step == 0


def test_non_dataclass_schedule_cannot_be_serialised_by_default() -> None:
    with pytest.raises(TypeError, match="Expected a dataclass schedule to serialise"):
        PlainSchedule().to_dict()
    rebuilt = schedule_from_dict({"type": f"{__name__}.PlainSchedule"})
    assert type(rebuilt) is PlainSchedule


def test_callable_with_lambda_cannot_be_serialised() -> None:
    with pytest.raises(ValueError, match="Expected `fn` to be a module-level function"):
        CallableSchedule(lambda step: 0.1).to_dict()


def test_from_dict_rejects_missing_type() -> None:
    with pytest.raises(ValueError, match="Expected `data` to have a 'type' key"):
        schedule_from_dict({"final_sparsity": 0.5})


def test_from_dict_rejects_non_mapping() -> None:
    with pytest.raises(TypeError, match="Expected `data` to be a mapping"):
        schedule_from_dict(["cubic"])  # type: ignore[arg-type]


def test_from_dict_rejects_unknown_type() -> None:
    with pytest.raises(ValueError, match=r"Expected `type` to be one of \['callable', 'constant'"):
        schedule_from_dict({"type": "quartic"})


def test_from_dict_rejects_import_path_to_non_schedule() -> None:
    with pytest.raises(ValueError, match="Expected `type` to name a Schedule subclass"):
        schedule_from_dict({"type": "math.sqrt"})


def test_from_dict_rejects_bad_import_path() -> None:
    with pytest.raises(ValueError, match="Expected an import path"):
        schedule_from_dict({"type": "no_such_package.Schedule"})


def test_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"but got unknown keys \['final'\]"):
        schedule_from_dict({"type": "cubic", "final": 0.5, "end_step": 3})


def test_from_dict_rejects_missing_argument() -> None:
    with pytest.raises(ValueError, match="Incomplete 'cubic' schedule"):
        schedule_from_dict({"type": "cubic", "final_sparsity": 0.5})


def test_from_dict_validates_arguments() -> None:
    with pytest.raises(ValueError, match="Expected `final_sparsity` to be a float in"):
        schedule_from_dict({"type": "cubic", "final_sparsity": 1.5, "end_step": 3})


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        pytest.param(
            lambda: CubicSchedule(1.0, end_step=10),
            ValueError,
            r"Expected `final_sparsity` to be a float in \[0, 1\), but got 1.0.",
            id="final-one",
        ),
        pytest.param(
            lambda: CubicSchedule(-0.1, end_step=10),
            ValueError,
            "Expected `final_sparsity` to be a float in",
            id="final-negative",
        ),
        pytest.param(
            lambda: CubicSchedule("0.5", end_step=10),
            TypeError,
            "Expected `final_sparsity` to be a float in",
            id="final-str",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=10, initial_sparsity=1.2),
            ValueError,
            "Expected `initial_sparsity` to be a float in",
            id="initial-range",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=10, initial_sparsity=0.6),
            ValueError,
            r"Expected `initial_sparsity` to be <= `final_sparsity` \(0.5\), but got 0.6.",
            id="initial-above-final",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=4, start_step=5),
            ValueError,
            r"Expected `end_step` to be >= `start_step` \(5\), but got 4.",
            id="end-before-start",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=10, frequency=0),
            ValueError,
            "Expected `frequency` to be an int >= 1, but got 0.",
            id="frequency-zero",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=10, frequency=2.0),
            TypeError,
            "Expected `frequency` to be an int, but got 2.0.",
            id="frequency-float",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=10, start_step=-1),
            ValueError,
            "Expected `start_step` to be an int >= 0, but got -1.",
            id="start-negative",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=True),
            TypeError,
            "Expected `end_step` to be an int, but got True.",
            id="end-bool",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=10, power=0),
            ValueError,
            "Expected `power` to be a finite float > 0, but got 0.",
            id="power-zero",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=10, power=math.inf),
            ValueError,
            "Expected `power` to be a finite float > 0",
            id="power-inf",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=10, power="3"),
            TypeError,
            "Expected `power` to be a float > 0",
            id="power-str",
        ),
        pytest.param(
            lambda: LinearSchedule(1.0, end_step=10),
            ValueError,
            "Expected `final_sparsity` to be a float in",
            id="linear-final",
        ),
        pytest.param(
            lambda: ConstantSchedule(1.0),
            ValueError,
            r"Expected `sparsity` to be a float in \[0, 1\), but got 1.0.",
            id="constant-sparsity",
        ),
        pytest.param(
            lambda: ConstantSchedule(0.5, start_step=3, end_step=2),
            ValueError,
            "Expected `end_step` to be >= `start_step`",
            id="constant-window",
        ),
        pytest.param(
            lambda: ConstantSchedule(0.5, frequency=0),
            ValueError,
            "Expected `frequency` to be an int >= 1",
            id="constant-frequency",
        ),
        pytest.param(
            lambda: OneShotSchedule(1.5),
            ValueError,
            "Expected `sparsity` to be a float in",
            id="one-shot-sparsity",
        ),
        pytest.param(
            lambda: OneShotSchedule(0.5, step=-2),
            ValueError,
            "Expected `step` to be an int >= 0, but got -2.",
            id="one-shot-step",
        ),
        pytest.param(
            lambda: ExponentialSchedule(0.0, every=10),
            ValueError,
            r"Expected `rate` to be a float in \(0, 1\), but got 0.0.",
            id="exponential-rate-zero",
        ),
        pytest.param(
            lambda: ExponentialSchedule(1.0, every=10),
            ValueError,
            r"Expected `rate` to be a float in \(0, 1\)",
            id="exponential-rate-one",
        ),
        pytest.param(
            lambda: ExponentialSchedule(0.2, every=0),
            ValueError,
            "Expected `every` to be an int >= 1, but got 0.",
            id="exponential-every",
        ),
        pytest.param(
            lambda: ExponentialSchedule(0.2, every=5, rounds=0),
            ValueError,
            "Expected `rounds` to be an int >= 1, but got 0.",
            id="exponential-rounds",
        ),
        pytest.param(
            lambda: ExponentialSchedule(0.2, every=5, start_step=10, end_step=5),
            ValueError,
            "Expected `end_step` to be >= `start_step`",
            id="exponential-window",
        ),
        pytest.param(
            lambda: CallableSchedule(0.5),
            TypeError,
            "Expected `fn` to be callable, but got 0.5.",
            id="callable-fn",
        ),
        pytest.param(
            lambda: CallableSchedule(half_of_step, frequency=0),
            ValueError,
            "Expected `frequency` to be an int >= 1",
            id="callable-frequency",
        ),
    ],
)
def test_constructor_validation(make: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()  # type: ignore[operator]
