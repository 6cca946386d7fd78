"""Sharded ``clear_lowest`` across gloo processes equals one process on the full tensors.

Each worker (one spawn per test, many cases inside) builds the same full tensors from a seed,
keeps only its rows (uneven, some ranks holding none of a source), selects with the group and
writes its mask pieces; the parent puts the pieces together and compares them bit for bit with
``clear_lowest`` on the full tensors. Also with real ``DTensor``\\ s and an FSDP2 model.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor

from tensorplay.ao.pruning.selection import (
    AbsKeys,
    KeySpec,
    ShardLayout,
    SubsetKeys,
    UniformKeys,
    clear_lowest,
    clear_lowest_capped,
)
from tests.core.gloo import spawn_gloo
from tests.core.selection.reference import small_constants

SHAPES = [(13, 7), (1, 5), (40, 3), (9,), (64, 16)]


def case(seed: int) -> dict[str, Any]:
    """A problem: full scores and bool masks, ``k``, caps, keys, scope (same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    ties = seed % 3  # 0: continuous; else integer scores in [-ties, ties]
    scores, keep = [], []
    for shape in SHAPES:
        values = (
            torch.randint(-ties, ties + 1, shape, generator=g).float()
            if ties
            else torch.randn(shape, generator=g)
        )
        scores.append(values.to([torch.float32, torch.bfloat16][seed % 2]))
        keep.append(torch.rand(shape, generator=g) < [1.0, 0.7][seed // 2 % 2])
    caps = [int(torch.randint(0, int(m.sum()) + 1, (1,), generator=g)) for m in keep]
    available = sum(int(m.sum()) for m in keep)
    return {
        "scores": scores,
        "keep": keep,
        "k": int(torch.randint(0, available + 1, (1,), generator=g)),
        "caps": caps,
        "capped_k": sum(caps) // 2,
        "keys": AbsKeys() if seed % 4 < 2 else UniformKeys(seed),
        "small": seed % 5 != 0,  # tiny constants reach every path; some default
    }


def rows_of(rank: int, world: int, seed: int, rows: int) -> tuple[int, int]:
    """This rank's rows ``[a, b)`` of a source: uneven cuts, some ranks holding none."""
    g = torch.Generator().manual_seed(seed * 131 + rows)
    cuts = sorted(torch.randint(0, rows + 1, (world - 1,), generator=g).tolist())
    bounds = [0, *cuts, rows]
    return bounds[rank], bounds[rank + 1]


def run_case(problem: dict[str, Any], pieces: list[slice], group: Any, mode: str) -> list[Tensor]:
    """The selection of one case on this rank's pieces; returns the local masks (flat)."""
    scores = [s.reshape(-1)[p].clone() for s, p in zip(problem["scores"], pieces, strict=True)]
    keep = [m.reshape(-1)[p].clone() for m, p in zip(problem["keep"], pieces, strict=True)]
    layouts = [
        ShardLayout(s.numel(), p.start) for s, p in zip(problem["scores"], pieces, strict=True)
    ]
    with small_constants() if problem["small"] else nullcontext():
        select(problem, scores, keep, layouts, group, mode)
    return keep


def select(
    problem: dict[str, Any],
    scores: list[Tensor],
    keep: list[Tensor],
    layouts: list[ShardLayout],
    group: Any,
    mode: str,
) -> None:
    """Clear the bits of one case: global, layer-wise (one call per source) or capped."""
    keys: KeySpec = problem["keys"]
    if mode == "global":
        clear_lowest(scores, keep, problem["k"], keys, shards=layouts, group=group)
    elif mode == "layer":  # one source per call, as layer-wise pruning does
        for i in range(len(scores)):
            k = int(problem["keep"][i].sum()) // 3
            clear_lowest(
                [scores[i]], [keep[i]], k, _source(keys, i), shards=[layouts[i]], group=group
            )
    else:
        clear_lowest_capped(
            scores, keep, problem["capped_k"], keys, problem["caps"], shards=layouts, group=group
        )


def _source(keys: KeySpec, i: int) -> KeySpec:
    """Keys of source ``i`` alone, as the whole selection sees them."""
    return SubsetKeys(keys, [i])


def worker(rank: int, out: Path, seeds: list[int]) -> None:
    world = dist.get_world_size()
    results: dict[str, Any] = {}
    for seed in seeds:
        problem = case(seed)
        pieces = []
        for s in problem["scores"]:
            a, b = rows_of(rank, world, seed, s.shape[0])
            row = s.numel() // s.shape[0]
            pieces.append(slice(a * row, b * row))
        for mode in ["global", "layer", "capped"]:
            results[f"{seed}-{mode}"] = (pieces, run_case(problem, pieces, dist.group.WORLD, mode))
    torch.save({"results": results, "dtensor": dtensor_case(world)}, out / f"rank{rank}.pt")


def dtensor_case(world: int) -> dict[str, Any]:
    """Real DTensors: ``distribute_tensor`` pieces and an FSDP2 ``fully_shard`` MLP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    full = [torch.randn(7, 5), torch.randn(1, 9), torch.randn(30)]
    scores = [distribute_tensor(t, mesh, [Shard(0)]) for t in full]
    keep = [distribute_tensor(torch.ones_like(t, dtype=torch.bool), mesh, [Shard(0)]) for t in full]
    clear_lowest(scores, keep, 20, AbsKeys())
    model = torch.nn.Sequential(torch.nn.Linear(6, 11), torch.nn.ReLU(), torch.nn.Linear(11, 3))
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    params = [p for p in model.parameters()]
    masks = [
        distribute_tensor(torch.ones(p.shape, dtype=torch.bool), p.device_mesh, p.placements)
        for p in params
    ]
    clear_lowest(params, masks, 50, UniformKeys(3))
    replicated = distribute_tensor(torch.ones(4), mesh, [Replicate()])
    try:  # every rank holds all of it: its units would count once per rank
        clear_lowest([replicated], [torch.ones(4, dtype=torch.bool)], 1, AbsKeys())
        refused = ""
    except ValueError as error:
        refused = str(error)
    return {
        "replicate_refused": refused,
        "distributed": [m.full_tensor() for m in keep],  # gathered only to compare
        "fsdp": [m.full_tensor() for m in masks],
        "fsdp_weights": [p.full_tensor().detach() for p in params],
        "full": full,
    }


def run_workers(world: int, seeds: list[int], tmp_path: Path) -> list[dict[str, Any]]:
    spawn_gloo(partial(worker, seeds=seeds), world, tmp_path)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


def assert_sharded_equals_whole(world: int, seeds: list[int], tmp_path: Path) -> None:
    ranks = run_workers(world, seeds, tmp_path)
    for seed in seeds:
        problem = case(seed)
        for mode in ["global", "layer", "capped"]:
            flat = [m.reshape(-1).clone() for m in problem["keep"]]
            full = [s.reshape(-1) for s in problem["scores"]]
            want = run_case(problem, [slice(0, s.numel()) for s in full], None, mode)
            got = [torch.zeros_like(m) for m in flat]
            covered = [torch.zeros(m.numel(), dtype=torch.int64) for m in flat]
            for rank in ranks:
                pieces, masks = rank["results"][f"{seed}-{mode}"]
                for i, (piece, mask) in enumerate(zip(pieces, masks, strict=True)):
                    got[i][piece] = mask
                    covered[i][piece] += 1
            assert all(bool((c == 1).all()) for c in covered)
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a, b), (seed, mode)
    dtensor = ranks[0]["dtensor"]
    full = dtensor["full"]
    keep = [torch.ones_like(t, dtype=torch.bool) for t in full]
    clear_lowest(full, keep, 20, AbsKeys())
    assert all(torch.equal(a, b) for a, b in zip(dtensor["distributed"], keep, strict=True))
    weights = dtensor["fsdp_weights"]
    keep = [torch.ones(w.shape, dtype=torch.bool) for w in weights]
    clear_lowest(weights, keep, 50, UniformKeys(3))
    assert all(torch.equal(a, b) for a, b in zip(dtensor["fsdp"], keep, strict=True))
    assert "counted more than once" in dtensor["replicate_refused"]


@pytest.mark.distributed
def test_two_ranks_equal_one_process(tmp_path: Path) -> None:
    assert_sharded_equals_whole(2, list(range(8)), tmp_path)


@pytest.mark.slow
@pytest.mark.distributed
def test_four_ranks_equal_one_process(tmp_path: Path) -> None:
    assert_sharded_equals_whole(4, list(range(20)), tmp_path)
