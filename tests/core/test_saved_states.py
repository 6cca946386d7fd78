"""States saved before the pruner was split into masking modes load and resume exactly.

``data/saved_states.pt`` was written by ``data/make_saved_states.py`` with tensorplay at commit
0eb8869 (pruner state version 3): the pruner's and the model's state after 5 steps, and the
model's state and history after 5 more. Today's code loads the first and must reach the second
bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tensorplay.ao.pruning.pruner import Pruner
from tensorplay.ao.pruning.schedules import LinearSchedule
from tests.core.data.make_saved_states import CASES, model, train

SAVED = torch.load(Path(__file__).parent / "data" / "saved_states.pt", weights_only=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_state_saved_before_the_redesign_resumes_bit_for_bit(name: str) -> None:
    options: dict[str, Any] = CASES[name]
    saved = SAVED[name]
    assert saved["pruner"]["version"] == 3
    net = model()
    pruner = Pruner(net, LinearSchedule(0.8, end_step=8, frequency=2), **options)
    pruner.reparametrize()
    assert not torch.equal(net.state_dict()["0.weight_mask"], saved["model"]["0.weight_mask"])
    net.load_state_dict(saved["model"], strict=True)
    pruner.load_state_dict(saved["pruner"])
    assert (pruner.last_step, pruner.seed) == (saved["pruner"]["step"], options["seed"])
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    if pruner.mode.hooks_optimizers:
        pruner.attach(optimizer)
    train(net, pruner, optimizer, range(5, 10))
    after = net.state_dict()
    assert sorted(after) == sorted(saved["after"])
    for key, value in saved["after"].items():
        assert torch.equal(after[key], value), key
    assert pruner.history == [tuple(entry) for entry in saved["history"]]
