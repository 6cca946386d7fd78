"""Writes ``saved_states.pt``: pruner and model states saved by tensorplay before the pruner was
split into masking modes (commit 0eb8869), after 5 steps of a run. States only: the test's
reference is the same run uninterrupted, computed by today's code where the test runs.

Run from a checkout of that commit (the test loads the file with today's code):
``PYTHONPATH=<old checkout> python tests/core/data/make_saved_states.py tests/core/data``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from tensorplay.ao.pruning import LinearSchedule, Pruner

CASES = {
    "reparametrize-rewind": {"masking": "reparametrize", "rewind": "init", "seed": 3},
    "inplace-min-density": {"masking": "inplace", "min_density": 0.2, "seed": 5},
    "inplace-random": {"masking": "inplace", "method": "random_unstructured", "seed": 7},
}


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def train(net: nn.Module, pruner: Pruner, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        generator = torch.Generator().manual_seed(step)
        inputs = torch.randn(16, 8, generator=generator)
        optimizer.zero_grad()
        net(inputs).pow(2).mean().backward()
        optimizer.step()
        pruner.step()


def case(options: dict[str, object]) -> dict[str, object]:
    net = model()
    schedule = LinearSchedule(0.8, end_step=8, frequency=2)
    pruner = Pruner(net, schedule, **options)  # type: ignore[arg-type]
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    if options["masking"] == "inplace":
        pruner.attach(optimizer)
    train(net, pruner, optimizer, range(5))
    return {
        "pruner": pruner.state_dict(),
        "model": {k: v.clone() for k, v in net.state_dict().items()},
    }


if __name__ == "__main__":
    out = Path(sys.argv[1]) / "saved_states.pt"
    torch.save({name: case(options) for name, options in CASES.items()}, out)
    print(out)
