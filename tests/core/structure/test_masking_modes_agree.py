"""The masking mode never chooses units: under a gradual schedule both modes prune the same
channels at every step, because unit scores read the weights the model computes with (a
reparametrization's ``_orig`` keeps the values of units already pruned)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.masking import mask_of
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.config import Masking
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule

SCHEDULE = CubicSchedule(0.75, end_step=8, frequency=2)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
    )  # fmt: skip


def keep_masks(model: nn.Module) -> list[Tensor]:
    found = []
    for module in model.modules():
        for name in ("weight", "bias"):
            mask = mask_of(module, name)
            if mask is not None:
                found.append(mask.to(torch.bool).clone())
    return found


def masks_per_step(masking: Masking, importance: str) -> list[list[Tensor]]:
    model = mlp()
    torch.manual_seed(1)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    pruner = Pruner(
        model, SCHEDULE, structure="channel", example_inputs=x, masking=masking,
        importance=importance,
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if masking == "inplace":
        pruner.attach(optimizer)  # its steps keep the pruned weights zero and accumulate
    steps = []
    for _ in range(SCHEDULE.end_step + 1):
        nn.functional.mse_loss(model(x), y).backward()
        if masking == "reparametrize":
            pruner.accumulate()
        optimizer.step()
        optimizer.zero_grad()
        pruner.step()
        steps.append(keep_masks(model))
    return steps


@pytest.mark.parametrize("importance", ["magnitude", "taylor"])
def test_both_masking_modes_prune_the_same_channels_at_every_step(importance: str) -> None:
    reparametrized = masks_per_step("reparametrize", importance)
    lean = masks_per_step("inplace", importance)
    assert len(reparametrized) == len(lean) == SCHEDULE.end_step + 1
    assert sum(int((~m).sum()) for m in reparametrized[-1]) > 0
    for step, (first, second) in enumerate(zip(reparametrized, lean, strict=True)):
        assert len(first) == len(second), step
        for one, other in zip(first, second, strict=True):
            assert torch.equal(one, other), f"step {step}"
