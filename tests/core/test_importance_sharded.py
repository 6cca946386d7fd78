"""Importance scores and ``scope="row"`` on FSDP2 (``fully_shard``, 2 gloo ranks on CPU): the
accumulators are sharded like the weights, and the masks equal one process's on the same data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tests.core.gloo import spawn_gloo
from tests.core.test_importance_ddp import WORLD
from tests.core.test_inplace_sharded import STEPS, WEIGHTS, _data, _full, _model, _shard
from tests.core.test_row_scope import Conv1D

CASES = {
    "movement-global": {"importance": "movement"},
    "taylor-row": {"importance": "taylor", "scope": "row"},
    "wanda-row": {"importance": "wanda", "scope": "row"},
    "magnitude-row": {"scope": "row"},
}


def run(options: dict[str, Any], sharded: bool) -> dict[str, Any]:
    model = _model()
    if sharded:
        _shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    schedule = LinearSchedule(0.6, end_step=STEPS - 2, frequency=3)
    pruner = Pruner(model, schedule, masking="inplace", **options)
    pruner.attach(optimizer)
    inputs, targets = _data()
    for step in range(STEPS):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs[step]), targets[step]).backward()
        optimizer.step()
        pruner.step(step)
    sums = pruner.importance.state_dict().get("sums", {})
    return {
        "masks": {name: _full(model.get_buffer(name + "_mask")) for name in WEIGHTS},
        "sums": {name: _full(value) for name, value in sums.items()},
        "sharded_sums": any(hasattr(value, "device_mesh") for value in sums.values()),
        "history": list(pruner.history),
    }


def _split_rows_refusal() -> str:
    """A sharded Conv1D (rows are columns, split by Shard(0)) with scope='row': refused."""
    model = nn.Sequential(nn.Linear(4, 6), Conv1D(6, 3))
    _shard(model)
    pruner = Pruner(model, LinearSchedule(0.5, end_step=0), masking="inplace", scope="row")
    before = {name: _full(value) for name, value in model.state_dict().items()}
    try:
        pruner.step(0)
    except ValueError as error:
        after = {name: _full(value) for name, value in model.state_dict().items()}
        unchanged = sorted(after) == sorted(before) and all(
            torch.equal(after[k], v) for k, v in before.items()
        )
        return f"{error} unchanged={unchanged}"
    return "not refused"


def _worker(rank: int, out: Path) -> None:
    results: dict[str, Any] = {name: run(options, sharded=True) for name, options in CASES.items()}
    results["refusal"] = _split_rows_refusal()
    torch.save(results, out / f"rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_scores_and_rows_equal_one_process(tmp_path):
    spawn_gloo(_worker, WORLD, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    oracles = {name: run(options, sharded=False) for name, options in CASES.items()}
    for name, oracle in oracles.items():
        assert oracle["history"] and all(r[name]["history"] == oracle["history"] for r in ranks)
        for rank in ranks:
            for weight in WEIGHTS:
                assert torch.equal(rank[name]["masks"][weight], oracle["masks"][weight]), (
                    name,
                    weight,
                )
            assert sorted(rank[name]["sums"]) == sorted(oracle["sums"])
            for key, value in oracle["sums"].items():
                assert torch.allclose(rank[name]["sums"][key], value, rtol=1e-5, atol=1e-7), key
            assert rank[name]["sharded_sums"] == (name.startswith(("movement", "taylor")))
    for rank in ranks:
        assert "sharded (DTensor) target (Conv1D, 'weight') ('1.weight')" in rank["refusal"]
        assert "rows along axis 1" in rank["refusal"] and rank["refusal"].endswith("unchanged=True")
