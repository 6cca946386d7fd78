"""The FFN channels of the routed experts of the mixture-of-experts families.

Oracle: the masked model's logits and greedy tokens, computed in the same process, for the
shrunk model and a copy saved and loaded again (within 1e-5: float32 sums reordered)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import DependencyGraph, Pruner, load_shrunk, prune_one_shot, shrink
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.ao.pruning.structured.dependency.unit_groups import (
    Slice,
    UnitGroup,
    expand_keep,
    shapes_of,
)
from tensorplay.ao.pruning.structured.units.budget import model_params, unit_params
from tests.core.structure.masking import mask_units
from tests.hf_models import VOCAB
from tests.model_state import unchanged
from tests.moe_models import EXPERTS, MOE_MODELS

transformers = pytest.importorskip("transformers")

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
WIDTH = 16  # each tiny expert's channels
WIDTH_KEY = {
    "qwen2_moe": "moe_intermediate_size",
    "qwen3_moe": "moe_intermediate_size",
    "mixtral": "intermediate_size",
    "olmoe": "intermediate_size",
}
"""The config key each family builds its experts' width from."""
FAMILIES = list(MOE_MODELS)


def _outputs(model: nn.Module) -> dict[str, Any]:
    tokens = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
        run = model.generate(  # type: ignore[operator]
            tokens[:1], attention_mask=torch.ones_like(tokens[:1]), max_new_tokens=8,
            min_new_tokens=8, do_sample=False, pad_token_id=0,
        )  # fmt: skip
    return {"logits": logits, "tokens": run.tolist()}


def _assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    torch.testing.assert_close(got["logits"], expected["logits"], **TOLERANCE)
    assert got["tokens"] == expected["tokens"]


def _expert_groups(model: nn.Module) -> list[UnitGroup]:
    return [g for g in DependencyGraph(model).groups("channel") if "experts[" in g.name]


def _reloaded(model: nn.Module, directory: Path, plain: bool) -> nn.Module:
    model.save_pretrained(directory)
    auto = transformers.AutoModelForCausalLM
    loaded = auto.from_pretrained(directory) if plain else load_shrunk(auto, directory)
    return loaded.eval()


@pytest.mark.parametrize("name", FAMILIES)
def test_each_expert_is_a_channel_group_of_its_fused_tensors(name: str) -> None:
    model = MOE_MODELS[name]()
    groups = _expert_groups(model)
    assert [g.name for g in groups] == [
        f"model.layers.{layer}.mlp.experts[{expert}]"
        for layer in range(2)
        for expert in range(EXPERTS)
    ]
    experts = "model.layers.1.mlp.experts"
    assert groups[EXPERTS + 3] == UnitGroup(
        f"{experts}[3]", "channel", WIDTH,
        (Slice(f"{experts}.gate_up_proj", 1, 0, expert=3),
         Slice(f"{experts}.gate_up_proj", 1, WIDTH, expert=3),
         Slice(f"{experts}.down_proj", 2, expert=3)),
    )  # fmt: skip
    # Channel 5 of expert 3: its gate row, its up row and its down column, nothing else.
    keep = torch.arange(WIDTH) != 5
    masks = expand_keep(groups[EXPERTS + 3], keep, shapes_of(model))
    gate_up, down = masks[f"{experts}.gate_up_proj"], masks[f"{experts}.down_proj"]
    assert (~gate_up).nonzero()[:, :2].unique(dim=0).tolist() == [[3, 5], [3, WIDTH + 5]]
    assert (~down).nonzero()[:, [0, 2]].unique(dim=0).tolist() == [[3, 5]]
    hidden = gate_up.shape[2]
    assert unit_params(groups[0], shapes_of(model), {}) == 3 * hidden  # gate, up, down slices


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
@pytest.mark.parametrize("name", FAMILIES)
def test_equal_widths_shrink_exactly_and_load_with_plain_from_pretrained(
    name: str, masking: str, tmp_path: Path
) -> None:
    model = MOE_MODELS[name]()
    pruner = Pruner(
        model, OneShotSchedule(0.5), structure="channel", scope="layerwise", masking=masking
    )
    pruner.step()
    rows = {row.name: row.pruned for row in pruner.report().rows}
    assert {rows[f"model.layers.0.mlp.experts[{e}]"] for e in range(EXPERTS)} == {WIDTH // 2}
    masked = _outputs(model)
    report = shrink(model)
    _assert_same(_outputs(model), masked)
    assert (report.config, report.padded_units) == ("uniform", 0)
    assert getattr(model.config, WIDTH_KEY[name]) == WIDTH // 2
    experts = model.model.layers[1].mlp.experts
    assert tuple(experts.gate_up_proj.shape) == (EXPERTS, WIDTH, 32)
    assert tuple(experts.down_proj.shape) == (EXPERTS, 32, WIDTH // 2)
    assert experts.intermediate_dim == WIDTH // 2
    assert [(row.name, row.before, row.after) for row in report.groups if "experts" in row.name][
        :2
    ] == [("model.layers.0.mlp.experts", WIDTH, 8), ("model.layers.1.mlp.experts", WIDTH, 8)]
    _assert_same(_outputs(_reloaded(model, tmp_path, plain=True)), masked)


@pytest.mark.parametrize("name", FAMILIES)
def test_widths_per_layer_load_with_load_shrunk(name: str, tmp_path: Path) -> None:
    """Layer 0's experts keep 8 channels, layer 1's 12: the config cannot say it."""
    model = MOE_MODELS[name]()
    groups = _expert_groups(model)
    keeps = [(g, torch.arange(WIDTH) < (8 if ".0." in g.name else 12)) for g in groups]
    mask_units(model, keeps, "reparametrize")
    masked = _outputs(model)
    report = shrink(model)
    _assert_same(_outputs(model), masked)
    assert report.config == "per_layer"
    assert getattr(model.config, WIDTH_KEY[name]) == WIDTH  # what the model code builds with
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _reloaded(model, tmp_path, plain=True)
    loaded = _reloaded(model, tmp_path, plain=False)
    widths = [layer[WIDTH_KEY[name]] for layer in loaded.config.tensorplay_layer_widths]
    assert widths == [8, 12]
    _assert_same(_outputs(loaded), masked)


@pytest.mark.parametrize("name", FAMILIES)
def test_widths_per_expert_keep_the_widest_with_zero_channels(name: str, tmp_path: Path) -> None:
    """Expert e of layer 0 keeps 2 + e channels: a fused tensor holds one width, so every
    expert keeps 12 (9, the widest, rounded up to 16 bytes of float32), the others as zeros."""
    model = MOE_MODELS[name]()
    groups = _expert_groups(model)
    keeps = [
        (g, torch.arange(WIDTH) < (2 + int(g.name[-2]) if ".0." in g.name else WIDTH // 2))
        for g in groups
    ]
    mask_units(model, keeps, "inplace")
    masked = _outputs(model)
    report = shrink(model)
    _assert_same(_outputs(model), masked)
    assert model.model.layers[0].mlp.experts.down_proj.shape[-1] == 12
    kept = sum(2 + e for e in range(EXPERTS))
    assert report.padded_units == 12 * EXPERTS - kept
    assert "kept as zeros" in str(report)
    loaded = _reloaded(model, tmp_path, plain=report.config == "uniform")
    _assert_same(_outputs(loaded), masked)


def _batches(count: int = 2) -> list[dict[str, Tensor]]:
    generator = torch.Generator().manual_seed(3)
    ids = [torch.randint(1, VOCAB, (4, 12), generator=generator) for _ in range(count)]
    return [{"input_ids": batch, "labels": batch} for batch in ids]


@pytest.mark.parametrize("importance", ["magnitude", "taylor"])
def test_scores_rank_each_experts_channels(importance: str) -> None:
    """Channel 0 of every expert scaled down a thousandfold: each score prunes it first."""
    model = MOE_MODELS["mixtral"]()
    with torch.no_grad():
        for layer in model.model.layers:
            experts = layer.mlp.experts
            experts.gate_up_proj[:, [0, WIDTH]] *= 1e-3
            experts.down_proj[:, :, 0] *= 1e-3
    pruner = Pruner(
        model, OneShotSchedule(1 / WIDTH), structure="channel", scope="layerwise",
        importance=importance,
    )  # fmt: skip
    if importance == "taylor":
        for batch in _batches():
            model(**batch).loss.backward()
            pruner.accumulate()
            model.zero_grad()
    pruner.step()
    experts = model.model.layers[0].mlp.experts
    routed = {int(e) for e in experts.down_proj.abs().sum(dim=(1, 2)).nonzero()}
    mask = experts.down_proj_mask
    for expert in range(EXPERTS):
        pruned = (~mask[expert].bool()).all(dim=0).nonzero().flatten().tolist()
        # Taylor scores an expert no token reached 0 everywhere: its first channel goes too.
        assert pruned == [0] or (importance == "taylor" and expert not in routed)


def test_prune_one_shot_prunes_the_channels_of_every_expert(tmp_path: Path) -> None:
    model = MOE_MODELS["qwen3_moe"]()
    prune_one_shot(
        model, _batches(), 0.25, structure="channel", importance="magnitude", scope="layerwise"
    )
    masked = _outputs(model)
    report = shrink(model)
    assert (report.config, model.config.moe_intermediate_size) == ("uniform", 12)
    _assert_same(_outputs(model), masked)
    _assert_same(_outputs(_reloaded(model, tmp_path, plain=True)), masked)


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen2_moe"])
def test_a_budget_prices_an_experts_channel_by_its_slices(name: str, tmp_path: Path) -> None:
    model = MOE_MODELS[name]()
    budget = int(0.8 * model_params(model))
    prune_one_shot(
        model, _batches(), structure="channel", importance="magnitude", scope="layerwise",
        target_params=budget,
    )  # fmt: skip
    masked = _outputs(model)
    report = shrink(model)
    assert report.parameters_after <= budget
    assert report.config == "uniform" and report.padded_units == 0
    assert getattr(model.config, WIDTH_KEY[name]) % 4 == 0  # 16 bytes of float32
    _assert_same(_outputs(model), masked)
    _assert_same(_outputs(_reloaded(model, tmp_path, plain=True)), masked)


def test_a_shared_experts_channels_alone_leave_the_routed_experts_dense() -> None:
    """A routed expert's channels take part with a tensor of their layer outside the shared
    expert: a selection of the shared expert alone prunes its channels only."""
    model = MOE_MODELS["qwen2_moe"]()
    pruner = Pruner(
        model, OneShotSchedule(0.5), structure="channel", scope="layerwise",
        include=[r"shared_expert\."],
    )  # fmt: skip
    assert [row.name for row in pruner.report().rows] == [
        "model.layers.0.mlp.shared_expert", "model.layers.1.mlp.shared_expert"]  # fmt: skip


REFUSALS = [
    pytest.param(
        {"importance": "wanda"}, r"importance='wanda'.*fused tensor of mixture-of-experts",
        id="wanda",
    ),
    pytest.param(
        {"importance": "activation"},
        r"importance='activation'.*'model.layers.0.mlp.experts\[0\]' \(channel\) is read by "
        r"none \(a routed expert's slice of a fused tensor\): rank it by 'magnitude'",
        id="activation",
    ),
    pytest.param(
        {"importance": "magnitude", "reconstruct": True},
        r"reconstruct=True, but they are routed experts' slices .*gate_up_proj",
        id="reconstruct",
    ),
    pytest.param(
        {"importance": "magnitude", "scope": "global", "target_params": 0.8, "sparsity": None},
        r"scope='layerwise' with `target_params` for the channels of routed experts "
        r"\('model.layers.0.mlp.experts\[0\]'",
        id="global-budget",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("options", "match"), REFUSALS)
def test_what_cannot_rank_or_shrink_an_experts_channels_is_refused_before_any_change(
    options: dict[str, Any], match: str
) -> None:
    model = MOE_MODELS["mixtral"]()
    check = unchanged(model)
    sparsity = options.pop("sparsity", 0.5)
    with pytest.raises(ValueError, match=match):
        prune_one_shot(model, _batches(), sparsity, structure="channel", **options)
    check()


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_one_shot_ranks_an_experts_channels_by_magnitude_unless_told(name: str) -> None:
    """Wanda cannot read a fused tensor's inputs per expert: the one-shot default for channels
    of a model with routed experts is magnitude, the masks of ``importance="magnitude"``."""
    default = prune_one_shot(
        MOE_MODELS[name](), _batches(), 0.5, structure="channel", scope="layerwise",
        make_permanent=False,
    )  # fmt: skip
    told = prune_one_shot(
        MOE_MODELS[name](), _batches(), 0.5, structure="channel", scope="layerwise",
        importance="magnitude", make_permanent=False,
    )  # fmt: skip
    assert default.config.importance == "magnitude"
    masks = {n: b for n, b in default.model.named_buffers() if n.endswith("_mask")}
    expected = {n: b for n, b in told.model.named_buffers() if n.endswith("_mask")}
    assert masks.keys() == expected.keys() and masks
    assert all(torch.equal(masks[n], expected[n]) for n in masks)
