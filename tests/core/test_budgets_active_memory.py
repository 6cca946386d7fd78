"""Budgets of active parameters (``target_active_params``) and memory (``target_memory``), alone
and with ``target_params``.

Every landed number is recomputed from the shrunk model by an oracle of its own: active
parameters by walking the modules (every parameter, but each MoE layer's fused expert tensors
counted at ``top_k`` of their experts), memory from the shrunk config (weights at the dtype plus
``2 * layers * kv_heads * head_dim * context * batch`` elements of cache). Each is at most its
budget, and above it minus one unit per layer of the coarsest kind pruned (the unit's own measure,
priced by hand from the model's shapes).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import MemoryBudget, Pruner, prune_one_shot, shrink
from tensorplay.ao.pruning.masking.restore import restore_pruning
from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule
from tests.hf_models import VOCAB, tiny_gpt2, tiny_llama
from tests.model_state import unchanged
from tests.moe_models import EXPERTS, TOP_K, tiny_mixtral, tiny_qwen3_moe

HIDDEN, HEAD_DIM, KV_HEADS = 32, 8, 2  # both families' tiny configs
CONTEXT, BATCH = 64, 2
BOTH_KINDS = ("channel", "head")


def _batches() -> list[Tensor]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, (2, 12), generator=generator) for _ in range(2)]


def _params(model: nn.Module) -> int:
    return sum(param.numel() for param in model.parameters())


def _active(model: nn.Module) -> float:
    """Every parameter, each MoE layer's expert tensors at ``top_k`` of their experts."""
    top_k = model.config.num_experts_per_tok
    total = float(_params(model))
    for module in model.modules():
        fused = [getattr(module, key, None) for key in ("gate_up_proj", "down_proj")]
        if all(isinstance(tensor, nn.Parameter) and tensor.dim() == 3 for tensor in fused):
            experts = sum(param.numel() for param in module.parameters())
            total += experts * top_k / fused[0].shape[0] - experts
    return total


def _memory(model: nn.Module, element: int) -> int:
    """Weights at ``element`` bytes and the cache, from the shrunk config (its widths per layer
    where they differ)."""
    config = model.config
    layers = (
        getattr(config, "tensorplay_layer_widths", None)
        or [{"num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim}]
        * config.num_hidden_layers
    )
    kv = sum(2 * layer["num_key_value_heads"] * layer["head_dim"] for layer in layers)
    return (_params(model) + kv * CONTEXT * BATCH) * element


def _setting(amount: int | float, dtype: str = "bfloat16") -> MemoryBudget:
    return MemoryBudget(amount, context_length=CONTEXT, batch_size=BATCH, dtype=dtype)


# One unit of each kind, by hand: the active parameters it frees per layer pruned together.
EXPERT_CHANNEL_ACTIVE = TOP_K * 3 * HIDDEN  # one channel of all 8 experts, top_k of them used
ROUTER_ROW = HIDDEN  # an expert frees its router row alone


def test_expert_channels_meet_an_active_budget_within_one_width_step() -> None:
    model = tiny_qwen3_moe()
    before = _active(model)
    budget = int(0.8 * before)
    pruner = prune_one_shot(
        model, _batches(), structure="channel", scope="layerwise", importance="magnitude",
        target_active_params=0.8,
    )  # fmt: skip
    report = pruner.budget_report()
    shrink(model)
    landed = _active(model)
    # Widths keep multiples of 4 channels (16 bytes of float32) in both layers.
    assert budget - 2 * 4 * EXPERT_CHANNEL_ACTIVE < landed <= budget
    assert (report["target_active_params"].before, report["target_active_params"].after) == (
        before,
        landed,
    )
    assert (
        report["target_params"].after == _params(model) and report["target_params"].budget is None
    )


@pytest.mark.parametrize("scope", ["global", "layerwise"])
def test_experts_free_only_their_router_rows_of_active_parameters(scope: str) -> None:
    model = tiny_mixtral()
    before, params = _active(model), _params(model)
    budget = int(before) - 3 * ROUTER_ROW  # three experts (two per layer with layerwise)
    pruner = prune_one_shot(
        model, _batches(), structure="expert", scope=scope, target_active_params=budget
    )
    pruned = sum(row.pruned for row in pruner.report().rows)
    shrink(model)
    landed = _active(model)
    slack = ROUTER_ROW * (2 if scope == "layerwise" else 1)
    assert budget - slack < landed <= budget
    assert pruned == (4 if scope == "layerwise" else 3)
    assert landed == before - pruned * ROUTER_ROW  # a token still uses top_k experts
    assert _params(model) < params - pruned * 1000  # while each expert held its 1,568


def test_an_active_budget_and_a_parameter_budget_are_both_met() -> None:
    model = tiny_qwen3_moe()
    active_budget, params_budget = int(0.9 * _active(model)), int(0.6 * _params(model))
    pruner = prune_one_shot(
        model, _batches(), structure="channel", scope="layerwise", importance="magnitude",
        target_active_params=0.9, target_params=0.6,
    )  # fmt: skip
    assert pruner.budget_report().met
    shrink(model)
    assert _active(model) <= active_budget and _params(model) <= params_budget
    # The parameter budget binds here: within one width step of it.
    assert params_budget - 2 * 4 * EXPERTS * 3 * HIDDEN < _params(model)


def test_a_dense_models_active_parameters_are_its_parameters() -> None:
    model = tiny_llama()
    budget = _params(model) - 1000
    pruner = prune_one_shot(model, _batches(), structure="channel", target_active_params=budget)
    assert pruner.budget_report()["target_active_params"].before == _params(model)
    shrink(model)
    assert budget - 3 * HIDDEN < _params(model) <= budget  # a channel: 96 parameters


# One unit's bytes at bfloat16, by hand (tiny Llama: hidden 32, head_dim 8, 2 query heads per
# key/value head): a channel its 3 * 32 weights; a key/value group its q, k, v rows and o columns
# (4 * 2 * 8 * 32 / 2 ... = 1536 weights) and its k and v rows of cache per position; a layer
# every weight of its block and its whole cache.
CHANNEL_BYTES = 3 * HIDDEN * 2
HEAD_BYTES = 1536 * 2 + 2 * HEAD_DIM * CONTEXT * BATCH * 2
LAYER_BYTES = 7744 * 2 + 2 * KV_HEADS * HEAD_DIM * CONTEXT * BATCH * 2


@pytest.mark.parametrize(
    ("structure", "unit"),
    [
        pytest.param("channel", CHANNEL_BYTES, id="channel"),
        pytest.param(("channel", "head"), HEAD_BYTES, id="channel-head"),
        pytest.param("head", HEAD_BYTES, id="head"),
        pytest.param("layer", LAYER_BYTES, id="layer"),
    ],
)
def test_a_memory_budget_counts_weights_and_the_kv_cache(
    structure: str | tuple[str, ...], unit: int
) -> None:
    model = tiny_llama()
    before = _memory(model, 2)
    budget = int(0.85 * before)
    pruner = prune_one_shot(model, _batches(), structure=structure, target_memory=_setting(0.85))
    report = pruner.budget_report()["target_memory"]
    shrink(model)
    landed = _memory(model, 2)
    assert (report.before, report.budget, report.after) == (before, budget, landed)
    assert budget - unit < landed <= budget


def test_grouped_query_attention_caches_key_value_heads_not_query_heads() -> None:
    model = tiny_llama()
    pruner = Pruner(
        model, OneShotSchedule(), structure="head", target_memory=_setting(0.99, "float32")
    )
    cache = 2 * 3 * KV_HEADS * HEAD_DIM * CONTEXT * BATCH * 4  # 3 layers, 2 key/value heads
    assert pruner.budget_report()["target_memory"].before == _params(model) * 4 + cache


def test_a_memory_budget_and_a_parameter_budget_are_both_met() -> None:
    model = tiny_llama()
    memory_budget, params_budget = int(0.9 * _memory(model, 2)), int(0.7 * _params(model))
    pruner = prune_one_shot(
        model, _batches(), structure=("channel", "head"), target_memory=_setting(0.9),
        target_params=0.7,
    )  # fmt: skip
    assert pruner.budget_report().met
    shrink(model)
    assert _memory(model, 2) <= memory_budget and _params(model) <= params_budget
    assert params_budget - 1536 < _params(model)  # the parameter budget binds


def test_the_report_prints_every_measure_against_its_budget() -> None:
    model = tiny_llama()
    pruner = Pruner(
        model, OneShotSchedule(), structure="channel", target_memory=_setting(0.95),
        target_active_params=0.95,
    )  # fmt: skip
    pruner.step()
    lines = str(pruner.budget_report()).splitlines()
    assert [line.split("  ")[0].strip() for line in lines] == [
        "measure", "parameters", "active parameters", "memory (bytes)",
    ]  # fmt: skip
    assert lines[1].split()[2] == "-"  # no parameter budget: shown for reference


def _resumed_masks(model: nn.Module, pruner: Pruner, build: Any, stop: int, end: int) -> dict:
    saved_model, saved_pruner = (
        copy.deepcopy(model.state_dict()),
        copy.deepcopy(pruner.state_dict()),
    )
    fresh = build()
    restore_pruning(fresh, saved_model)
    fresh.load_state_dict(saved_model)
    resumed = Pruner(fresh, **_GRADUAL)
    resumed.load_state_dict(saved_pruner)
    for step in range(stop, end):
        resumed.step(step)
    return {k: v for k, v in fresh.state_dict().items() if k.endswith("_mask")}


_GRADUAL: dict[str, Any] = dict(
    schedule=CubicSchedule(end_step=4, frequency=1), structure=("channel", "head"),
    target_memory=MemoryBudget(0.8, context_length=CONTEXT), target_active_params=0.9,
)  # fmt: skip


def test_a_gradual_pruner_resumes_bit_for_bit() -> None:
    straight = tiny_llama()
    pruner = Pruner(straight, **_GRADUAL)
    for step in range(5):
        pruner.step(step)
    expected = {k: v for k, v in straight.state_dict().items() if k.endswith("_mask")}

    model = tiny_llama()
    interrupted = Pruner(model, **_GRADUAL)
    for step in range(2):
        interrupted.step(step)
    middle = {k: v for k, v in model.state_dict().items() if k.endswith("_mask")}
    assert any(not torch.equal(middle[k], expected[k]) for k in expected)  # not there yet
    got = _resumed_masks(model, interrupted, tiny_llama, 2, 5)
    assert list(got) == list(expected)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert pruner.budget_report().met


ACTIVE = "`target_active_params`"
ACTIVE_VALUES = [
    pytest.param(-5, ValueError, f"{ACTIVE} to be a positive int, but got -5", id="neg"),
    pytest.param(0, ValueError, f"{ACTIVE} to be a positive int, but got 0", id="zero"),
    pytest.param(1.5, ValueError, rf"{ACTIVE} as a float to be in \(0, 1\]", id="big"),
    pytest.param("1k", TypeError, f"{ACTIVE} to be an int", id="type"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "error", "match"), ACTIVE_VALUES)
def test_bad_active_budgets_are_refused_naming_the_option(
    value: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        PrunerConfig(OneShotSchedule(), structure="channel", target_active_params=value)  # type: ignore[arg-type]


MEMORY_VALUES = [
    pytest.param({"bytes": -1}, ValueError, r"`target_memory.bytes` to be a positive", id="neg"),
    pytest.param({"bytes": 0.0}, ValueError, r"`target_memory.bytes` as a float", id="zero"),
    pytest.param({"bytes": 2.0}, ValueError, r"`target_memory.bytes` as a float", id="big"),
    pytest.param({"bytes": "1GB"}, TypeError, r"`target_memory.bytes` to be an int", id="type"),
    pytest.param({"context_length": 0}, ValueError, r"`target_memory.context_length`", id="ctx"),
    pytest.param({"batch_size": 1.0}, TypeError, r"`target_memory.batch_size`", id="batch"),
    pytest.param({"dtype": "complex64"}, ValueError, r"`target_memory.dtype`", id="dtype"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "error", "match"), MEMORY_VALUES)
def test_bad_memory_budgets_are_refused_naming_the_field(
    fields: dict[str, object], error: type[Exception], match: str
) -> None:
    given = {"bytes": 1000, "context_length": 8, **fields}
    with pytest.raises(error, match=match):
        PrunerConfig(OneShotSchedule(), structure="channel", target_memory=given)  # type: ignore[arg-type]


def test_a_memory_budget_of_the_wrong_type_is_refused_naming_the_option() -> None:
    with pytest.raises(TypeError, match="Expected `target_memory` to be a MemoryBudget"):
        PrunerConfig(OneShotSchedule(), structure="channel", target_memory=10**6)  # type: ignore[arg-type]


# The least reachable, by hand. Tiny Llama, every group keeping one unit: 47 channels of 96 and
# one key/value group of 1536 go per layer: 29472 - 3 * (47 * 96 + 1536) = 11328 parameters,
# 2 bytes each, and one group of 2 * 8 cached rows per position and layer stays.
LEAST_BYTES = 11328 * 2 + 3 * 2 * HEAD_DIM * CONTEXT * BATCH * 2
# Tiny Qwen3-MoE, channels of routed experts keep 4 (their 16-byte step), of 16: 12 go per expert,
# each freeing 2/8 of its 96 parameters per expert of a layer, in 2 layers.
LEAST_ACTIVE = 19200 - 2 * 12 * EXPERT_CHANNEL_ACTIVE

REFUSALS = [
    pytest.param(
        tiny_llama, {"structure": BOTH_KINDS, "target_memory": MemoryBudget(1000, CONTEXT, BATCH)},
        f"`target_memory` to be at least {LEAST_BYTES}, the smallest size reachable .*got 1000",
        id="memory-too-small",
    ),
    pytest.param(
        tiny_qwen3_moe,
        {"structure": "channel", "scope": "layerwise", "importance": "magnitude",
         "target_active_params": 1000},
        f"`target_active_params` to be at least {LEAST_ACTIVE}, .*got 1000",
        id="active-too-small",
    ),
    pytest.param(
        tiny_llama, {"structure": "channel", "target_active_params": 10**6},
        "`target_active_params` .* at most the model's 29472 active parameters, but got 1000000",
        id="active-above-the-model",
    ),
    pytest.param(
        tiny_gpt2, {"structure": "channel", "target_memory": MemoryBudget(0.5, CONTEXT)},
        r"`k_proj` and `v_proj` .* 'transformer.h.0.attn' \(GPT2Attention\) for `target_memory`",
        id="kv-unreadable",
    ),
    pytest.param(
        tiny_llama, {"structure": "channel", "sparsity": 0.5, "target_memory": _setting(0.5)},
        "exactly one of `sparsity` and budgets", id="sparsity-and-budget",
    ),
    pytest.param(
        tiny_qwen3_moe, {"structure": ("channel", "expert"), "target_active_params": 0.9},
        "distinct kinds among 'channel', 'head' and 'layer'", id="channel-expert",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("build", "options", "match"), REFUSALS)
def test_refusals_name_the_budget_and_leave_the_model_unchanged(
    build: Any, options: dict[str, Any], match: str
) -> None:
    model = build()
    check = unchanged(model)
    with pytest.raises(ValueError, match=match):
        prune_one_shot(model, _batches(), **options)
    check()


class _Routed(nn.Module):
    """A plain model with a module named ``experts``: a mixture of experts of no known family."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 8)
        self.experts = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.experts(torch.relu(self.up(x)))


def test_experts_of_no_known_family_are_refused_for_active_parameters() -> None:
    model = _Routed()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"routed experts of _Routed .* 'experts' is not a mixt"):
        Pruner(
            model, OneShotSchedule(), structure="channel", target_active_params=0.9,
            example_inputs=torch.randn(2, 4),
        )  # fmt: skip
    check()
