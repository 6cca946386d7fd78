"""``Pruner.attach`` and ``optimizers=`` take a framework's wrapper for the optimizer it wraps."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import Pruner
from tensorplay.ao.pruning.pruner.attached_optimizers import unwrap_optimizer
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tests.model_state import unchanged

accelerate = pytest.importorskip("accelerate")


def _accelerated(model: nn.Module, **kwargs: float) -> torch.optim.Optimizer:
    """An AdamW as ``Accelerator.prepare`` returns it (what the HF Trainer's callbacks get)."""
    from accelerate.optimizer import AcceleratedOptimizer

    inner = torch.optim.AdamW(model.parameters(), lr=0.1, **kwargs)
    optimizer = accelerate.Accelerator(cpu=True).prepare(inner)
    assert isinstance(optimizer, AcceleratedOptimizer)
    return optimizer  # type: ignore[no-any-return]


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        model(torch.randn(4, 8)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_an_accelerated_optimizer_is_unwrapped_to_the_one_it_steps() -> None:
    model = nn.Linear(8, 8)
    wrapped = _accelerated(model)
    assert not hasattr(wrapped, "_optimizer_step_pre_hooks")  # why attaching it failed before
    assert unwrap_optimizer(wrapped) is wrapped.optimizer  # type: ignore[attr-defined]


def test_attach_through_an_accelerated_optimizer_keeps_pruned_weights_exactly_zero() -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    optimizer = _accelerated(model, weight_decay=0.1)
    pruner = Pruner(model, OneShotSchedule(0.5, step=1), masking="inplace")
    handle = pruner.attach(optimizer)
    _train(model, optimizer, 1)
    assert pruner.step(1) == 32
    pruned = ~model.weight_mask
    _train(model, optimizer, 3)  # AdamW with weight decay would revive them unhooked
    assert torch.equal(model.weight[pruned], torch.zeros(32))
    assert bool((model.weight[~pruned] != 0).all())
    # The hooks are on the optimizer the wrapper steps, and come off with the handle.
    check = unchanged(model, optimizer.optimizer)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="attached already"):
        pruner.attach(optimizer.optimizer)  # type: ignore[attr-defined]
    check()
    handle.remove()
    pruner.attach(optimizer.optimizer)  # type: ignore[attr-defined]


def test_a_reset_optimizer_given_wrapped_is_cleared() -> None:
    model = nn.Linear(8, 8)
    optimizer = _accelerated(model)
    pruner = Pruner(model, OneShotSchedule(0.5, step=1), optimizers=[optimizer])
    assert pruner.optimizers == [optimizer.optimizer]  # type: ignore[attr-defined]
    _train(model, optimizer, 1)
    assert len(optimizer.state) == 2
    pruner.step(1)
    assert len(optimizer.state) == 0


def test_a_wrapper_of_no_optimizer_is_still_refused() -> None:
    class Holder:
        optimizer = "not an optimizer"

    model = nn.Linear(2, 2)
    pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
    check = unchanged(model)
    with pytest.raises(TypeError, match="Holder at position 0"):
        pruner.attach(Holder())  # type: ignore[arg-type]
    check()
