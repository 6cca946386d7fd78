"""Shrinking against its oracle: the masked model. Every family, every kind, every masking mode:
the shrunk model computes what the masked one did (eval and train), generates the same tokens
with its KV cache, and its config, ties, masks, report and errors are right."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import DependencyGraph, l1_unstructured, shrink
from tensorplay.ao.pruning.parity.reparametrization import is_pruned_tensor
from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
from tests.core.gloo import spawn_gloo
from tests.core.structure.masking import MODES, Mode, mask_units
from tests.hf_models import (
    VOCAB,
    tiny_bert,
    tiny_gpt2,
    tiny_llama,
    tiny_mistral,
    tiny_qwen2,
    tiny_qwen3,
    tiny_roberta,
    tiny_vit,
)
from tests.model_state import unchanged

transformers = pytest.importorskip("transformers")

Keeps = list[tuple[UnitGroup, Tensor]]


def gpt2() -> nn.Module:
    return tiny_gpt2(n_head=4, dropout=0.0)


def bert() -> nn.Module:
    return tiny_bert(dropout=0.0)


DECODERS = {"llama": tiny_llama, "mistral": tiny_mistral, "qwen2": tiny_qwen2, "qwen3": tiny_qwen3,
            "gpt2": gpt2}  # fmt: skip
ENCODERS = {"bert": bert, "roberta": tiny_roberta, "vit": tiny_vit}


def inputs_for(model: nn.Module) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(7)
    if type(model).__name__.startswith("ViT"):
        return {"pixel_values": torch.randn(2, 3, 8, 8, generator=generator)}
    return {"input_ids": torch.randint(1, VOCAB, (2, 7), generator=generator)}


def uneven_keeps(graph: DependencyGraph) -> Keeps:
    """Different widths per block: block i drops every (i+2)-th channel and, in block 0 only,
    its first head; the middle block is dropped where layers can go."""
    keeps: Keeps = []
    for index, group in enumerate(graph.groups("channel")):
        keeps.append((group, torch.arange(group.size) % (index + 2) != 0))
    heads = graph.groups("head")[0]
    keeps.append((heads, torch.arange(heads.size) != 0))
    if "layer" in graph.kinds:
        layers = graph.groups("layer")
        keeps.append((layers[1], torch.tensor([False])))
    return keeps


def uniform_keeps(graph: DependencyGraph, kinds: tuple[str, ...]) -> Keeps:
    """The same widths in every block: every other channel, the first head (key/value group);
    the middle block where layers can go."""
    keeps: Keeps = []
    if "channel" in kinds:
        keeps += [(g, torch.arange(g.size) % 2 == 1) for g in graph.groups("channel")]
    if "head" in kinds:
        keeps += [(g, torch.arange(g.size) != 0) for g in graph.groups("head")]
    if "layer" in kinds and "layer" in graph.kinds:
        keeps.append((graph.groups("layer")[1], torch.tensor([False])))
    return keeps


def masked_and_shrunk(
    build: Callable[[], nn.Module], mode: Mode, uniform: bool = False
) -> tuple[nn.Module, nn.Module]:
    model = build()
    graph = DependencyGraph(model)
    keeps = uniform_keeps(graph, graph.kinds) if uniform else uneven_keeps(graph)
    mask_units(model, keeps, mode)
    shrunk = copy.deepcopy(model)
    shrink(shrunk)
    return model, shrunk


CASES = [
    *(pytest.param("llama", mode, id=f"llama-{mode}") for mode in MODES),
    pytest.param("mistral", "inplace", id="mistral-inplace"),
    pytest.param("qwen2", "reparametrize", id="qwen2-reparametrize"),
    pytest.param("qwen3", "zeros", id="qwen3-zeros"),
    *(pytest.param("gpt2", mode, id=f"gpt2-{mode}") for mode in MODES),
    pytest.param("bert", "inplace", id="bert-inplace"),
    pytest.param("roberta", "reparametrize", id="roberta-reparametrize"),
    pytest.param("vit", "zeros", id="vit-zeros"),
]
BUILDERS = {**DECODERS, **ENCODERS}


@pytest.mark.parametrize(("family", "mode"), CASES)
def test_the_shrunk_model_computes_what_the_masked_one_did(family: str, mode: Mode) -> None:
    masked, shrunk = masked_and_shrunk(BUILDERS[family], mode)
    inputs = inputs_for(masked)
    assert _parameters(shrunk) < _parameters(masked)
    for train in (False, True):
        masked.train(train)
        shrunk.train(train)
        expected, got = masked(**inputs).logits, shrunk(**inputs).logits
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "family",
    # One family in the quick tier; every family in the slow one.
    [name if name == "llama" else pytest.param(name, marks=pytest.mark.slow) for name in DECODERS],
)
def test_greedy_generation_with_the_kv_cache_is_unchanged(family: str) -> None:
    masked, shrunk = masked_and_shrunk(DECODERS[family], "reparametrize")
    tokens = inputs_for(masked)["input_ids"][:1]
    settings = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "pad_token_id": 0,
                "output_logits": True, "return_dict_in_generate": True}  # fmt: skip
    mask = torch.ones_like(tokens)
    runs = [model.generate(tokens, attention_mask=mask, **settings) for model in (masked, shrunk)]
    assert runs[1].sequences.tolist() == runs[0].sequences.tolist()
    assert runs[0].sequences.shape[1] == tokens.shape[1] + 6
    for got, expected in zip(runs[1].logits, runs[0].logits, strict=True):
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_removed_layers_renumber_the_cache_and_the_config() -> None:
    _, shrunk = masked_and_shrunk(tiny_qwen3, "zeros")  # drops block 1 of 3
    assert len(shrunk.model.layers) == 2
    assert [layer.self_attn.layer_idx for layer in shrunk.model.layers] == [0, 1]
    assert shrunk.config.num_hidden_layers == 2
    assert shrunk.config.layer_types == ["full_attention"] * 2


def test_uniform_widths_update_the_config_keys() -> None:
    _, shrunk = masked_and_shrunk(tiny_llama, "inplace", uniform=True)
    config = shrunk.config
    assert (config.intermediate_size, config.num_attention_heads, config.num_key_value_heads,
            config.head_dim, config.num_hidden_layers) == (24, 2, 1, 8, 2)  # fmt: skip
    assert not hasattr(config, "tensorplay_layer_widths")


def test_uneven_widths_are_recorded_per_layer_and_the_config_still_reads() -> None:
    _, shrunk = masked_and_shrunk(tiny_llama, "inplace")
    config = shrunk.config
    assert config.tensorplay_layer_widths == [
        {
            "intermediate_size": 24,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
        },
        {
            "intermediate_size": 36,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
        },
    ]  # block 1 of 3 is gone: these are blocks 0 and 2 (every 4th channel of 48 dropped)
    assert (config.intermediate_size, config.num_attention_heads) == (48, 4)  # buildable
    transformers.LlamaForCausalLM(config)  # its own code still reads and builds it


def test_gpt2_heads_cannot_be_described_by_its_config() -> None:
    model = gpt2()
    graph = DependencyGraph(model)
    mask_units(model, uniform_keeps(graph, ("head",)), "zeros")
    report = shrink(model)
    assert report.config == "per_layer"
    assert model.config.n_head == 4  # head_dim = n_embd // n_head must stay 8
    assert model.config.tensorplay_layer_widths == [{"n_inner": 128, "n_head": 3}] * 2
    assert [block.attn.num_heads for block in model.transformer.h] == [3, 3]
    assert [block.attn.split_size for block in model.transformer.h] == [24, 24]


def test_tied_weights_stay_tied() -> None:
    _, shrunk = masked_and_shrunk(gpt2, "reparametrize")
    assert shrunk.lm_head.weight is shrunk.transformer.wte.weight


@pytest.mark.parametrize("mode", MODES)
def test_the_masks_of_shrunk_tensors_are_gone(mode: Mode) -> None:
    _, shrunk = masked_and_shrunk(tiny_llama, mode)
    keys = list(shrunk.state_dict())
    assert not [key for key in keys if key.endswith(("_orig", "_mask"))]
    assert not any(module._forward_pre_hooks for module in shrunk.modules())


def test_masks_on_other_tensors_are_left_alone() -> None:
    model = tiny_llama()
    graph = DependencyGraph(model)
    mask_units(model, uniform_keeps(graph, ("channel",)), "zeros")
    l1_unstructured(model.lm_head, "weight", amount=0.5)
    expected = model(**inputs_for(model)).logits
    shrink(model)
    assert is_pruned_tensor(model.lm_head, "weight")
    torch.testing.assert_close(model(**inputs_for(model)).logits, expected, atol=2e-6, rtol=1e-5)


def test_units_pruned_in_some_slices_only_are_kept() -> None:
    model = tiny_llama()
    graph = DependencyGraph(model)
    channels = graph.groups("channel")[0]
    mask_units(model, [(channels, torch.arange(48) >= 2)], "zeros")  # units 0 and 1 fully
    mlp = model.model.layers[0].mlp
    with torch.no_grad():
        mlp.gate_proj.weight[5] = 0  # unit 5: its gate row only
    l1_unstructured(mlp.up_proj, "weight", amount=0.3)  # element pruning on top
    expected = model(**inputs_for(model)).logits
    report = shrink(model)
    assert report.partial_units == 1
    assert report.groups[0].after == 46
    assert mlp.up_proj.weight.shape == (46, 32)
    torch.testing.assert_close(model(**inputs_for(model)).logits, expected, atol=2e-6, rtol=1e-5)


def test_a_group_with_every_unit_pruned_keeps_one_zero_unit() -> None:
    model = tiny_llama()
    heads = DependencyGraph(model).groups("head")[0]
    mask_units(model, [(heads, torch.tensor([False, False]))], "zeros")
    expected = model(**inputs_for(model)).logits
    report = shrink(model)
    assert next((g.name, g.after) for g in report.groups if g.kind == "head") == (heads.name, 1)
    attention = model.model.layers[0].self_attn
    assert attention.k_proj.weight.shape == (8, 32) and not attention.k_proj.weight.any()
    torch.testing.assert_close(model(**inputs_for(model)).logits, expected, atol=2e-6, rtol=1e-5)


def test_the_report_counts_parameters_and_widths() -> None:
    model = tiny_llama()
    graph = DependencyGraph(model)
    mask_units(model, uniform_keeps(graph, ("channel", "layer")), "zeros")
    before = sum(p.numel() for p in model.parameters())
    report = shrink(model)
    assert report.parameters_before == before
    assert report.parameters_after == sum(p.numel() for p in model.parameters())
    # blocks 0 and 2 lose 24 rows of gate and up and 24 columns of down; block 1 goes
    assert report.removed == 2 * 3 * 24 * 32 + _block_parameters(tiny_llama(), 1)
    # one vocabulary for layers: the layer group is the blocks' container, its units the layers;
    # the channels and heads of a removed layer leave with it, with no row of their own
    assert [(g.name, g.kind, g.before, g.after) for g in report.groups] == [
        ("model.layers.0.mlp", "channel", 48, 24),
        ("model.layers.2.mlp", "channel", 48, 24),
        ("model.layers.0.self_attn", "head", 2, 2),
        ("model.layers.2.self_attn", "head", 2, 2),
        ("model.layers", "layer", 3, 2),
    ]
    assert report.removed_layers == ("model.layers.1",)
    lines = str(report).splitlines()
    assert lines[0] == f"parameters: {before:,} -> {report.parameters_after:,} " + (
        f"({report.parameters_after / before:.1%})"
    )
    assert lines[1].split() == ["group", "kind", "before", "after"]
    assert lines[2].split() == ["model.layers.0.mlp", "channel", "48", "24"]
    assert lines[6].split() == ["model.layers", "layer", "3", "2"]
    assert lines[7] == "layers removed: model.layers.1"
    assert "channel" not in "".join(line for line in lines if "layers.1" in line)
    assert lines[-1] == "config: uniform widths, plain from_pretrained loads a saved copy"


def test_a_new_optimizer_takes_the_step_the_masked_model_takes() -> None:
    """Shrinking makes new parameters: the old optimizer holds the old ones; a fresh AdamW on
    the shrunk model steps as a fresh AdamW on the masked (reparametrized) model does."""
    masked, shrunk = masked_and_shrunk(tiny_llama, "reparametrize")
    old = torch.optim.AdamW(masked.parameters(), lr=1e-2)
    assert not {id(p) for p in shrunk.parameters()} & {id(p) for g in old.param_groups
                                                        for p in g["params"]}  # fmt: skip
    inputs = inputs_for(masked)
    for model in (masked, shrunk):
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model(**inputs, labels=inputs["input_ids"]).loss.backward()
        optimizer.step()
    masked.eval(), shrunk.eval()
    torch.testing.assert_close(
        shrunk(**inputs).logits, masked(**inputs).logits, atol=1e-5, rtol=1e-4
    )


def test_given_groups_are_the_only_ones_shrunk() -> None:
    model = tiny_llama()
    graph = DependencyGraph(model)
    mask_units(model, uniform_keeps(graph, ("channel", "head")), "zeros")
    report = shrink(model, groups=graph.groups("channel"))
    assert {g.kind for g in report.groups} == {"channel"}
    assert model.model.layers[0].mlp.up_proj.weight.shape == (24, 32)
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (16, 32)  # zeros stay


def test_plain_modules_resize_with_their_batch_norm_statistics() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 4, 1))
    model[1].running_mean.uniform_()
    model[1].running_var.uniform_(0.5, 2.0)
    channels = UnitGroup(
        "0", "channel", 6,
        (Slice("0.weight", 0), Slice("0.bias", 0, scored=False), Slice("1.weight", 0, scored=False),
         Slice("1.bias", 0, scored=False), Slice("3.weight", 1)),
    )  # fmt: skip
    mask_units(model, [(channels, torch.tensor([True, False, True, True, False, True]))], "zeros")
    model.eval()
    x = torch.randn(2, 3, 6, 6)
    expected = model(x)
    report = shrink(model, groups=[channels])
    assert (model[0].out_channels, model[1].num_features, model[3].in_channels) == (4, 4, 4)
    assert model[1].running_mean.shape == (4,)
    assert report.config == "none"
    torch.testing.assert_close(model(x), expected, atol=1e-6, rtol=1e-5)


def test_a_module_that_cannot_be_resized_is_refused_before_any_change() -> None:
    model = tiny_llama()
    graph = DependencyGraph(model)
    mask_units(model, uniform_keeps(graph, ("channel",)), "reparametrize")
    embedding = UnitGroup("emb", "channel", 97, (Slice("model.embed_tokens.weight", 0),))
    mask_units(model, [(embedding, torch.arange(97) != 3)], "zeros")
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"Embedding to lose columns .* of 'model.embed_tokens'"):
        shrink(model, groups=[*graph.groups("channel"), embedding])
    check()


def test_groups_that_do_not_fit_are_refused_before_any_change() -> None:
    model = tiny_llama()
    check = unchanged(model)
    wrong = UnitGroup("mlp", "channel", 49, (Slice("model.layers.0.mlp.up_proj.weight", 0),))
    with pytest.raises(ValueError, match=r"49 units of group 'mlp' to fit dim 0"):
        shrink(model, groups=[wrong])
    check()


def test_a_layer_group_outside_a_known_family_is_refused() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    nn.init.zeros_(model[0].weight)
    nn.init.zeros_(model[0].bias)
    layer = UnitGroup(
        "0", "layer", 1, (Slice("0.weight", None), Slice("0.bias", None, scored=False))
    )
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"blocks of a Hugging Face model .* but '0' is not"):
        shrink(model, groups=[layer])
    check()


def test_a_config_with_transformers_per_layer_config_is_refused() -> None:
    model = tiny_llama()
    model.config.per_layer_config = {0: {"rms_norm_eps": 1e-5}}
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"uses per_layer_config"):
        shrink(model)
    check()


def _parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _block_parameters(model: nn.Module, index: int) -> int:
    return sum(p.numel() for p in model.model.layers[index].parameters())


@pytest.mark.parametrize(("config_class", "expected"), [("LlamaConfig", "per_layer"),
                                                        ("MistralConfig", "uniform")])  # fmt: skip
def test_heads_a_config_cannot_validate_are_recorded_per_layer(
    config_class: str, expected: str
) -> None:
    """5 heads of 8 in a hidden size of 48: Llama's config refuses it, Mistral's takes it."""
    config = getattr(transformers, config_class)(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=6, head_dim=8,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    graph = DependencyGraph(model)
    mask_units(model, uniform_keeps(graph, ("head",)), "zeros")
    assert shrink(model).config == expected
    assert model.config.num_attention_heads == (6 if expected == "per_layer" else 5)


def test_a_model_in_a_wrapper_shrinks_and_its_config_follows() -> None:
    wrapper = nn.Module()
    wrapper.model = tiny_llama()
    graph = DependencyGraph(wrapper)
    mask_units(wrapper, uniform_keeps(graph, ("channel", "layer")), "inplace")
    inputs = inputs_for(wrapper.model)
    expected = wrapper.model(**inputs).logits
    report = shrink(wrapper)
    assert report.groups[0].name == "model.model.layers.0.mlp"
    assert (wrapper.model.config.intermediate_size, wrapper.model.config.num_hidden_layers) == (
        24, 2)  # fmt: skip
    torch.testing.assert_close(wrapper.model(**inputs).logits, expected, atol=2e-6, rtol=1e-5)


def _shrink_a_sharded_model(rank: int, out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    with torch.no_grad():
        model[0].weight[1] = 0
        model[0].bias[1] = 0
        model[2].weight[:, 1] = 0
    mesh = init_device_mesh("cpu", (1,))
    model[0].weight = nn.Parameter(distribute_tensor(model[0].weight.detach(), mesh, [Shard(0)]))
    group = UnitGroup("0", "channel", 6, (Slice("0.weight", 0), Slice("0.bias", 0),
                                          Slice("2.weight", 1)))  # fmt: skip
    try:
        shrink(model, groups=[group])
    except ValueError as error:
        (out / "error.txt").write_text(str(error))
    (out / "shape.txt").write_text(str(tuple(model[2].weight.shape)))


@pytest.mark.slow
@pytest.mark.distributed
def test_a_sharded_parameter_is_refused(tmp_path: Path) -> None:
    spawn_gloo(_shrink_a_sharded_model, 1, tmp_path)
    assert "'0.weight' is a DTensor" in (tmp_path / "error.txt").read_text()
    assert (tmp_path / "shape.txt").read_text() == "(2, 6)"
