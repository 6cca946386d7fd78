"""No pruning step is skipped: a step counter that jumps past a pruning step prunes at the first
step after it, to the schedule's exact cumulative count there, and the history says where.
``Schedule.latest_pruning_step`` is checked against a scan of ``should_prune`` for every
schedule, closed forms and the generic fallback alike."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import (
    CallableSchedule,
    ConstantSchedule,
    CubicSchedule,
    ExponentialSchedule,
    LinearSchedule,
    OneShotSchedule,
    Schedule,
)


@dataclass(frozen=True)
class EveryKth(Schedule):
    """A user's schedule with only ``__call__`` and ``should_prune``: the generic fallback."""

    k: int
    last: int

    def __call__(self, step: int) -> float:
        return min(step // self.k, self.last // self.k) * self.k / (2 * self.last + 2)

    def should_prune(self, step: int) -> bool:
        return step % self.k == 0 and step <= self.last


def half_of(step: int) -> float:
    return min(step / 100, 0.6)


def scanned(schedule: Schedule, after: int, until: int) -> int | None:
    """The oracle: the last step in (after, until] that ``should_prune`` says prunes."""
    found = [step for step in range(max(after + 1, 0), until + 1) if schedule.should_prune(step)]
    return found[-1] if found else None


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 7))


def test_a_one_shot_step_jumped_over_prunes_at_the_next_step_to_its_exact_count():
    pruner = Pruner(model(), OneShotSchedule(0.5, step=5))
    pruned = [pruner.step(step) for step in range(0, 12, 2)]
    assert pruned == [0, 0, 0, 85, 0, 0]
    assert pruner.history == [(6, 0.5, 85)]
    assert pruner.pruned_count() == round(0.5 * 170)


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_a_cubic_schedule_stepped_every_other_step_ends_at_its_final_sparsity(masking):
    schedule = CubicSchedule(0.7, end_step=45, frequency=5)
    torch.manual_seed(0)
    wide = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    pruner = Pruner(wide, schedule, masking=masking)
    for step in range(0, 60, 2):
        pruner.step(step)
    assert pruner.pruned_count() == round(0.7 * 3072)
    # Pruning steps 5, 15, 25, 35, 45 are passed and caught up at 6, 16, 26, 36, 46 (step 0's
    # target is 0: nothing pruned, nothing recorded).
    assert [step for step, _, _ in pruner.history] == [6, 10, 16, 20, 26, 30, 36, 40, 46]
    assert [target for _, target, _ in pruner.history] == [
        schedule(s) for s, _, _ in pruner.history
    ]


def test_a_step_repeated_or_taken_again_never_prunes_twice():
    pruner = Pruner(model(), OneShotSchedule(0.5, step=5))
    assert [pruner.step(s) for s in (6, 6, 7, 5)] == [85, 0, 0, 0]


def test_a_rewind_step_jumped_over_takes_its_snapshot_at_the_next_step():
    net = model()
    pruner = Pruner(net, OneShotSchedule(0.5, step=5), rewind="step", rewind_step=3)
    pruner.step(2)
    with torch.no_grad():
        for param in net.parameters():
            param.add_(1.0)  # training between step 2 and step 4
    expected = pruner.snapshot()
    pruner.step(4)  # step 3 was passed: the snapshot is the values after step 4
    with torch.no_grad():
        for param in net.parameters():
            param.add_(1.0)
    pruner.step(6)  # prunes, then rewinds to the snapshot
    for layer, name in ((net[0], "0.weight"), (net[2], "2.weight")):
        assert torch.equal(layer.weight_orig, expected[name])


SCHEDULES = [
    pytest.param(CubicSchedule(0.8, end_step=37, start_step=4, frequency=6), id="cubic"),
    pytest.param(LinearSchedule(0.5, end_step=10), id="linear"),
    pytest.param(ConstantSchedule(0.3, start_step=3, end_step=30, frequency=4), id="constant"),
    pytest.param(ConstantSchedule(0.3, start_step=3, frequency=4), id="constant-no-end"),
    pytest.param(OneShotSchedule(0.7, step=13), id="one-shot"),
    pytest.param(ExponentialSchedule(0.2, every=7, start_step=2, rounds=4), id="exponential"),
    pytest.param(ExponentialSchedule(0.2, every=7, end_step=20), id="exponential-end"),
    pytest.param(CallableSchedule(half_of, start_step=5, end_step=40, frequency=3), id="callable"),
    pytest.param(EveryKth(k=4, last=30), id="custom"),
]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_latest_pruning_step_equals_a_scan_of_should_prune(schedule):
    for after in range(-1, 50):
        for until in range(after, 60):
            assert schedule.latest_pruning_step(after, until) == scanned(schedule, after, until)


def test_latest_pruning_step_needs_no_loop_over_a_huge_gap():
    schedule = CubicSchedule(0.9, end_step=10**15, frequency=7)
    assert schedule.latest_pruning_step(3, 10**12) == 10**12 // 7 * 7


def schedules() -> st.SearchStrategy[Schedule]:
    window = st.tuples(st.integers(0, 20), st.integers(0, 40), st.integers(1, 9))
    final = st.floats(0.05, 0.95)
    return st.one_of(
        st.builds(
            lambda w, s: CubicSchedule(s, end_step=w[0] + w[1], start_step=w[0], frequency=w[2]),
            window,
            final,
        ),
        st.builds(
            lambda w, s: LinearSchedule(s, end_step=w[0] + w[1], start_step=w[0], frequency=w[2]),
            window,
            final,
        ),
        st.builds(
            lambda w, s: ConstantSchedule(s, start_step=w[0], end_step=w[0] + w[1], frequency=w[2]),
            window,
            final,
        ),
        st.builds(OneShotSchedule, final, st.integers(0, 40)),
        st.builds(
            lambda w, rate, rounds: ExponentialSchedule(
                rate, every=w[2], start_step=w[0], rounds=rounds
            ),
            window,
            st.floats(0.05, 0.5),
            st.integers(1, 5),
        ),
        st.builds(lambda w: CallableSchedule(half_of, start_step=w[0], frequency=w[2]), window),
        st.builds(EveryKth, st.integers(1, 9), st.integers(1, 40)),
    )


@settings(max_examples=60, deadline=None)
@given(
    schedule=schedules(),
    gaps=st.lists(st.integers(1, 9), min_size=1, max_size=25),
    first=st.integers(0, 6),
)
def test_any_increasing_steps_reach_the_exact_count_at_the_first_step_past_each_pruning_step(
    schedule, gaps, first
):
    steps = [first + sum(gaps[:i]) for i in range(len(gaps))]
    pruner = Pruner(nn.Linear(9, 7), schedule)
    total = pruner.total_count()
    pruning_steps = [p for p in range(steps[-1] + 1) if schedule.should_prune(p)]
    due = {next(s for s in steps if s >= p) for p in pruning_steps}
    changed = []
    for step in steps:
        before = pruner.pruned_count()
        pruner.step(step)
        if pruner.pruned_count() != before:
            changed.append(step)
        seen = [p for p in pruning_steps if p <= step]
        expected = round(schedule(step) * total) if seen else 0
        assert pruner.pruned_count() == expected
    assert [step for step, _, _ in pruner.history] == changed
    assert set(changed) <= due
    assert pruner.pruned_count() == (round(schedule(steps[-1]) * total) if pruning_steps else 0)
