"""``structure="expert"``: its options, its selection of layers, its refusals."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from tensorplay.ao.pruning import Pruner
from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tests.hf_models import tiny_llama
from tests.model_state import unchanged
from tests.moe_models import EXPERTS, tiny_mixtral, tiny_qwen2_moe

BAD = [
    pytest.param({"method": "random_structured"}, ValueError, "unstructured", id="structured"),
    pytest.param({"scope": "row"}, ValueError, r"'layerwise' with structure='expert'", id="row"),
    pytest.param({"importance": "wanda"}, ValueError, r"'frequency'\) with .*'wanda'", id="wanda"),
    pytest.param({"importance": "movement"}, ValueError, "but got 'movement'", id="movement"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "error", "match"), BAD)
def test_options_experts_cannot_be_pruned_with_are_refused(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        PrunerConfig(OneShotSchedule(0.5), structure="expert", **options)


def test_the_default_selection_takes_every_layer_without_a_selection_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pruner = Pruner(tiny_qwen2_moe(), OneShotSchedule(0.25), structure="expert")
    assert [row.name for row in pruner.report().rows] == [
        "model.layers.0.mlp",
        "model.layers.1.mlp",
    ]
    assert pruner.targets == [
        f"model.layers.{i}.mlp.{name}"
        for i in (0, 1)
        for name in ("experts.gate_up_proj", "experts.down_proj", "gate.weight")
    ]


def test_exclude_chooses_layers_by_their_names() -> None:
    model = tiny_mixtral()
    pruner = Pruner(model, OneShotSchedule(0.5), structure="expert", exclude=[r"layers\.1\."])
    assert pruner.step() == EXPERTS // 2
    assert [row.name for row in pruner.report().rows] == ["model.layers.0.mlp"]
    assert not hasattr(model.model.layers[1].mlp.gate, "weight_mask")


def test_a_selection_holding_no_moe_layer_is_refused() -> None:
    model = tiny_mixtral()
    check = unchanged(model)
    with pytest.raises(
        ValueError, match=r"some tensor of a mixture-of-experts layer .* 'model.layers.0.mlp'"
    ):
        Pruner(model, OneShotSchedule(0.5), structure="expert", parameters=["lm_head.weight"])
    check()


def test_a_dense_model_has_no_experts() -> None:
    model = tiny_llama()
    check = unchanged(model)
    with pytest.raises(
        ValueError,
        match=r"structure='expert', but the llama blocks of LlamaForCausalLM have none",
    ):
        Pruner(model, OneShotSchedule(0.5), structure="expert")
    check()


def test_the_pruner_hooks_each_router_once() -> None:
    model = tiny_mixtral()
    Pruner(model, OneShotSchedule(0.5), structure="expert")
    Pruner(model, OneShotSchedule(0.5), structure="expert")
    assert [len(layer.mlp.gate._forward_hooks) for layer in model.model.layers] == [1, 1]


def test_unmasked_routing_is_untouched() -> None:
    model = tiny_mixtral()
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        before = model(tokens).logits
        Pruner(model, OneShotSchedule(0.5), structure="expert")
        assert torch.equal(model(tokens).logits, before)
