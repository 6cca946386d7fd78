"""Channels, heads and layers under FSDP2 (``fully_shard``), with lean masks: each rank sums
per unit what it holds, one ``all_reduce`` per pruning step gives every unit's score, and the
full masks equal those one process computes on an unsharded copy, step for step.

The quick tests check the partial sums and the local masks on shards simulated in one process
(uneven, one empty, a unit straddling two shards). The slow test runs 2 gloo ranks on CPU: a
tiny Llama (grouped-query attention) with ``fully_shard`` on each decoder layer and the root,
and an MLP whose layers split unevenly (7 = 4 + 3 and 13 = 7 + 6 rows; one rank holds no row of
the last), trained with SGD between the steps of a ``LinearSchedule``. Unit scores add the ranks'
float64 partial sums, which may differ from one process's sums in the last bits: the weights are
random (no two units' scores that close), and the masks are compared exactly.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.structured.dependency.unit_groups import (
    Slice,
    UnitGroup,
    expand_keep,
    units_view,
)
from tensorplay.ao.pruning.structured.units.sharded_units import local_keep, slice_sums

transformers = pytest.importorskip("transformers")

WORLD = 2
STEPS = 5  # the last pruning step is 3: step 4 trains the pruned model once more
SCHEDULE_END = 3
TOKENS = torch.randint(0, 97, (STEPS, 2, 8), generator=torch.Generator().manual_seed(5))
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-channel": ("llama", {"structure": "channel"}),
    "llama-head": ("llama", {"structure": "head"}),
    "llama-layer": ("llama", {"structure": "layer"}),
    "llama-channel-taylor": ("llama", {"structure": "channel", "importance": "taylor"}),
    "llama-head-wanda": ("llama", {"structure": "head", "importance": "wanda"}),
    "llama-channel-layerwise-random": (
        "llama",
        {"structure": "channel", "scope": "layerwise", "method": "random_unstructured"},
    ),
    "llama-channel-random-unseeded": (  # every rank draws rank zero's units
        "llama",
        {"structure": "channel", "method": "random_unstructured", "seed": None},
    ),
    "llama-both-budget": ("llama", {"structure": ("channel", "head"), "target_params": 0.8}),
    "mlp-channel": ("mlp", {"structure": "channel"}),
}

# -- quick: the partial sums and local masks on simulated shards ---------------------------------

SHAPE = (11, 6)
GROUP = UnitGroup(
    "g",
    "channel",
    3,
    (Slice("w", 0, offset=1, width=3), Slice("w", 1, width=2), Slice("b", 0, offset=2)),
)
SPLITS = [(0, 4, 4, 11), (0, 5, 11), (0, 11)]  # shard boundaries: uneven, empty, one rank


def _pieces(tensor: Tensor, bounds: tuple[int, ...]) -> list[tuple[int, Tensor]]:
    return [(start, tensor[start:end]) for start, end in itertools.pairwise(bounds)]


@pytest.mark.parametrize("bounds", SPLITS, ids=["uneven-empty", "two", "one"])
@pytest.mark.parametrize(
    "piece", [*GROUP.slices[:2], Slice("w", None)], ids=["rows", "cols", "all"]
)
def test_partial_sums_over_shards_are_the_whole_slice_sums(bounds, piece):
    values = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    size = 1 if piece.dim is None else GROUP.size
    whole = units_view(values, piece, size).flatten(1).sum(1)
    parts = [slice_sums(local, piece, size, start) for start, local in _pieces(values, bounds)]
    assert torch.allclose(torch.stack(parts).sum(0), whole, rtol=1e-12, atol=0)
    kept = torch.rand(SHAPE, generator=torch.Generator().manual_seed(1)) > 0.5
    counts = [slice_sums(local, piece, size, start) for start, local in _pieces(kept, bounds)]
    expected = units_view(kept, piece, size).flatten(1).sum(1).to(torch.float64)
    assert torch.equal(torch.stack(counts).sum(0), expected)


@pytest.mark.parametrize("bounds", SPLITS, ids=["uneven-empty", "two", "one"])
def test_local_masks_of_every_shard_make_the_full_mask(bounds):
    keep = torch.tensor([True, False, False])
    shapes = {"w": torch.Size(SHAPE), "b": torch.Size([11])}
    full = expand_keep(GROUP, keep, shapes)
    for name, shape in shapes.items():
        pieces = [
            local_keep(GROUP, keep, name, torch.ones(local.shape, dtype=torch.bool), start)
            for start, local in _pieces(torch.zeros(shape), bounds)
        ]
        assert torch.equal(torch.cat(pieces), full[name]), name


# -- slow: 2 gloo ranks against one process ------------------------------------------------------


def _llama() -> nn.Module:
    from tests.hf_models import tiny_llama

    model = tiny_llama()
    model.train()
    return model


def _shard(model: nn.Module, family: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    linears = [module for module in model.children() if isinstance(module, nn.Linear)]
    blocks = model.model.layers if family == "llama" else linears
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _mlp() -> nn.Module:
    from tests.core.test_inplace_sharded import _model

    return _model()


def _loss(model: nn.Module, family: str, step: int) -> Tensor:
    if family == "llama":
        return model(TOKENS[step], labels=TOKENS[step]).loss  # type: ignore[no-any-return]
    from tests.core.test_inplace_sharded import _data

    inputs, targets = _data()
    return nn.functional.mse_loss(model(inputs[step]), targets[step])


def _full(tensor: Tensor) -> Tensor:
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return full.detach().clone()


def run(name: str, sharded: bool, rank: int = 0) -> dict[str, Any]:
    """Train and prune case ``name``; the full masks, counts, and what was all-reduced. Each
    rank's global random stream differs (rank zero's is the one process's)."""
    from tensorplay.ao.pruning import DependencyGraph
    from tensorplay.ao.pruning.pruner.conductor import Pruner
    from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, LinearSchedule, Schedule
    from tensorplay.ao.pruning.structured.units import sharded_units

    family, options = CASES[name]
    model = _llama() if family == "llama" else _mlp()
    if sharded:
        _shard(model, family)
    example = None
    if family == "mlp":
        from tests.core.test_inplace_sharded import _data

        example = _data()[0][0]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    schedule: Schedule = LinearSchedule(0.5, end_step=SCHEDULE_END, frequency=1)
    if "target_params" in options:  # the budget sets the target: the schedule only its pace
        schedule = CubicSchedule(end_step=SCHEDULE_END, frequency=1)
    torch.manual_seed(100 + rank)
    options = {"seed": 3, **options}
    pruner = Pruner(model, schedule, masking="inplace", example_inputs=example, **options)
    pruner.attach(optimizer)
    reduced: list[int] = []
    original = sharded_units.sum_over_mesh

    def counted(vector: Tensor, group: Any) -> Tensor:
        reduced.append(vector.numel() * vector.element_size())
        return original(vector, group)

    per_step = []
    for step in range(STEPS):
        optimizer.zero_grad()
        _loss(model, family, step).backward()
        optimizer.step()
        sharded_units.sum_over_mesh = counted  # type: ignore[assignment]
        try:
            pruner.step(step)
        finally:
            sharded_units.sum_over_mesh = original  # type: ignore[assignment]
        per_step.append(list(reduced))
        reduced.clear()
    masks, revived, placed = {}, 0, True
    for module_name, module in model.named_modules():
        for buffer_name, mask in module.named_buffers(recurse=False):
            if not buffer_name.endswith("_mask"):
                continue
            param = module.get_parameter(buffer_name.removesuffix("_mask"))
            key = f"{module_name}.{buffer_name}"
            if sharded:
                placed &= tuple(mask.placements) == tuple(param.placements)
                placed &= mask.to_local().shape == param.to_local().shape
            masks[key] = _full(mask)
            revived += int((_full(param)[~masks[key]] != 0).sum())
    params = [model.get_parameter(target) for target in pruner.targets]
    kinds = (
        options["structure"] if isinstance(options["structure"], tuple) else (options["structure"],)
    )
    graph = None if sharded else DependencyGraph(model, example)
    groups = [group for kind in kinds for group in graph.groups(kind)] if graph else []
    return {
        "numbers": sum(group.size * (len(group.slices) + 1) for group in groups),
        "masks": masks,
        "history": list(pruner.history),
        "report": str(pruner.report()),
        "revived": revived,
        "placed": placed,
        "reduced": per_step,
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
    }


def refusals() -> dict[str, str]:
    """What a sharded model refuses, each message with whether the model stayed as it was."""
    from tensorplay.ao.pruning import shrink
    from tensorplay.ao.pruning.pruner.conductor import Pruner
    from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    from tensorplay.ao.pruning.structured.dependency.recorded import recorded_groups

    model = _llama()
    _shard(model, "llama")
    before = {key: _full(value) for key, value in model.state_dict().items()}
    once = OneShotSchedule(0.5)
    attempts = {
        "reparametrize": lambda: Pruner(model, once, structure="channel"),
        "expert": lambda: Pruner(model, once, structure="expert", masking="inplace"),
        "shrink": lambda: shrink(model),
    }
    found = {}
    for key, attempt in attempts.items():
        try:
            attempt()
            found[key] = "not refused"
        except ValueError as error:
            after = {k: _full(v) for k, v in model.state_dict().items()}
            same = sorted(after) == sorted(before)
            same = same and all(torch.equal(after[k], v) for k, v in before.items())
            found[key] = f"{error} unchanged={same and not recorded_groups(model)}"
    return found


def _worker(rank: int, out: Path) -> None:
    results: dict[str, Any] = {name: run(name, True, rank) for name in CASES}
    results["refusals"] = refusals()
    torch.save(results, out / f"rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_units_equal_one_process(tmp_path):
    from tests.core.gloo import spawn_gloo

    spawn_gloo(_worker, WORLD, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    oracles = {name: run(name, sharded=False) for name in CASES}
    for name, oracle in oracles.items():
        assert len(oracle["history"]) >= 2, name
        for rank in ranks:
            got = rank[name]
            assert got["history"] == oracle["history"], name
            assert sorted(got["masks"]) == sorted(oracle["masks"]), name
            for key, mask in oracle["masks"].items():
                assert torch.equal(got["masks"][key], mask), (name, key)
            assert got["report"] == oracle["report"], name
            assert got["revived"] == 0 and got["placed"], name  # pruned stays zero; masks sharded
            # One all_reduce per pruning step with a target above 0, none on the others.
            calls = [len(sent) for sent in got["reduced"]]
            assert calls == [0] + [1] * SCHEDULE_END + [0], (name, calls)
            # Per unit, a float64 per slice (kept entries) and one more (squared scores).
            assert all(sent == [oracle["numbers"] * 8] for sent in got["reduced"][1:-1]), name
    for name in CASES:  # the numbers the docs quote (pytest -s shows them)
        got = ranks[0][name]
        print(f"{name}: {got['reduced'][1][0]} bytes all-reduced per step, {got['param_bytes']}")
    assert ranks[0]["llama-channel"]["reduced"][1] == [3 * 48 * (3 + 1) * 8]  # 3 FFNs of 48
    for rank in ranks:
        found = rank["refusals"]
        assert "masking='inplace'" in found["reparametrize"], found["reparametrize"]
        assert "structure='expert'" in found["expert"] and "DTensor" in found["expert"]
        assert "gather the model to one device first" in found["shrink"], found["shrink"]
        assert all(message.endswith("unchanged=True") for message in found.values()), found
