"""Structured pruning's options and refusals: plain traced models, scopes, ``multiple_of``, the
scores per unit against hand-computed ones, resume mid-schedule, and clear errors before any
change."""

from __future__ import annotations

import copy
import typing
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import DependencyGraph, shrink
from tensorplay.ao.pruning.masking import mask_of
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.config import PrunerConfig, Structure
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tensorplay.ao.pruning.structured.dependency.unit_groups import unit_scores
from tensorplay.ao.pruning.structured.units import STRUCTURES
from tests.hf_models import tiny_bert, tiny_llama
from tests.model_state import unchanged

SCHEDULE = LinearSchedule(0.5, end_step=4, frequency=2)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 3)
    )


def cnn() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 12, 3, padding=1), nn.BatchNorm2d(12), nn.ReLU(),
        nn.Flatten(), nn.Linear(12 * 4 * 4, 5),
    )  # fmt: skip
    with torch.no_grad():  # statistics other than the defaults, so masking them matters
        for norm in (model[1], model[4]):
            norm.running_mean.uniform_(-1, 1)
            norm.running_var.uniform_(0.5, 2)
            norm.bias.uniform_(-1, 1)
    return model.eval()


PLAIN = {
    "mlp": (mlp, lambda: torch.randn(4, 6), 28),
    "cnn": (cnn, lambda: torch.randn(2, 3, 4, 4), 20),
}


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
@pytest.mark.parametrize("name", sorted(PLAIN))
def test_a_traced_plain_model_prunes_exact_counts_and_shrinks_to_the_same_outputs(
    name: str, masking: str
) -> None:
    build, inputs, total = PLAIN[name]
    model, x = build(), inputs()
    pruner = Pruner(model, SCHEDULE, structure="channel", example_inputs=x, masking=masking)  # type: ignore[arg-type]
    assert pruner.total_count() == total
    for step in range(5):
        pruner.step()
        assert pruner.pruned_count() == round(SCHEDULE(step) * total)
    with torch.no_grad():
        masked = model(x)
        shrink(model, example_inputs=x)
        torch.testing.assert_close(model(x), masked, atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in build().parameters())


def lowest_keeping_one(scores: Tensor, size: int, count: int) -> Tensor:
    """The oracle: ``count`` lowest scores, skipping a unit that would empty its group (groups of
    ``size`` consecutive units)."""
    pruned = torch.zeros_like(scores, dtype=torch.bool)
    left = [size] * (scores.numel() // size)
    for unit in scores.argsort().tolist():
        if int(pruned.sum()) == count:
            break
        if left[unit // size] > 1:
            pruned[unit] = True
            left[unit // size] -= 1
    return pruned


def test_magnitude_ranks_units_by_their_rms_across_layers() -> None:
    model = tiny_llama()
    pruner = Pruner(model, OneShotSchedule(0.3), structure="channel")
    expected = []
    for layer in model.model.layers:  # the hand oracle: each neuron's RMS over its 3 slices
        mlp = layer.mlp
        squares = (
            mlp.gate_proj.weight.pow(2).sum(1)
            + mlp.up_proj.weight.pow(2).sum(1)
            + mlp.down_proj.weight.pow(2).sum(0)
        )
        expected.append((squares / (3 * 32)).sqrt())
    scores = torch.cat(expected).detach()
    pruner.step()
    lowest = lowest_keeping_one(scores, 48, round(0.3 * scores.numel()))
    pruned = torch.cat(
        [~(mask_of(layer.mlp.up_proj, "weight") != 0).any(1) for layer in model.model.layers]
    )
    assert torch.equal(pruned, lowest)


@pytest.mark.parametrize("importance", ["taylor", "wanda"])
def test_taylor_and_wanda_rank_units_by_the_rms_of_their_element_scores(importance: str) -> None:
    model = tiny_llama().train()
    pruner = Pruner(model, OneShotSchedule(0.5, step=2), structure="head", importance=importance)
    tokens = torch.tensor([[4, 8, 15, 16, 23, 42]])
    for step in range(2):
        model(tokens, labels=tokens).loss.backward()
        pruner.accumulate()
        model.zero_grad()
        pruner.step(step)
    graph = DependencyGraph(model)
    element = pruner.importance.scores(pruner._scored_targets)
    by_name = {t.name: s for t, s in zip(pruner._scored_targets, element, strict=True)}
    scores = torch.cat([unit_scores(group, by_name) for group in graph.groups("head")])
    pruner.step(2)
    pruned = torch.cat(
        [
            ~(mask_of(layer.self_attn.k_proj, "weight") != 0).any(1).view(2, 8).any(1)
            for layer in model.model.layers
        ]
    )
    assert torch.equal(pruned, lowest_keeping_one(scores, 2, 3))


def test_layerwise_prunes_each_group_to_the_same_fraction() -> None:
    pruner = Pruner(tiny_llama(), OneShotSchedule(0.25), structure="channel", scope="layerwise")
    pruner.step()
    assert [row.pruned for row in pruner.report().rows] == [12, 12, 12]


@pytest.mark.parametrize(("scope", "pruned"), [("global", None), ("layerwise", [16, 16, 16])])
def test_multiple_of_keeps_widths_multiples_and_records_the_real_count(
    scope: str, pruned: list[int] | None
) -> None:
    model = tiny_llama()
    pruner = Pruner(model, OneShotSchedule(0.3), structure="channel", scope=scope, multiple_of=8)  # type: ignore[arg-type]
    pruner.step()
    rows = pruner.report().rows
    assert all((row.numel - row.pruned) % 8 == 0 and row.numel > row.pruned for row in rows)
    if pruned is not None:
        assert [row.pruned for row in rows] == pruned
    asked = round(0.3 * 144)
    assert abs(pruner.pruned_count() - asked) <= 4 * len(rows)
    assert pruner.history == [(0, 0.3, pruner.pruned_count())]
    shrink(model)
    assert {layer.mlp.up_proj.out_features % 8 for layer in model.model.layers} == {0}


def test_the_layer_structure_keeps_a_block() -> None:
    pruner = Pruner(tiny_llama(), OneShotSchedule(0.6), structure="layer", scope="layerwise")
    assert (pruner.step(), pruner.pruned_count(), pruner.total_count()) == (2, 2, 3)
    model = tiny_llama()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"group 'model.layers' \(3 units\).*asks for 3 more"):
        Pruner(model, OneShotSchedule(0.9), structure="layer")
    check()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"scope": "global"}, r"at most 141 more from 3 groups of 144 units.*asks for 144"),
        ({"scope": "layerwise"}, r"group 'model.layers.0.mlp' \(48 units\).*asks for 48"),
        ({"scope": "global", "multiple_of": 8}, r"at least 8 unit.*at most 120 more"),
    ],
    ids=["global", "layerwise", "multiple-of"],
)
def test_a_target_that_would_empty_a_group_is_refused_when_the_pruner_is_built(
    options: dict[str, Any], match: str
) -> None:
    model = tiny_llama()
    check = unchanged(model)
    with pytest.raises(ValueError, match=match):
        Pruner(model, OneShotSchedule(0.999, step=10), structure="channel", **options)
    check()


def _train(model: nn.Module, pruner: Pruner, steps: range) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    tokens = torch.tensor([[4, 8, 15, 16, 23, 42]])
    for step in steps:
        model(tokens, labels=tokens).loss.backward()
        pruner.accumulate()
        optimizer.step()
        optimizer.zero_grad()
        pruner.apply_masks()
        pruner.step(step)


def _masks(model: nn.Module) -> dict[str, Tensor]:
    return {
        key: value.clone() for key, value in model.state_dict().items() if key.endswith("_mask")
    }


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_resume_mid_schedule_equals_an_uninterrupted_run(masking: str) -> None:
    schedule = LinearSchedule(0.5, end_step=6, frequency=2)
    options: dict[str, Any] = {"structure": "channel", "importance": "taylor", "masking": masking}
    whole = tiny_llama().train()
    uninterrupted = Pruner(whole, schedule, **options)
    _train(whole, uninterrupted, range(8))

    first = tiny_llama().train()
    pruner = Pruner(first, schedule, **options)
    _train(first, pruner, range(3))
    saved_model, saved_pruner = copy.deepcopy(first.state_dict()), pruner.state_dict()
    assert saved_pruner["structure"] == "channel"
    resumed = tiny_llama(seed=5).train()
    again = Pruner(resumed, schedule, **options)
    again.reparametrize()
    assert _masks(resumed).keys() == _masks(first).keys()
    resumed.load_state_dict(saved_model)
    again.load_state_dict(saved_pruner)
    _train(resumed, again, range(3, 8))
    assert again.history == uninterrupted.history and len(again.history) == 3
    ours, theirs = _masks(resumed), _masks(whole)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)


def test_the_default_structure_is_single_weights_bit_for_bit() -> None:
    default, element = mlp(), mlp()
    Pruner(default, OneShotSchedule(0.5)).step()
    Pruner(element, OneShotSchedule(0.5), structure="element").step()
    assert (
        _masks(default).keys()
        == _masks(element).keys()
        == {"0.weight_mask", "2.weight_mask", "4.weight_mask"}
    )
    assert all(torch.equal(_masks(default)[k], _masks(element)[k]) for k in _masks(default))


BAD_OPTIONS = [
    pytest.param(
        {"structure": "block"},
        ValueError,
        r"`structure` to be 'element', 'channel', 'head', 'layer', 'expert' or 'hidden', but got "
        r"'block'",
        id="unknown",
    ),
    pytest.param(
        {"structure": "channel", "scope": "row"},
        ValueError,
        r"'global' or 'layerwise' with structure='channel', but got 'row'",
        id="row",
    ),
    pytest.param(
        {"structure": "head", "importance": "movement"},
        ValueError,
        r"structure='head', but got 'movement'",
        id="movement",
    ),
    pytest.param(
        {"structure": "channel", "multiple_of": 0},
        ValueError,
        r"`multiple_of` to be an int >= 1",
        id="multiple-zero",
    ),
    pytest.param(
        {"structure": "layer", "multiple_of": 8},
        ValueError,
        r"`multiple_of` to be 1 with structure='layer'",
        id="multiple-layer",
    ),
    pytest.param(
        {"multiple_of": 8},
        ValueError,
        r"`multiple_of` to be 1 with structure='element'",
        id="multiple-element",
    ),
    pytest.param(
        {"structure": "channel", "multiple_of": "8"},
        TypeError,
        r"`multiple_of` to be an int",
        id="multiple-type",
    ),
    pytest.param(
        {"structure": "channel", "method": "tensorplay.ao.pruning.parity.methods.Identity"},
        ValueError,
        r"'l1_unstructured' or 'random_unstructured' with structure='channel', but got Identity",
        id="method",
    ),
]


@pytest.mark.parametrize(("options", "error", "match"), BAD_OPTIONS)
def test_bad_options_are_refused_by_the_configuration(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        PrunerConfig(OneShotSchedule(0.5), **options)


NO_UNITS = [
    pytest.param(
        tiny_bert,
        {"structure": "layer"},
        r"layer units for structure='layer', but the blocks of BertForMaskedLM",
        id="layer-post-norm",
    ),
    pytest.param(
        mlp,
        {"structure": "head"},
        r"head units for structure='head', but Sequential is not a Hugging Face model",
        id="head-plain",
    ),
    pytest.param(
        lambda: nn.Linear(4, 4),
        {"structure": "channel"},
        r"with channel units for structure='channel', but Linear has none",
        id="no-units",
    ),
    pytest.param(
        tiny_llama,
        {"structure": "channel", "exclude": ["down_proj"]},
        r"none whole: e.g. 'model.layers.0.mlp' needs \['model.layers.0.mlp.down_proj.weight'\]",
        id="selection",
    ),
    pytest.param(
        mlp,
        {"example_inputs": torch.randn(2, 6)},
        r"`example_inputs` only with a structure of channels",
        id="inputs-element",
    ),
]


@pytest.mark.parametrize(("build", "options", "match"), NO_UNITS)
def test_a_model_without_such_units_is_refused_before_any_change(
    build: Any, options: dict[str, Any], match: str
) -> None:
    model = build()
    check = unchanged(model)
    with pytest.raises(ValueError, match=match):
        Pruner(model, OneShotSchedule(0.5), **options)
    check()


def test_without_example_inputs_a_flattened_width_is_left_alone() -> None:
    """Tracing without shapes cannot place a flattened feature map in the Linear after it, so
    those channels are not units (never wrongly masked); the example inputs find them."""
    pruner = Pruner(cnn(), OneShotSchedule(0.5), structure="channel")
    assert [row.name for row in pruner.report().rows] == ["0"]
    traced = Pruner(
        cnn(), OneShotSchedule(0.5), structure="channel", example_inputs=torch.randn(2, 3, 4, 4)
    )
    assert [row.numel for row in traced.report().rows] == [8, 12]


def test_the_structure_literal_lists_the_registry() -> None:
    assert list(typing.get_args(Structure)) == list(STRUCTURES)


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_rewinding_restores_the_kept_values_and_keeps_every_slice_pruned(masking: str) -> None:
    model = mlp()
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    pruner = Pruner(
        model, OneShotSchedule(0.5, step=1), structure="channel", rewind="init", masking=masking,  # type: ignore[arg-type]
        example_inputs=torch.randn(2, 6),
    )  # fmt: skip
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)  # training moved the weights
    pruner.step(0)
    pruner.step(1)
    for index in (0, 2):
        layer, kept = model[index], mask_of(model[index], "weight") != 0
        weight = layer.weight.detach()
        assert torch.equal(weight[kept], initial[f"{index}.weight"][kept])
        assert (weight[~kept] == 0).all()
    bias_kept = mask_of(model[0], "bias") != 0
    assert pruner.pruned_count() == 14 and int((~bias_kept).sum()) > 0
    assert (model[0].bias.detach()[~bias_kept] == 0).all()
    assert torch.equal(model[0].bias.detach()[bias_kept], initial["0.bias"][bias_kept])


def test_random_units_are_the_same_for_the_same_seed() -> None:
    def masks(seed: int) -> dict[str, Tensor]:
        model = tiny_llama()
        options: dict[str, Any] = {"structure": "head", "method": "random_unstructured"}
        Pruner(model, OneShotSchedule(0.5), seed=seed, **options).step()
        return _masks(model)

    first, again, other = masks(3), masks(3), masks(4)
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert any(not torch.equal(first[key], other[key]) for key in first)
