"""States saved before the pruner was split into masking modes load and resume exactly.

``data/saved_states.pt`` was written by ``data/make_saved_states.py`` with tensorplay at commit
0eb8869 (pruner state version 3), on another machine: the pruner's and the model's state after 5
steps of a run. The file supplies states only. Today's code loads them and trains 5 more steps;
the reference is the same run uninterrupted, computed here, in this process. Masks, counts,
history and counters must be equal exactly. Weights are compared with a stated tolerance: the
saved ones were computed by another CPU, whose last bits may differ (by up to 1.5e-8 here), and
5 SGD steps carry such a difference along without growing it past ``1e-6``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.masking import mask_of
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tests.core.data.make_saved_states import CASES, model, train

SAVED = torch.load(Path(__file__).parent / "data" / "saved_states.pt", weights_only=True)
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def run(options: dict[str, Any], net: nn.Module) -> tuple[Pruner, torch.optim.Optimizer]:
    pruner = Pruner(net, LinearSchedule(0.8, end_step=8, frequency=2), **options)
    pruner.reparametrize()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    if pruner.mode.hooks_optimizers:
        pruner.attach(optimizer)
    return pruner, optimizer


def masks(net: nn.Module) -> dict[str, Tensor]:
    found = {}
    for name, module in net.named_modules():
        mask = mask_of(module, "weight")
        if mask is not None:
            found[name] = mask.bool().clone()  # a lean mask is bool already: a copy
    return found


def assert_same_run(net: nn.Module, pruner: Pruner, other: nn.Module, reference: Pruner) -> None:
    """Masks, counts and history exactly; values within :data:`TOLERANCE`."""
    assert masks(net).keys() == masks(other).keys() and masks(net)
    for name, mask in masks(net).items():
        assert torch.equal(mask, masks(other)[name]), name
    assert pruner.history == reference.history
    assert (pruner.last_step, pruner.last_pruned_step) == (
        reference.last_step,
        reference.last_pruned_step,
    )
    assert pruner.pruned_count() == reference.pruned_count()
    state, expected = net.state_dict(), other.state_dict()
    assert sorted(state) == sorted(expected)
    for key, value in expected.items():
        torch.testing.assert_close(state[key], value, **TOLERANCE, msg=key)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_state_saved_before_the_redesign_resumes_like_an_uninterrupted_run(name: str) -> None:
    options: dict[str, Any] = CASES[name]
    saved = SAVED[name]
    assert saved["pruner"]["version"] == 3

    whole = model()
    reference, reference_optimizer = run(options, whole)
    train(whole, reference, reference_optimizer, range(5))
    at_five = masks(whole)
    train(whole, reference, reference_optimizer, range(5, 10))

    net = model()
    pruner, optimizer = run(options, net)
    assert not torch.equal(net.state_dict()["0.weight_mask"], saved["model"]["0.weight_mask"])
    net.load_state_dict(saved["model"], strict=True)
    assert all(torch.equal(mask, at_five[key]) for key, mask in masks(net).items())
    pruner.load_state_dict(saved["pruner"])
    assert (pruner.last_step, pruner.seed) == (saved["pruner"]["step"], options["seed"])
    train(net, pruner, optimizer, range(5, 10))
    assert_same_run(net, pruner, whole, reference)
    assert len(pruner.history) == 4  # steps 2, 4, 6 and 8


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_resume_in_this_process_is_bit_for_bit(name: str) -> None:
    """The same resume with states saved here by today's code: every value equal exactly."""
    options: dict[str, Any] = CASES[name]
    whole = model()
    reference, reference_optimizer = run(options, whole)
    train(whole, reference, reference_optimizer, range(10))

    first = model()
    pruner, optimizer = run(options, first)
    train(first, pruner, optimizer, range(5))
    states = (first.state_dict(), pruner.state_dict(), optimizer.state_dict())
    net = model()
    resumed, resumed_optimizer = run(options, net)
    net.load_state_dict(states[0], strict=True)
    resumed.load_state_dict(states[1])
    resumed_optimizer.load_state_dict(states[2])
    train(net, resumed, resumed_optimizer, range(5, 10))
    assert resumed.history == reference.history
    expected = whole.state_dict()
    assert sorted(net.state_dict()) == sorted(expected)
    for key, value in net.state_dict().items():
        assert torch.equal(value, expected[key]), key
