"""The lean ``Pruner`` on FSDP2 (``fully_shard``) without Lightning: gloo ranks on CPU.

Each case trains the same MLP on the same data in ranks that shard it and in one process that
does not, both with a lean pruner attached to the optimizer; the sharded run's masks, weights
and reports (gathered only here, to compare) must equal the single process's bit for bit. The
layers' rows (7, 13 and 1) split unevenly over the ranks, and some rank holds no row of the
last one. One spawn per test runs every case (each spawn takes 15-30 s on two cores: all are
marked slow).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.methods import L1Unstructured
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule, Schedule
from tests.core.gloo import spawn_gloo

WEIGHTS = ("0.weight", "2.weight", "4.weight")
STEPS = 8
SCHEDULE = CubicSchedule(0.7, end_step=6, frequency=2)  # prunes after steps 0, 2, 4 and 6


@dataclass(frozen=True)
class Case:
    """One run: the pruner's arguments, the optimizer, and how the weights start."""

    schedule: Schedule = SCHEDULE
    pruner: dict[str, Any] = field(default_factory=dict)
    optimizer: str = "sgd"
    ties: bool = False  # weights start on a coarse grid: many equal magnitudes
    rank_seeds: bool = False  # each rank's global RNG differs (rank zero's is the oracle's)
    importance: bool = False  # scores |w| * (|grad| + 1), DTensors under FSDP2


def _importance(module: nn.Module, name: str) -> Tensor:
    weight = getattr(module, name)
    return weight.detach().abs() * (weight.grad.abs() + 1)


CASES = {
    "global-l1-sgd": Case(),
    "layerwise-adamw": Case(pruner={"scope": "layerwise"}, optimizer="adamw"),
    "min-density": Case(
        schedule=CubicSchedule(0.9, end_step=6, frequency=2), pruner={"min_density": 0.4}
    ),
    "layerwise-min-density": Case(pruner={"scope": "layerwise", "min_density": 0.5}),
    "random-seeded": Case(pruner={"method": "random_unstructured", "seed": 7}),
    "random-unseeded": Case(pruner={"method": "random_unstructured"}, rank_seeds=True),
    "ties-one-shot": Case(schedule=OneShotSchedule(0.55, step=0), ties=True),
    "ties-global": Case(ties=True, optimizer="adamw"),
    "importance": Case(importance=True),
    "rewind-init": Case(pruner={"rewind": "init"}, optimizer="adamw"),
}


def _model(init: int = 0) -> nn.Sequential:
    with torch.random.fork_rng():
        torch.manual_seed(init)
        return nn.Sequential(
            nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 13), nn.ReLU(), nn.Linear(13, 1)
        )


def _data() -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(STEPS, 6, 5, generator=generator)
    return inputs, torch.randn(STEPS, 6, 1, generator=generator)


def _shard(model: nn.Module) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _full(tensor: Tensor) -> Tensor:
    """The whole tensor (a collective for a DTensor)."""
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return full.detach().clone()


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {name: _full(value) for name, value in model.state_dict().items()}


def _build(case: Case, sharded: bool, rank: int = 0, init: int = 0) -> tuple[Any, ...]:
    """The model (sharded or not), its optimizer and a lean pruner attached to it."""
    model = _model(init)
    if case.ties:
        with torch.no_grad():
            for name in WEIGHTS:
                weight = model.get_parameter(name)
                weight.copy_((weight * 4).round() / 4)
    if sharded:
        _shard(model)
    if case.rank_seeds:
        torch.manual_seed(100 + rank)
    if case.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            model.parameters(), lr=0.05, momentum=0.9
        )
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    importance = _importance if case.importance else None
    pruner = Pruner(
        model, case.schedule, masking="inplace", importance_fn=importance, **case.pruner
    )
    pruner.attach(optimizer)
    return model, optimizer, pruner


def _train(
    model: nn.Module, optimizer: torch.optim.Optimizer, pruner: Pruner, steps: range
) -> list[tuple[int, dict[str, Tensor], str]]:
    """Train ``steps``; each pruning step's full masks and report."""
    inputs, targets = _data()
    pruned = []
    for step in steps:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs[step]), targets[step]).backward()
        optimizer.step()
        if pruner.step(step):
            masks = {name: _full(model.get_buffer(name + "_mask")) for name in WEIGHTS}
            pruned.append((step, masks, str(pruner.report())))
    return pruned


def _result(model: nn.Module, pruner: Pruner) -> dict[str, Any]:
    return {
        "state": _state(model),
        "report": str(pruner.report()),
        "pruned": pruner.pruned_count(),
        "sparsity": pruner.sparsity(),
        "history": list(pruner.history),
    }


def _values(shape: torch.Size) -> Tensor:
    return torch.arange(1, shape.numel() + 1, dtype=torch.float32).reshape(shape) / 8


def run_case(case: Case, sharded: bool, rank: int = 0) -> dict[str, Any]:
    """Train and prune ``case``; every pruning step's masks and report, and the final state."""
    model, optimizer, pruner = _build(case, sharded, rank)
    result = {"steps": _train(model, optimizer, pruner, range(STEPS)), **_result(model, pruner)}
    if sharded:
        result["local"] = {
            name + "_mask": tuple(model.get_buffer(name + "_mask").to_local().shape)
            for name in WEIGHTS
        }
        local_weights = [model.get_parameter(name).to_local() for name in WEIGHTS]
        local_masks = [model.get_buffer(name + "_mask").to_local() for name in WEIGHTS]
        result["local_nonzero_pruned"] = sum(
            int((w[~m] != 0).sum()) for w, m in zip(local_weights, local_masks, strict=True)
        )
    # Plain full values rewind a shard to its own rows (pruned entries zeroed again).
    values = {name: _values(model.get_parameter(name).shape) for name in WEIGHTS}
    pruner.rewind(values)
    result["rewound"] = {name: _full(model.get_parameter(name)) for name in WEIGHTS}
    pruner.make_permanent()  # the masks go; the zeros of the weights are counted instead
    result["permanent"] = {**_result(model, pruner), "history": None}
    return result


# -- the ranks ---------------------------------------------------------------------------------


def _cases_worker(rank: int, out: Path) -> None:
    results = {name: run_case(case, sharded=True, rank=rank) for name, case in CASES.items()}
    torch.save(results, out / f"rank{rank}.pt")


def _oracle(name: str) -> dict[str, Any]:
    return run_case(CASES[name], sharded=False)


def _check_cases(out: Path, world: int) -> None:
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
    assert sorted(ranks[0]) == sorted(CASES)
    for name in CASES:
        oracle = _oracle(name)
        got = [rank[name] for rank in ranks]
        assert len(oracle["steps"]) >= 1, name
        for result in got:
            assert result["local_nonzero_pruned"] == 0, name  # pruned entries zero on every rank
            assert [s[0] for s in result["steps"]] == [s[0] for s in oracle["steps"]], name
            for (_, masks, report), (_, expected, expected_report) in zip(
                result["steps"], oracle["steps"], strict=True
            ):
                assert sorted(masks) == sorted(expected), name
                for key in expected:
                    assert torch.equal(masks[key], expected[key]), (name, key)
                assert report == expected_report, name
            assert sorted(result["state"]) == sorted(oracle["state"]), name
            for key, value in oracle["state"].items():
                assert result["state"][key].dtype == value.dtype, (name, key)
                assert torch.equal(result["state"][key], value), (name, key)
            for key in ("report", "pruned", "sparsity", "history"):
                assert result[key] == oracle[key], (name, key)
            for key, value in oracle["rewound"].items():
                assert torch.equal(result["rewound"][key], value), (name, key)
            permanent, expected_permanent = result["permanent"], oracle["permanent"]
            assert sorted(permanent["state"]) == sorted(expected_permanent["state"]), name
            assert not any(key.endswith("_mask") for key in permanent["state"]), name
            for key, value in expected_permanent["state"].items():
                assert torch.equal(permanent["state"][key], value), (name, key)
            assert permanent["pruned"] == result["pruned"] == expected_permanent["pruned"], name
            assert permanent["report"] == expected_permanent["report"], name


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_lean_pruner_equals_one_process_bit_for_bit(tmp_path):
    spawn_gloo(_cases_worker, 2, tmp_path)
    _check_cases(tmp_path, 2)
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    # Masks are sharded like the weights: 7 = 4 + 3, 13 = 7 + 6 and 1 = 1 + 0 rows.
    local = rank0["global-l1-sgd"]["local"], rank1["global-l1-sgd"]["local"]
    assert local[0] == {"0.weight_mask": (4, 5), "2.weight_mask": (7, 7), "4.weight_mask": (1, 13)}
    assert local[1] == {"0.weight_mask": (3, 5), "2.weight_mask": (6, 7), "4.weight_mask": (0, 13)}


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_lean_pruner_equals_one_process_on_four_ranks(tmp_path):
    spawn_gloo(_cases_worker, 4, tmp_path)
    _check_cases(tmp_path, 4)


# -- resume from a distributed checkpoint ------------------------------------------------------


def _resume_worker(rank: int, out: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    case = Case(optimizer="adamw", pruner={"min_density": 0.2})
    model, optimizer, pruner = _build(case, sharded=True)
    _train(model, optimizer, pruner, range(STEPS))
    uninterrupted = _result(model, pruner)

    model, optimizer, pruner = _build(case, sharded=True)
    _train(model, optimizer, pruner, range(4))  # pruned after steps 0 and 2; 4 and 6 to come
    mid = _result(model, pruner)
    dcp.save(
        {
            "model": get_model_state_dict(model),
            "optimizer": get_optimizer_state_dict(model, optimizer),
        },
        checkpoint_id=out / "mid",
    )
    pruner_state = pruner.state_dict()

    model, optimizer, pruner = _build(case, sharded=True, init=1)  # everything from the files
    pruner.reparametrize()  # the mask buffers the checkpoint holds, sharded like the weights
    fresh = _result(model, pruner)
    state = {
        "model": get_model_state_dict(model),
        "optimizer": get_optimizer_state_dict(model, optimizer),
    }
    dcp.load(state, checkpoint_id=out / "mid")
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    pruner.load_state_dict(pruner_state)
    _train(model, optimizer, pruner, range(4, STEPS))
    resumed = _result(model, pruner)
    results = {"uninterrupted": uninterrupted, "mid": mid, "fresh": fresh, "resumed": resumed}
    torch.save(results, out / f"resume{rank}.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_lean_pruner_resumes_from_a_distributed_checkpoint_bit_for_bit(tmp_path):
    spawn_gloo(_resume_worker, 2, tmp_path)

    for rank in range(2):
        results = torch.load(tmp_path / f"resume{rank}.pt", weights_only=False)
        final, mid = results["uninterrupted"], results["mid"]
        resumed, fresh = results["resumed"], results["fresh"]
        names = sorted(final["state"])
        assert names == sorted(mid["state"]) == sorted(resumed["state"])
        assert [n for n in names if n.endswith("_mask")] == [w + "_mask" for w in WEIGHTS]
        # The checkpoint is mid-schedule, and the fresh model differs from it everywhere.
        assert mid["pruned"] < final["pruned"] and fresh["pruned"] == 0
        assert all(not torch.equal(mid["state"][n], final["state"][n]) for n in WEIGHTS)
        assert all(not torch.equal(fresh["state"][n], mid["state"][n]) for n in WEIGHTS)
        for name in names:
            assert torch.equal(resumed["state"][name], final["state"][name]), name
        for key in ("report", "pruned", "sparsity", "history"):
            assert resumed[key] == final[key], key


# -- refused before anything changes -----------------------------------------------------------


class _OwnMask(L1Unstructured):
    """An unstructured method with a compute_mask of its own (needs the full tensor)."""

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return super().compute_mask(t, default_mask)


class _HalfOfEachRow(BasePruningMethod):
    """A method that decides its own count (as N:M methods do)."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return default_mask


def _refusal(
    make: Callable[[nn.Module], Any],
    shard: str = "all",
    prepare: Callable[[nn.Module], None] | None = None,
) -> tuple[str, bool]:
    """Build a model (``prepare`` it), shard it, run ``make(model)``: the error and whether
    the model's state stayed as it was."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, distribute_tensor

    model = _model()
    if prepare is not None:
        prepare(model)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if shard == "all":
        _shard(model)
    elif shard == "first":
        fully_shard(model[0], mesh=mesh)
    elif shard == "two-groups":
        from torch.distributed.device_mesh import DeviceMesh

        # Each rank its own one-rank group (every rank makes every group, in the same order).
        singles = [dist.new_group([r]) for r in range(dist.get_world_size())]
        other = DeviceMesh.from_group(singles[dist.get_rank()], "cpu")
        fully_shard(model[0], mesh=other)
        for layer in (model[2], model[4]):
            fully_shard(layer, mesh=mesh)
    elif shard == "replicate":
        for layer in model:
            if isinstance(layer, nn.Linear):
                weight = distribute_tensor(layer.weight.detach(), mesh, [Replicate()])
                layer.weight = nn.Parameter(weight)
    before = _locals(model)
    try:
        make(model)
    except ValueError as error:
        after = {
            k: v.to_local() if hasattr(v, "to_local") else v for k, v in model.state_dict().items()
        }
        unchanged = sorted(before) == sorted(after) and all(
            torch.equal(before[k], after[k]) for k in before
        )
        return str(error), unchanged
    return "no error", False


def _locals(model: nn.Module) -> dict[str, Tensor]:
    """Copies of this rank's values of the model's state."""
    state = model.state_dict().items()
    return {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone() for k, v in state}


def _step(**kwargs: Any) -> Callable[[nn.Module], Any]:
    def make(model: nn.Module) -> Any:
        options = {"masking": "inplace", **kwargs}
        return Pruner(model, OneShotSchedule(0.5), **options).step(0)

    return make


class _ShardThenStep:
    """A reparametrizing pruner made on the plain model (``prepare``), which is sharded then."""

    def prepare(self, model: nn.Module) -> None:
        self.pruner = Pruner(model, OneShotSchedule(0.5))

    def __call__(self, model: nn.Module) -> Any:
        return self.pruner.step(0)


def _errors_worker(rank: int, out: Path) -> None:
    def full_scores(module: nn.Module, name: str) -> Tensor:
        return getattr(module, name).full_tensor().abs()

    shard_then_step = _ShardThenStep()
    errors = {
        "reparametrize": _refusal(lambda model: Pruner(model, OneShotSchedule(0.5))),
        "reparametrize-at-step": _refusal(shard_then_step, prepare=shard_then_step.prepare),
        "replicate": _refusal(_step(), shard="replicate"),
        "mixed": _refusal(_step(), shard="first"),
        "two-groups": _refusal(_step(), shard="two-groups"),
        "own-compute-mask": _refusal(_step(method=_OwnMask)),
        "plain-scores": _refusal(_step(importance_fn=full_scores)),
        "own-count": _refusal(_step(method=_HalfOfEachRow)),
    }
    torch.save(errors, out / f"errors{rank}.pt")


REFUSALS = {
    "reparametrize": r"Expected plain tensors with masking='reparametrize', but '0.weight' is a "
    r"DTensor \(FSDP2\).*masking='inplace'",
    "reparametrize-at-step": r"Expected plain tensors with masking='reparametrize', but "
    r"\['0.weight', '2.weight', '4.weight'\] are DTensors",
    "replicate": r"Expected \((FSDP)?Linear, 'weight'\) \('0.weight'\) to be a DTensor placed "
    r"\(Shard\(dim=0\),\).*\(Replicate\(\),\).*counted more than once",
    "mixed": r"Expected every target to be a DTensor when \((FSDP)?Linear, 'weight'\) "
    r"\('0.weight'\) is one, but got a plain tensor for \((FSDP)?Linear, 'weight'\) \('2.weight'\)",
    "two-groups": r"Expected every target sharded over one process group, but "
    r"\((FSDP)?Linear, 'weight'\) \('2.weight'\) and \((FSDP)?Linear, 'weight'\) "
    r"\('0.weight'\) lie on device meshes of different groups",
    "own-compute-mask": r"Expected l1_unstructured or random_unstructured for the sharded.*"
    "_OwnMask",
    "own-count": r"Expected l1_unstructured or random_unstructured for the sharded.*"
    "_HalfOfEachRow",
    "plain-scores": r"Expected `importance_fn` to return a DTensor placed \(Shard\(dim=0\),\).*"
    r"'0.weight'.*but got a plain tensor",
}


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_lean_pruner_refuses_what_it_cannot_do_exactly(tmp_path):
    spawn_gloo(_errors_worker, 2, tmp_path)

    for rank in range(2):
        errors = torch.load(tmp_path / f"errors{rank}.pt", weights_only=False)
        assert sorted(errors) == sorted(REFUSALS)
        for name, pattern in REFUSALS.items():
            message, unchanged = errors[name]
            assert re.search(pattern, message), (name, message)
            assert unchanged, name
