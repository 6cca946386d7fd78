"""Structured pruning on several ranks: identical masks under DDP where the ranks see different
data (Wanda's norms and Taylor's gradients), and FSDP2 refused before any change."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tests.core.gloo import spawn_gloo

WORLD = 2
CASES = [
    (score, masking) for score in ("taylor", "wanda") for masking in ("reparametrize", "inplace")
]


def _model() -> nn.Sequential:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 4)
        )


def _train(rank: int, importance: str, masking: str) -> dict[str, Tensor]:
    model = _model()
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    batches = [torch.randn(5, 6, generator=generator) * (1 + 3 * rank) for _ in range(6)]
    pruner = Pruner(
        model, LinearSchedule(0.5, end_step=4, frequency=2), structure="channel",
        importance=importance, masking=masking, example_inputs=batches[0],  # type: ignore[arg-type]
    )  # fmt: skip
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    if pruner.importance.needs_gradients or pruner.mode.hooks_optimizers:
        pruner.attach(optimizer)  # accumulates Taylor's scores, keeps the lean zeros
    for step, x in enumerate(batches):
        ddp(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        pruner.step(step)
    assert len(pruner.history) == 2 and pruner.pruned_count() == 14
    return {k: v.bool().clone() for k, v in model.state_dict().items() if k.endswith("_mask")}


def _worker(rank: int, out: Path) -> None:
    torch.save({f"{s}-{m}": _train(rank, s, m) for s, m in CASES}, out / f"rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_ranks_that_see_different_data_hold_identical_unit_masks(tmp_path: Path) -> None:
    spawn_gloo(_worker, WORLD, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    assert sorted(ranks[0]) == sorted(ranks[1]) == sorted(f"{s}-{m}" for s, m in CASES)
    for case, masks in ranks[0].items():
        assert sorted(masks) == sorted(ranks[1][case]) and len(masks) == 5  # 3 weights, 2 biases
        for name, mask in masks.items():
            assert torch.equal(mask, ranks[1][case][name]), (case, name)


def _sharded(rank: int, out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    model = _model()
    mesh = init_device_mesh("cpu", (1,))
    model[0].weight = nn.Parameter(distribute_tensor(model[0].weight.detach(), mesh, [Shard(0)]))
    try:
        Pruner(model, LinearSchedule(0.5, end_step=4), structure="channel")
    except ValueError as error:
        (out / "error.txt").write_text(str(error))
    (out / "keys.txt").write_text(" ".join(sorted(model.state_dict())))


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_parameters_under_the_reparametrization_are_refused_before_any_change(
    tmp_path: Path,
) -> None:
    spawn_gloo(_sharded, 1, tmp_path)
    error = (tmp_path / "error.txt").read_text()
    assert "'0.weight' is a DTensor (FSDP2)" in error and "masking='inplace'" in error
    assert "mask" not in (tmp_path / "keys.txt").read_text()
