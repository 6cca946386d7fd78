"""The latency budget (``target_latency``): the table it is estimated from, the estimate, and the
budget in every entry point.

No test asserts a speed: measured times vary from run to run. The tests hold the table's
structure (which modules it times, how it groups them), that its times are positive and finite,
that measuring leaves nothing on the model, and the estimate's arithmetic against an oracle
computed here by hand from the table and the units pruned (kept channels, heads, layers).
Budgets are then checked against that estimate. Times are taken on one thread, so that the
machine's other work does not swing them while a test runs.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import (
    LatencyBudget,
    LatencyTable,
    Pruner,
    estimate_latency,
    latency_table,
    prune_one_shot,
    shrink,
)
from tensorplay.ao.pruning.masking.restore import restore_pruning
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule
from tensorplay.ao.pruning.structured.units.latency_setting import check_target_latency
from tests.hf_models import VOCAB, tiny_gpt2, tiny_llama
from tests.model_state import unchanged
from tests.moe_models import tiny_qwen3_moe

SHAPE = (2, 16)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _budget(fraction: float, repeats: int = 5) -> LatencyBudget:
    return LatencyBudget(fraction, input_shape=SHAPE, repeats=repeats, warmup=1)


def _batches() -> list[Tensor]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, SHAPE, generator=generator) for _ in range(2)]


def _table_of(pruner: Pruner) -> LatencyTable:
    return LatencyTable.from_dict(pruner.state_dict()["latency_table"])


# -- the table ---------------------------------------------------------------------------------

FAMILIES = [
    pytest.param(tiny_llama, "model.layers", "self_attn.q_proj.weight", 0, 32, id="llama"),
    pytest.param(tiny_gpt2, "transformer.h", "attn.c_attn.weight", 1, 96, id="gpt2"),
    pytest.param(tiny_qwen3_moe, "model.layers", "self_attn.q_proj.weight", 0, 32, id="qwen3-moe"),
]  # fmt: skip


@pytest.mark.parametrize(("build", "blocks", "query", "dim", "size"), FAMILIES)
def test_the_table_times_every_leaf_core_and_block(
    build: Any, blocks: str, query: str, dim: int, size: int
) -> None:
    model = build()
    table = latency_table(model, _budget(0.5))
    owners = [name for name, m in model.named_modules() if list(m.parameters(recurse=False))]
    assert [leaf.module for leaf in table.leaves] == owners
    layers = len(model.config.num_hidden_layers * [0])
    assert [block for block, _ in table.rests] == [f"{blocks}.{i}" for i in range(layers)]
    for leaf in table.leaves:
        expected = next((b for b, _ in table.rests if leaf.module.startswith(f"{b}.")), None)
        assert leaf.block == expected
        module = model.get_submodule(leaf.module)
        assert leaf.shapes == tuple(tuple(p.shape) for p in module.parameters(recurse=False))
    attention = [core for core in table.cores if "Attention" in
                 type(model.get_submodule(core.module)).__name__]  # fmt: skip
    assert [core.param for core in attention] == [f"{blocks}.{i}.{query}" for i in range(layers)]
    assert all((core.dim, core.size) == (dim, size) for core in attention)
    times = [leaf.seconds for leaf in table.leaves] + [core.seconds for core in table.cores]
    times += [seconds for _, seconds in table.rests] + [table.outside, table.total]
    assert all(math.isfinite(t) and t >= 0 for t in times)
    assert table.total > 0 and all(leaf.seconds > 0 for leaf in table.leaves)
    assert table.dense == pytest.approx(math.fsum(times[:-1]), rel=1e-12)
    # blocks that compute alike are timed alike: one time per part across them
    per_part: dict[str, set[float]] = {}
    for leaf in table.leaves:
        if leaf.block is not None:
            per_part.setdefault(leaf.module[len(leaf.block) :], set()).add(leaf.seconds)
    assert per_part and all(len(found) == 1 for found in per_part.values())
    assert len({seconds for _, seconds in table.rests}) == 1


def test_routed_expert_tensors_are_marked_and_the_router_is_not() -> None:
    model = tiny_qwen3_moe()
    table = latency_table(model, _budget(0.5))
    routed = {leaf.module: leaf.routed for leaf in table.leaves}
    assert routed["model.layers.0.mlp.experts"] == (True, True)
    assert routed["model.layers.0.mlp.gate"] == (False,)


def test_measuring_leaves_nothing_on_the_model_and_restores_each_training_flag() -> None:
    model = tiny_llama().train()
    model.model.layers[1].eval()  # a mixed state, restored module by module
    flags = {name: m.training for name, m in model.named_modules()}
    check = unchanged(model)
    latency_table(model, _budget(0.5))
    check()
    assert {name: m.training for name, m in model.named_modules()} == flags


def test_a_forward_that_fails_on_the_inputs_is_refused_and_the_model_unchanged() -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4))
    check = unchanged(model)
    with pytest.raises(ValueError, match="Expected the forward of Sequential to run on"):
        latency_table(model, LatencyBudget(0.5, input_shape=(2, 3)))
    check()


def test_example_inputs_of_a_mapping_are_the_forward_arguments() -> None:
    model = tiny_llama()
    ids = torch.randint(0, VOCAB, SHAPE)
    budget = LatencyBudget(0.5, example_inputs={"input_ids": ids}, repeats=2, warmup=0)
    assert latency_table(model, budget).total > 0


def test_the_table_reads_back_from_plain_data() -> None:
    table = latency_table(tiny_gpt2(), _budget(0.5, repeats=2))
    assert LatencyTable.from_dict(table.to_dict()) == table
    with pytest.raises(ValueError, match=r"Expected a latency table as LatencyTable\.to_dict"):
        LatencyTable.from_dict({"leaves": []})


# -- the estimate, against an oracle -----------------------------------------------------------


def _oracle(table: LatencyTable, kept: dict[str, float], dropped: set[str]) -> float:
    """By hand: each leaf's time times ``kept[module]`` (the fraction of its work kept, 1 if
    not given), each core times its ``kept`` fraction, the rests of the blocks kept, outside."""
    total = table.outside + sum(s for block, s in table.rests if block not in dropped)
    for part in [*table.leaves, *table.cores]:
        inside = part.block in dropped
        total += 0.0 if inside else part.seconds * kept.get(part.module, 1.0)
    return total


def _kept_rows(mask: Tensor, dim: int) -> int:
    return int(mask.flatten(1).any(dim=1).sum()) if dim == 0 else int(mask.any(dim=0).sum())


def test_the_estimate_of_pruned_channels_is_the_tables_arithmetic() -> None:
    model = tiny_llama()
    table = latency_table(model, _budget(0.5))
    pruner = Pruner(model, OneShotSchedule(0.25), structure="channel", scope="global")
    pruner.step()
    kept: dict[str, float] = {}
    for index, layer in enumerate(model.model.layers):
        mlp, prefix = layer.mlp, f"model.layers.{index}.mlp"
        channels = _kept_rows(mlp.gate_proj.weight_mask, 0)
        width = mlp.gate_proj.out_features
        assert channels == _kept_rows(mlp.down_proj.weight_mask, 1)
        for name in ("gate_proj", "up_proj", "down_proj"):
            kept[f"{prefix}.{name}"] = channels / width  # no biases: the weight is all
        kept[prefix] = channels / width  # the MLP's core: the activation of kept channels
    assert any(fraction < 1 for fraction in kept.values())
    assert estimate_latency(model, table) == pytest.approx(_oracle(table, kept, set()), rel=1e-9)


def test_the_estimate_of_pruned_heads_and_layers_is_the_tables_arithmetic() -> None:
    model = tiny_llama()
    table = latency_table(model, _budget(0.5))
    Pruner(model, OneShotSchedule(0.5), structure="head").step()
    kept: dict[str, float] = {}
    for index, layer in enumerate(model.model.layers):
        attn, prefix = layer.self_attn, f"model.layers.{index}.self_attn"
        heads = _kept_rows(attn.q_proj.weight_mask, 0) / attn.q_proj.out_features
        for name in ("q_proj", "k_proj", "v_proj"):
            kept[f"{prefix}.{name}"] = heads  # GQA: the key/value rows go with their queries
        kept[f"{prefix}.o_proj"] = _kept_rows(attn.o_proj.weight_mask, 1) / 32
        kept[prefix] = heads
    assert set(kept.values()) == {0.5}
    assert estimate_latency(model, table) == pytest.approx(_oracle(table, kept, set()), rel=1e-9)

    model = tiny_llama()
    Pruner(model, OneShotSchedule(1 / 3), structure="layer").step()
    dropped = {
        f"model.layers.{i}" for i, layer in enumerate(model.model.layers)
        if not bool(layer.self_attn.q_proj.weight_mask.any())
    }  # fmt: skip
    assert len(dropped) == 1
    assert estimate_latency(model, table) == pytest.approx(_oracle(table, {}, dropped), rel=1e-9)


def test_removed_experts_keep_their_work_and_narrower_ones_save_it() -> None:
    model = tiny_qwen3_moe()
    table = latency_table(model, _budget(0.5))
    Pruner(model, OneShotSchedule(0.25), structure="expert", scope="layerwise").step()
    kept = {f"model.layers.{i}.mlp.gate": 6 / 8 for i in range(2)}  # the router's rows only
    assert estimate_latency(model, table) == pytest.approx(_oracle(table, kept, set()), rel=1e-9)


def test_a_shrunk_model_is_refused_it_is_estimated_from_its_masks() -> None:
    model = tiny_llama()
    table = latency_table(model, _budget(0.5))
    Pruner(model, OneShotSchedule(0.25), structure="channel").step()
    shrink(model)
    with pytest.raises(ValueError, match="Expected the model the latency table was measured on"):
        estimate_latency(model, table)


# -- budgets -----------------------------------------------------------------------------------

MET = [
    pytest.param(tiny_llama, "channel", 0.97, {}, id="llama-channel"),
    pytest.param(tiny_llama, "head", 0.97, {}, id="llama-head"),
    pytest.param(tiny_llama, "layer", 0.9, {}, id="llama-layer"),
    pytest.param(tiny_llama, ("channel", "head"), 0.97, {}, id="llama-channel-head"),
    pytest.param(tiny_llama, "channel", 0.97, {"scope": "layerwise"}, id="llama-layerwise"),
    pytest.param(tiny_gpt2, "channel", 0.97, {}, id="gpt2-channel"),
    pytest.param(tiny_qwen3_moe, "channel", 0.98, {"scope": "layerwise", "importance": "magnitude"},
                 id="moe-channels"),
]  # fmt: skip


@pytest.mark.parametrize(("build", "structure", "fraction", "options"), MET)
def test_prune_one_shot_meets_the_latency_budget_as_estimated(
    build: Any, structure: Any, fraction: float, options: dict[str, Any]
) -> None:
    model = build()
    pruner = prune_one_shot(
        model, _batches(), target_latency=_budget(fraction), structure=structure,
        make_permanent=False, **options,
    )  # fmt: skip
    table = _table_of(pruner)
    line = pruner.budget_report()["target_latency"]
    assert line.before == pytest.approx(table.dense, rel=0, abs=1e-12)  # counted in picoseconds
    assert line.budget == pytest.approx(fraction * table.dense, rel=0, abs=2e-12)
    estimate = estimate_latency(model, table)
    # the planner's sum of unit prices, the masks read: equal to a picosecond per unit
    units = pruner.pruned_count() + 2  # and the rounding of the dense total
    assert line.after == pytest.approx(estimate, rel=0, abs=1e-12 * units)
    assert line.met and estimate <= line.budget + 1e-12 * units
    assert line.fraction == pytest.approx(estimate / table.dense, rel=1e-6)
    assert line.after < line.before


def test_a_latency_budget_and_a_parameter_budget_are_both_met() -> None:
    model = tiny_llama()
    pruner = prune_one_shot(
        model, _batches(), target_latency=_budget(0.98), target_params=0.8,
        structure=("channel", "head"), make_permanent=False,
    )  # fmt: skip
    report = pruner.budget_report()
    assert [line.option for line in report.lines] == ["target_params", "target_latency"]
    assert report.met
    assert report["target_params"].after <= int(0.8 * report["target_params"].before)
    lines = str(report).splitlines()
    assert lines[2].startswith("latency (s, estimated)")


def test_an_unreachable_latency_budget_is_refused_before_anything_changes() -> None:
    model = tiny_llama()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"Expected `target_latency` to be at least 0\.\d{4} \("):
        prune_one_shot(model, _batches(), target_latency=_budget(0.01), structure="channel")
    check()


BAD = [
    pytest.param({"fraction": 0.0, "input_shape": SHAPE}, ValueError, r"fraction` to be a float "
                 r"in \(0, 1\], but got 0.0", id="zero"),
    pytest.param({"fraction": True, "input_shape": SHAPE}, TypeError, "fraction", id="bool"),
    pytest.param({"fraction": 0.5}, ValueError, "but got neither", id="no-inputs"),
    pytest.param({"fraction": 0.5, "input_shape": SHAPE, "example_inputs": torch.zeros(1)},
                 ValueError, "but got both", id="both"),
    pytest.param({"fraction": 0.5, "example_inputs": [1, 2]}, TypeError,
                 "example_inputs` to be a tensor", id="list-inputs"),
    pytest.param({"fraction": 0.5, "input_shape": [2, 0]}, ValueError,
                 "input_shape` to be a sequence of positive ints", id="shape"),
    pytest.param({"fraction": 0.5, "input_shape": "2x16"}, TypeError, "input_shape", id="str"),
    pytest.param({"fraction": 0.5, "input_shape": SHAPE, "repeats": 0}, ValueError,
                 r"repeats` to be an int >= 1, but got 0", id="repeats"),
    pytest.param({"fraction": 0.5, "input_shape": SHAPE, "warmup": -1}, ValueError,
                 r"warmup` to be an int >= 0, but got -1", id="warmup"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "error", "match"), BAD)
def test_bad_latency_budgets_are_refused_naming_the_field(
    fields: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        LatencyBudget(**fields)


def test_a_latency_budget_of_the_wrong_type_is_refused_and_a_mapping_is_built() -> None:
    with pytest.raises(TypeError, match="Expected `target_latency` to be a LatencyBudget"):
        check_target_latency(0.5)
    built = check_target_latency({"fraction": 0.5, "input_shape": [2, 16]})
    assert built == LatencyBudget(0.5, input_shape=(2, 16))
    with pytest.raises(TypeError, match="tensors have no plain-data form"):
        LatencyBudget(0.5, example_inputs=torch.zeros(1)).to_dict()


def test_a_latency_budget_and_a_schedule_target_are_refused_together() -> None:
    model = tiny_llama()
    check = unchanged(model)
    with pytest.raises(ValueError, match="`target_latency`\\), but got both"):
        Pruner(model, OneShotSchedule(0.5), structure="channel", target_latency=_budget(0.5))
    check()


# -- resume ------------------------------------------------------------------------------------

_GRADUAL: dict[str, Any] = dict(
    schedule=CubicSchedule(end_step=4, frequency=1), structure=("channel", "head"),
    target_latency=LatencyBudget(0.97, input_shape=SHAPE, repeats=3, warmup=1),
)  # fmt: skip


def _masks(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if k.endswith("_mask")}


def test_a_gradual_pruner_resumes_bit_for_bit_with_its_saved_table() -> None:
    model = tiny_llama()
    interrupted = Pruner(model, **_GRADUAL)
    for step in range(2):
        interrupted.step(step)
    saved_model, saved_pruner = copy.deepcopy(model.state_dict()), interrupted.state_dict()
    middle = _masks(model)
    for step in range(2, 5):  # the run, had it not been interrupted
        interrupted.step(step)
    expected = _masks(model)
    assert any(not torch.equal(middle[k], expected[k]) for k in expected)  # not there yet

    fresh = tiny_llama()
    restore_pruning(fresh, saved_model)
    fresh.load_state_dict(saved_model)
    resumed = Pruner(fresh, **_GRADUAL)  # measures a table of its own...
    assert resumed.state_dict()["latency_table"] != saved_pruner["latency_table"]
    resumed.load_state_dict(saved_pruner)  # ...and takes the saved one
    assert resumed.state_dict()["latency_table"] == saved_pruner["latency_table"]
    for step in range(2, 5):
        resumed.step(step)
    got = _masks(fresh)
    assert list(got) == list(expected)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert resumed.budget_report().met


def test_a_saved_table_of_another_model_is_refused() -> None:
    model = tiny_llama()
    pruner = Pruner(model, **_GRADUAL)
    state = pruner.state_dict()
    other = latency_table(tiny_gpt2(), _budget(0.5, repeats=1))
    with pytest.raises(ValueError, match="Expected the model the latency table was measured on"):
        pruner.load_state_dict({**state, "latency_table": other.to_dict()})


# -- search ------------------------------------------------------------------------------------


def test_the_search_estimates_each_candidates_latency_and_keeps_one_within_budget() -> None:
    model = tiny_llama()
    result = prune_one_shot(
        model, _batches(), target_latency=_budget(0.95), structure=("layer", "channel"),
        search=True, search_grid=2, make_permanent=False,
    )  # fmt: skip
    rows = result.search_report()
    realized = [row for row in rows if row["reason"] is None]
    assert len(realized) >= 2
    dense = {row["latency"] / row["latency_fraction"] for row in realized}
    assert max(dense) == pytest.approx(min(dense), rel=1e-9)  # one table, one dense estimate
    for row in realized:
        assert 0 < row["latency_fraction"] < 1
        assert row["meets"] == (row["latency_fraction"] <= 0.95)
    feasible = [row for row in realized if row["meets"]]
    assert result.chosen == min(feasible, key=lambda row: row["score"])
    assert sum(row["chosen"] for row in rows) == 1


def test_a_pruner_without_a_latency_budget_ignores_a_saved_table() -> None:
    model = tiny_llama()
    timed = Pruner(model, **_GRADUAL)
    timed.step(0)
    state = timed.state_dict()
    plain = Pruner(tiny_llama(), CubicSchedule(end_step=4, frequency=1),
                   structure=("channel", "head"), target_params=0.9)  # fmt: skip
    assert "latency_table" not in plain.state_dict()
    plain.load_state_dict(state)
    assert (plain.last_step, timed.last_step) == (0, 0)
    assert "latency_table" not in plain.state_dict()


class _Routed(nn.Module):
    """A plain model with a module named ``experts``: a mixture of experts of no known family."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 8)
        self.experts = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.experts(torch.relu(self.up(x)))


def test_experts_of_no_known_family_are_refused_for_latency() -> None:
    model = _Routed()
    check = unchanged(model)
    with pytest.raises(
        ValueError,
        match=r"'experts' is not a mixture-of-experts layer .* for "
        r"`target_latency`|for `target_latency`.* 'experts' is not a mixture",
    ):
        Pruner(
            model, OneShotSchedule(), structure="channel", example_inputs=torch.randn(2, 4),
            target_latency=LatencyBudget(0.9, input_shape=(2, 4)),
        )  # fmt: skip
    check()
