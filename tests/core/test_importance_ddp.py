"""Importance scores under DDP (2 gloo ranks on CPU, different data per rank): every rank ends
with the same masks, and Wanda's all-reduced norms give the masks one process gets on all data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from tensorplay.ao.pruning.masking.readers import mask_of
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tests.core.gloo import spawn_gloo

WORLD = 2
CASES = [
    (score, masking)
    for score in ("movement", "taylor", "wanda")
    for masking in ("reparametrize", "inplace")
]


def _model() -> nn.Sequential:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 4))


def _batches(rank: int, count: int = 6) -> list[Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    return [torch.randn(5, 6, generator=generator) * (1 + 3 * rank) for _ in range(count)]


def _masks(model: nn.Module) -> dict[str, Tensor]:
    return {name: mask_of(model[i], "weight").bool().clone() for i, name in ((0, "0"), (2, "2"))}  # type: ignore[union-attr]


def _train(rank: int, importance: str, masking: str) -> dict[str, Tensor]:
    model = _model()
    scope = "row" if importance == "wanda" else "global"
    pruner = Pruner(
        model,
        LinearSchedule(0.6, end_step=4, frequency=2),
        importance=importance,
        scope=scope,
        masking=masking,
    )
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    if pruner.importance.needs_gradients or pruner.mode.hooks_optimizers:
        pruner.attach(optimizer)
    for step, x in enumerate(_batches(rank)):
        ddp(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        pruner.step(step)
    assert len(pruner.history) == 2
    return _masks(model)


def _one_shot_wanda(batches: list[Tensor]) -> dict[str, Tensor]:
    model = _model()
    pruner = Pruner(model, OneShotSchedule(0.5), importance="wanda", scope="row")
    with torch.no_grad():
        for x in batches:
            model(x)
    pruner.step()
    return _masks(model)


def _worker(rank: int, out: Path) -> None:
    results: dict[str, Any] = {f"{s}-{m}": _train(rank, s, m) for s, m in CASES}
    results["wanda-one-shot"] = _one_shot_wanda(_batches(rank))
    torch.save(results, out / f"rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_every_score_gives_identical_masks_on_ranks_that_see_different_data(tmp_path):
    spawn_gloo(_worker, WORLD, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    assert (
        sorted(ranks[0])
        == sorted(ranks[1])
        == sorted([f"{s}-{m}" for s, m in CASES] + ["wanda-one-shot"])
    )
    for case, masks in ranks[0].items():
        for name, mask in masks.items():
            assert torch.equal(mask, ranks[1][case][name]), (case, name)
    # Wanda's norms are over both ranks' batches: one process on all the data agrees, and one
    # rank's data alone would not.
    everything = _one_shot_wanda(_batches(0) + _batches(1))
    alone = _one_shot_wanda(_batches(0))
    for name, mask in ranks[0]["wanda-one-shot"].items():
        assert torch.equal(mask, everything[name]), name
    assert any(not torch.equal(alone[name], everything[name]) for name in everything)
