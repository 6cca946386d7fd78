"""``multiple_of`` as documented: checked against every group when the pruner is built, every
step rounds each kept width to the nearest multiple (half up), and a schedule whose final target
the rounding reaches never aborts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule, Schedule
from tests.model_state import unchanged

WIDTH, MULTIPLE = 128, 64


def wide_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 4)
    )  # fmt: skip


def pruner_of(model: nn.Module, schedule: Schedule, scope: str, multiple: int) -> Pruner:
    return Pruner(
        model, schedule, structure="channel", example_inputs=torch.randn(2, 16),
        scope=scope, multiple_of=multiple,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize("scope", ["global", "layerwise"])
def test_a_gradual_schedule_rounds_every_step_and_runs_to_its_end(scope: str) -> None:
    schedule = CubicSchedule(0.7, end_step=12)
    pruner = pruner_of(wide_mlp(), schedule, scope, MULTIPLE)
    for step in range(13):
        pruner.step()
        rows = pruner.report().rows
        assert len(rows) == 2
        assert all((row.numel - row.pruned) % MULTIPLE == 0 for row in rows), step
        asked = round(schedule(step) * 2 * WIDTH)
        assert abs(pruner.pruned_count() - asked) <= MULTIPLE // 2 * len(rows), step
    assert pruner.last_step == 12
    assert [row.pruned for row in pruner.report().rows] == [64, 64]


@pytest.mark.parametrize("scope", ["global", "layerwise"])
def test_a_one_shot_target_the_rounding_reaches_is_taken(scope: str) -> None:
    pruner = pruner_of(wide_mlp(), OneShotSchedule(0.75), scope, MULTIPLE)
    assert pruner.step() == 128
    assert [row.pruned for row in pruner.report().rows] == [64, 64]


def test_a_target_beyond_the_rounding_is_refused_saying_why_when_the_pruner_is_built() -> None:
    model = wide_mlp()
    check = unchanged(model)
    match = (
        r"at least 64 units \(multiple_of=64: at most 128 more from 2 groups of 256 units, "
        r"and 64 more that rounding .* gives back\), but the target asks for 230 more"
    )
    with pytest.raises(ValueError, match=match):
        pruner_of(model, OneShotSchedule(0.9, step=30), "global", MULTIPLE)
    check()


def test_a_multiple_wider_than_a_group_is_refused_when_the_pruner_is_built() -> None:
    model = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 16), nn.ReLU())
    model.append(nn.Linear(16, 2))
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"at most the width of every channel group, but got 32: "
                       r"group '2' has 16 units"):  # fmt: skip
        Pruner(
            model, OneShotSchedule(0.5), structure="channel", example_inputs=torch.randn(2, 4),
            multiple_of=32,
        )  # fmt: skip
    check()  # no mask, no hook, and no unit groups recorded on the model
