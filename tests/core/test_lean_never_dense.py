"""A lean model is never silently dense: the pruner notices weights trained back or edited,
zeroes them again and says so, and its counts are what the weights hold."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning.masking.stats import sparsity_report
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))  # 1,152 weights


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    inputs = torch.randn(16, 32, generator=torch.Generator().manual_seed(step))
    optimizer.zero_grad()
    model(inputs).pow(2).mean().backward()
    optimizer.step()


def zeros_under_masks(model: nn.Module) -> tuple[int, int]:
    """(pruned weights that are zero, pruned weights) over the masked layers."""
    zero = pruned = 0
    for layer in (model[0], model[2]):
        off = ~layer.weight_mask
        zero += int((layer.weight.detach()[off] == 0).sum())
        pruned += int(off.sum())
    return zero, pruned


def test_an_unattached_plain_loop_keeps_exact_zeros_and_warns_once() -> None:
    model = make_model()
    pruner = Pruner(model, CubicSchedule(0.8, end_step=20, frequency=5), masking="inplace")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(25):
            train_step(model, optimizer, step)
            pruner.step()
    revived = [w for w in caught if "Pruned weights were not zero" in str(w.message)]
    assert len(revived) == 1
    message = str(revived[0].message)
    assert "'0.weight'" in message and "no optimizer is attached" in message
    assert "pruner.attach(optimizer)" in message
    assert revived[0].filename == __file__  # points at the loop's pruner.step()
    # AdamW revives pruned weights at every step; each pruner.step() zeroes them again.
    assert zeros_under_masks(model) == (922, 922)
    assert pruner.pruned_count() == 922 == round(0.8 * 1152)
    assert pruner.sparsity() == 922 / 1152


def test_an_attached_optimizer_needs_no_check_between_pruning_steps() -> None:
    model = make_model()
    pruner = Pruner(model, CubicSchedule(0.8, end_step=20, frequency=5), masking="inplace")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    pruner.attach(optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(25):
            train_step(model, optimizer, step)
            pruner.step()
    assert zeros_under_masks(model) == (922, 922)


def test_a_hand_edit_is_counted_at_once_and_zeroed_at_the_next_pruning_step() -> None:
    model = make_model()
    pruner = Pruner(model, CubicSchedule(0.8, end_step=20, frequency=10), masking="inplace")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    pruner.attach(optimizer)
    for step in range(11):
        train_step(model, optimizer, step)
        pruner.step()
    before = pruner.pruned_count()
    with torch.no_grad():
        model[0].weight.add_(1.0)  # e.g. an EMA or a state copied in by hand
    edited = int((~model[0].weight_mask).sum())
    assert pruner.pruned_count() == before - edited  # the report claims no zeros it lacks
    assert sparsity_report(model, ["0.weight", "2.weight"]).pruned == before - edited
    with pytest.warns(UserWarning, match=rf"\({edited} of '0.weight'\).*attached optimizers"):
        pruner.step(20)
    zero, pruned = zeros_under_masks(model)
    assert zero == pruned == pruner.pruned_count() == round(0.8 * 1152)


def test_an_edit_through_data_is_never_counted_as_pruned() -> None:
    model = make_model()
    pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
    pruner.step()
    assert pruner.pruned_count() == 576
    model[2].weight.data[~model[2].weight_mask] = 3.0  # torch keeps no version for .data
    revived = int((~model[2].weight_mask).sum())
    assert pruner.pruned_count() == 576 - revived
    rows = [row.pruned for row in pruner.report().rows]
    assert rows[1] == 0 and sum(rows) == 576 - revived


def test_the_reparametrization_never_warns_in_a_plain_loop() -> None:
    model = make_model()
    pruner = Pruner(model, CubicSchedule(0.8, end_step=20, frequency=5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(25):
            train_step(model, optimizer, step)
            pruner.step()
    assert pruner.pruned_count() == 922
