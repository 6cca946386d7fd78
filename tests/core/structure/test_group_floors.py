"""Floors per group under structure: ``min_density`` holds for every group as it does for a
tensor (with ``multiple_of`` too), and a global step that leaves a group 10% of its units or
fewer warns, naming the group and the fixes."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule, Schedule

WIDTH = 32


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 4)
    )  # fmt: skip


def channels(schedule: Schedule, **options: object) -> Pruner:
    return Pruner(
        mlp(), schedule, structure="channel", example_inputs=torch.randn(2, 16),
        **options,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize("multiple", [1, 8])
@pytest.mark.parametrize("scope", ["global", "layerwise"])
def test_min_density_holds_for_every_group(scope: str, multiple: int) -> None:
    min_density = 0.3
    pruner = channels(
        OneShotSchedule(0.95), scope=scope, min_density=min_density, multiple_of=multiple
    )
    pruner.step()
    rows = pruner.report().rows
    assert len(rows) == 2
    floor = math.ceil(min_density * WIDTH)  # 10; rounded up to a multiple of 8: 16
    least = multiple * math.ceil(floor / multiple)
    assert [row.numel - row.pruned for row in rows] == [least, least]


def test_a_group_left_a_tenth_or_less_warns_naming_it_and_the_fixes() -> None:
    pruner = channels(CubicSchedule(0.75, end_step=8, frequency=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(9):
            pruner.step()
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(messages) == 1, messages
    kept = {row.name: row.numel - row.pruned for row in pruner.report().rows}
    assert kept["2"] <= WIDTH // 10 < kept["0"]
    assert "units of group '2'" in messages[0]
    assert "min_density" in messages[0] and "scope='layerwise'" in messages[0]


def test_no_warning_while_every_group_keeps_more_than_a_tenth() -> None:
    pruner = channels(CubicSchedule(0.75, end_step=8, frequency=2), min_density=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(9):
            pruner.step()
    assert min(row.numel - row.pruned for row in pruner.report().rows) > WIDTH // 10
