"""``structure="hidden"``: the residual stream's channels, against the oracles: the masked model,
the shrunk one and a copy saved and loaded again compute the same logits (within 1e-5: float32
sums reordered); the parameters removed are counted by hand from the slices; a gradual pruner
resumed from its state masks what it would have; Minitron's activation score by hand; every
family outside the supported ones refused before anything changes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import (
    DependencyGraph,
    OneShotSchedule,
    Pruner,
    load_shrunk,
    permanent_state_dict,
    prune_one_shot,
    shrink,
)
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.ao.pruning.structured.dependency.unit_groups import shapes_of
from tensorplay.ao.pruning.structured.units.stream_norms import StreamNormHook
from tests.family_models import FAMILY_MODELS
from tests.model_state import unchanged

transformers = pytest.importorskip("transformers")

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
SUPPORTED = ["llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "olmoe",
             "gpt2"]  # fmt: skip
PER_LAYER = {"olmoe", "gpt2"}
"""Their config derives an attention width from ``hidden_size`` (OLMoE's ``q_norm``, GPT-2's
heads): a saved copy loads with ``load_shrunk``, plain ``from_pretrained`` refuses it."""
REFUSED = {
    "gemma": r"sqrt\(hidden_size\)",
    "gemma2": r"sqrt\(hidden_size\)",
    "gemma3": r"sqrt\(hidden_size\)",
    "granite": r"'granite'",
    "phi3": r"'phi3'",
    "olmo2": r"'olmo2'",
    "gpt_neox": r"'gpt_neox'",
    "gpt_neox-sequential": r"'gpt_neox'",
    "bert": r"post-norm",
    "roberta": r"post-norm",
    "vit": r"patch convolution",
}
WIDTH = 32  # every tiny model's hidden_size


def _tokens() -> torch.Tensor:
    return torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))


def _logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(_tokens()).logits


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied ones once: parameters() dedups


def _removed_by_hand(model: nn.Module, pruned: int) -> int:
    """Parameters ``pruned`` hidden channels take out: each slice's elements per unit."""
    group = DependencyGraph(model).hidden().group
    shapes = shapes_of(model)
    total = 0
    for piece in group.slices:
        shape = shapes[piece.parameter]
        assert piece.dim is not None
        total += shape.numel() // shape[piece.dim] * piece.width * pruned
    return total


@pytest.mark.parametrize("amount", [0.25, 0.5])
@pytest.mark.parametrize("name", SUPPORTED)
def test_masked_shrunk_and_reloaded_compute_alike(name: str, amount: float, tmp_path: Path) -> None:
    entry = FAMILY_MODELS[name]
    model = entry.build()
    pruner = Pruner(model, OneShotSchedule(amount), structure="hidden")
    assert pruner.step() == round(amount * WIDTH)
    masked = _logits(model)
    before = sum(p.numel() for p in model.parameters())
    removed = _removed_by_hand(model, round(amount * WIDTH))
    report = shrink(model)
    kept = WIDTH - round(amount * WIDTH)
    assert (report.parameters_before, report.parameters_after) == (before, before - removed)
    assert sum(p.numel() for p in model.parameters()) == report.parameters_after
    assert not any(
        isinstance(hook, StreamNormHook)
        for m in model.modules()
        for hook in m._forward_hooks.values()
    )
    torch.testing.assert_close(_logits(model), masked, **TOLERANCE)
    model.save_pretrained(tmp_path)
    auto = getattr(transformers, entry.auto)
    if name in PER_LAYER:
        assert report.config == "per_layer"
        with pytest.raises(RuntimeError):
            auto.from_pretrained(tmp_path)  # a size mismatch, never a wrong model
        loaded = load_shrunk(auto, tmp_path)
    else:
        assert report.config == "uniform"
        assert (model.config.hidden_size, model.config.head_dim) == (kept, 8)
        loaded = auto.from_pretrained(tmp_path)
    torch.testing.assert_close(_logits(loaded.eval()), masked, **TOLERANCE)


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_a_gradual_pruner_resumed_from_its_state_masks_alike(masking: str) -> None:
    schedule = LinearSchedule(0.5, end_step=4, frequency=2)  # 0.25 at step 2, 0.5 at step 4
    model = FAMILY_MODELS["qwen3"].build()
    pruner = Pruner(model, schedule, structure="hidden", masking=masking)  # type: ignore[arg-type]
    for step in range(3):
        pruner.step(step)
    assert pruner.pruned_count() == 8
    state, weights = copy.deepcopy(pruner.state_dict()), copy.deepcopy(model.state_dict())
    resumed_model = FAMILY_MODELS["qwen3"].build()
    resumed = Pruner(resumed_model, schedule, structure="hidden", masking=masking)  # type: ignore[arg-type]
    resumed.reparametrize()  # the masks' buffers, for the model's state_dict to load into
    assert not torch.equal(_logits(resumed_model), _logits(model))  # the states differ first
    resumed_model.load_state_dict(weights)
    resumed.load_state_dict(state)
    torch.testing.assert_close(_logits(resumed_model), _logits(model), atol=0, rtol=0)
    for run in (pruner, resumed):
        run.step(3)
        run.step(4)
    assert resumed.pruned_count() == pruner.pruned_count() == 16
    mine, theirs = model.state_dict(), resumed_model.state_dict()
    assert list(mine) == list(theirs)
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key
    torch.testing.assert_close(_logits(resumed_model), _logits(model), atol=0, rtol=0)


def test_the_hooks_follow_make_permanent_until_shrink() -> None:
    model = FAMILY_MODELS["llama"].build()
    pruner = Pruner(model, OneShotSchedule(0.5), structure="hidden")
    pruner.step()
    masked = _logits(model)
    pruner.make_permanent()
    torch.testing.assert_close(_logits(model), masked, atol=0, rtol=0)
    shrink(model, groups=[DependencyGraph(model).hidden().group])
    assert model.config.hidden_size == 16
    torch.testing.assert_close(_logits(model), masked, **TOLERANCE)


def test_a_permanent_save_before_shrinking_is_refused() -> None:
    model = FAMILY_MODELS["gpt2"].build()
    pruner = Pruner(model, OneShotSchedule(0.25), structure="hidden")
    permanent_state_dict(model)  # nothing masked yet: the permanent form is right
    pruner.step()
    with pytest.raises(ValueError, match=r"'transformer.h.0.ln_1' .*shrink\(model\)"):
        permanent_state_dict(model)
    shrink(model)
    assert "transformer.wte.weight" in permanent_state_dict(model)


def test_a_wrapped_model_records_its_hidden_group_once() -> None:
    class Wrapper(nn.Module):  # as a LightningModule holds a Hugging Face model
        def __init__(self) -> None:
            super().__init__()
            self.net = FAMILY_MODELS["llama"].build()

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.net(tokens).logits

    model = Wrapper()
    pruner = Pruner(model, OneShotSchedule(0.5), structure="hidden")
    pruner.step()
    with torch.no_grad():
        masked = model(_tokens())
    report = shrink(model)
    assert [(row.name, row.after) for row in report.groups if row.kind == "hidden"] == [("net", 16)]
    with torch.no_grad():
        torch.testing.assert_close(model(_tokens()), masked, **TOLERANCE)


def test_tied_and_untied_heads_are_one_slice_each() -> None:
    def ends(group: object) -> list[tuple[str, int | None]]:
        outer = ("wte.weight", "embed_tokens.weight", "head.weight")
        return [(p.parameter, p.dim) for p in group.slices if p.parameter.endswith(outer)]  # type: ignore[attr-defined]

    tied = DependencyGraph(FAMILY_MODELS["gpt2"].build()).hidden().group
    untied = DependencyGraph(FAMILY_MODELS["llama"].build()).hidden().group
    assert ends(tied) == [("transformer.wte.weight", 1)]
    assert ends(untied) == [("model.embed_tokens.weight", 1), ("lm_head.weight", 1)]


def test_qwen3_moe_fused_experts_lose_their_hidden_dims() -> None:
    model = FAMILY_MODELS["qwen3_moe"].build()
    group = DependencyGraph(model).hidden().group
    fused = [(p.parameter.removeprefix("model.layers.0.mlp."), p.dim) for p in group.slices
             if "layers.0.mlp.experts" in p.parameter]  # fmt: skip
    assert fused == [("experts.gate_up_proj", 2), ("experts.down_proj", 1)]
    Pruner(model, OneShotSchedule(0.5), structure="hidden").step()
    shrink(model)
    experts = model.model.layers[0].mlp.experts
    assert tuple(experts.gate_up_proj.shape)[2] == tuple(experts.down_proj.shape)[1] == 16
    assert experts.hidden_dim == model.model.layers[0].mlp.gate.hidden_dim == 16


@pytest.mark.parametrize("name", list(REFUSED))
def test_other_families_are_refused_before_any_change(name: str) -> None:
    model = FAMILY_MODELS[name].build()
    check = unchanged(model)
    with pytest.raises(ValueError, match=REFUSED[name]):
        Pruner(model, OneShotSchedule(0.5), structure="hidden")
    check()


def test_a_parameter_no_family_places_is_refused() -> None:
    model = FAMILY_MODELS["llama"].build()
    model.adapter = nn.Linear(5, 3)  # reads something: nobody says what
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"'adapter.weight' is a parameter the llama family"):
        Pruner(model, OneShotSchedule(0.5), structure="hidden")
    check()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        pytest.param({"importance": "wanda"}, r"'wanda'", id="wanda"),
        pytest.param({"importance": "movement"}, r"'movement'", id="movement"),
        pytest.param({"structure": ("channel", "hidden")}, r"distinct kinds", id="combined"),
    ],
)
def test_options_hidden_channels_cannot_be_pruned_with_are_refused(
    options: dict[str, object], match: str
) -> None:
    model = FAMILY_MODELS["llama"].build()
    check = unchanged(model)
    arguments: dict[str, object] = {"structure": "hidden", **options}
    with pytest.raises(ValueError, match=match):
        prune_one_shot(model, [{"input_ids": _tokens()}], 0.25, **arguments)  # type: ignore[arg-type]
    check()


@pytest.mark.parametrize("multiple_of", [8, 16])
def test_the_kept_width_is_a_multiple(multiple_of: int) -> None:
    model = FAMILY_MODELS["llama"].build()
    Pruner(model, OneShotSchedule(0.4), structure="hidden", multiple_of=multiple_of).step()
    shrink(model)
    assert model.config.hidden_size % multiple_of == 0 and model.config.hidden_size >= 1


def test_activation_scores_are_minitrons_by_hand() -> None:
    """The mean absolute value of each channel at every stream norm's output, over the tokens,
    summed over the norms (within 1e-6 relative: the library sums float32 values per batch,
    the oracle in float64)."""
    model = FAMILY_MODELS["llama"].build()
    width = DependencyGraph(model).hidden()
    outputs: list[torch.Tensor] = []
    handles = [
        model.get_submodule(norm.name).register_forward_hook(
            lambda module, args, output: outputs.append(output.detach().reshape(-1, WIDTH))
        )
        for norm in width.norms
    ]
    with torch.no_grad():
        model(_tokens())
    for handle in handles:
        handle.remove()
    by_hand = sum(out.abs().double().mean(dim=0) for out in outputs)
    assert len(outputs) == 2 * 3 + 1  # two norms a block, three blocks, the final norm
    pruner = Pruner(model, OneShotSchedule(0.25), structure="hidden", importance="activation")
    with torch.no_grad():
        model(_tokens())
    scores = pruner.importance.unit_scores(pruner.structure.groups[0])  # type: ignore[attr-defined]
    torch.testing.assert_close(scores, by_hand, atol=1e-6, rtol=1e-6)
    pruner.step()
    kept = model.model.norm.weight_mask.bool()
    assert torch.equal(kept, by_hand > by_hand.sort().values[7])


def test_one_shot_ranks_by_activation_by_default() -> None:
    model = FAMILY_MODELS["llama"].build()
    pruner = prune_one_shot(model, [{"input_ids": _tokens()}], 0.25, structure="hidden")
    assert pruner.config.importance == "activation" and pruner.pruned_count() == 8


@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "gpt2"])
def test_a_parameter_budget_is_met_within_one_step(name: str) -> None:
    model = FAMILY_MODELS[name].build()
    before = _params(model)
    budget = int(0.7 * before)
    prune_one_shot(
        model, [{"input_ids": _tokens()}], target_params=budget, structure="hidden",
        importance="magnitude", make_permanent=False,
    )  # fmt: skip
    masked = _logits(model)
    shrink(model)
    width = DependencyGraph(model).hidden().group.size
    # Widths come in steps: transformers requires hidden_size to be a multiple of the query
    # heads where the config states head_dim (4 heads here), and fused expert tensors keep
    # 16-byte rows (4 float32 channels); GPT-2's width is recorded per layer, any width.
    step = {"llama": 4, "qwen3_moe": 4, "gpt2": 1}[name]
    assert width % step == 0
    if name != "gpt2":  # the config states the width: plain from_pretrained rebuilds it
        assert model.config.hidden_size == width
    after = _params(model)
    assert after <= budget < after + step * _removed_by_hand(model, 1)
    torch.testing.assert_close(_logits(model), masked, **TOLERANCE)


def _fresh_reads(model: nn.Module) -> torch.Tensor:
    """The logits with every norm hook made to read its kept channels anew (the oracle of
    the hooks' cached reads)."""
    for module in model.modules():
        for hook in module._forward_hooks.values():
            if isinstance(hook, StreamNormHook):
                hook._read = None
    return _logits(model)


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_the_norm_hooks_read_the_kept_channels_anew_after_every_change(masking: str) -> None:
    model = FAMILY_MODELS["llama"].build()
    schedule = LinearSchedule(0.75, end_step=3, frequency=1)
    pruner = Pruner(model, schedule, structure="hidden", masking=masking)  # type: ignore[arg-type]
    seen = []
    for step in range(4):
        pruner.step(step)
        cached = _logits(model)  # read through the reads cached at the step before
        torch.testing.assert_close(cached, _fresh_reads(model), atol=0, rtol=0)
        seen.append(cached)
    assert len({round(float(logits.abs().sum()), 3) for logits in seen}) == 4  # each step changed


@pytest.mark.parametrize("change", ["in_place", "data_swap", "new_mask"])
def test_a_norm_hook_sees_its_mask_change_however_written(change: str) -> None:
    from tensorplay.ao.pruning.parity.methods import custom_from_mask
    from tensorplay.ao.pruning.structured.units.stream_norms import install_stream_norms

    norm = nn.LayerNorm(4)
    x = torch.tensor([[1.0, 2.0, 4.0, 8.0]])
    custom_from_mask(norm, "weight", torch.tensor([1.0, 1.0, 1.0, 0.0]))
    install_stream_norms([(norm, "layer")])
    torch.testing.assert_close(norm(x)[:, :3], nn.functional.layer_norm(x[:, :3], (3,)))
    mask = norm.get_buffer("weight_mask")
    two_kept = torch.tensor([1.0, 0.0, 1.0, 0.0])
    with torch.no_grad():
        if change == "in_place":
            mask.copy_(two_kept)
        elif change == "data_swap":  # what undoing a change does: no version bump
            changes.replace_data(mask, two_kept)
        else:
            norm.weight_mask = two_kept
    expected = nn.functional.layer_norm(x[:, [0, 2]], (2,))
    torch.testing.assert_close(norm(x)[:, [0, 2]], expected)
    assert norm(x)[:, [1, 3]].abs().sum() == 0
