"""The dependency graph of real Hugging Face architectures: groups per family and kind, the
slices each unit spans, where the model sits, and the errors for what cannot be analysed."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import custom_from_mask
from tensorplay.ao.pruning.structured.dependency.families import UnanalysableError
from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
from tests.hf_models import (
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

# builder, family, blocks' list, units per kind (layer None: refused)
FAMILIES = [
    pytest.param(tiny_llama, "llama", "model.layers", 48, 2, True, id="llama"),
    pytest.param(tiny_mistral, "llama", "model.layers", 48, 2, True, id="mistral"),
    pytest.param(tiny_qwen2, "llama", "model.layers", 48, 2, True, id="qwen2"),
    pytest.param(tiny_qwen3, "llama", "model.layers", 48, 2, True, id="qwen3"),
    pytest.param(lambda: tiny_gpt2(n_head=4), "gpt2", "transformer.h", 128, 4, True, id="gpt2"),
    pytest.param(tiny_bert, "bert", "bert.encoder.layer", 64, 2, False, id="bert"),
    pytest.param(tiny_roberta, "bert", "roberta.encoder.layer", 48, 4, False, id="roberta"),
    pytest.param(tiny_vit, "vit", "vit.layers", 48, 4, True, id="vit"),
]


@pytest.mark.parametrize(("build", "family", "blocks", "channels", "heads", "layers"), FAMILIES)
def test_every_block_has_one_group_of_each_kind(
    build: Callable[[], nn.Module], family: str, blocks: str, channels: int, heads: int,
    layers: bool,
) -> None:  # fmt: skip
    model = build()
    graph = DependencyGraph(model)
    count = len(model.get_submodule(blocks))
    assert graph.family == family
    assert graph.kinds == (("channel", "head", "layer") if layers else ("channel", "head"))
    assert [g.size for g in graph.groups("channel")] == [channels] * count
    assert [g.size for g in graph.groups("head")] == [heads] * count
    if layers:
        layer_groups = graph.groups("layer")
        assert [g.name for g in layer_groups] == [f"{blocks}.{i}" for i in range(count)]
        first = dict(model.get_submodule(f"{blocks}.0").named_parameters())
        assert {s.parameter for s in layer_groups[0].slices} == {f"{blocks}.0.{n}" for n in first}
        assert all(s.dim is None for s in layer_groups[0].slices)
    else:
        with pytest.raises(ValueError, match=r"layer units.*post-norm.*try 'channel' or 'head'"):
            graph.groups("layer")


def _slices(group_slices: tuple[Slice, ...], prefix: str) -> list[tuple[str, int | None, int, int]]:
    return [
        (s.parameter.removeprefix(prefix), s.dim, s.offset, s.width)
        for s in group_slices
        if s.scored
    ]


def _in_units(graph: DependencyGraph) -> set[str]:
    """The parameters some channel or head spans."""
    return {p for kind in ("channel", "head") for g in graph.groups(kind) for p in g.parameters()}


def test_llama_heads_are_key_value_groups_with_their_query_heads() -> None:
    graph = DependencyGraph(tiny_llama())  # 4 query heads of 8 share 2 key/value heads
    heads = graph.groups("head")[1]
    assert heads.name == "model.layers.1.self_attn"
    assert heads.size == 2
    assert _slices(heads.slices, "model.layers.1.self_attn.") == [
        ("q_proj.weight", 0, 0, 16),
        ("k_proj.weight", 0, 0, 8),
        ("v_proj.weight", 0, 0, 8),
        ("o_proj.weight", 1, 0, 16),
    ]
    channels = graph.groups("channel")[1]
    assert _slices(channels.slices, "model.layers.1.mlp.") == [
        ("gate_proj.weight", 0, 0, 1),
        ("up_proj.weight", 0, 0, 1),
        ("down_proj.weight", 1, 0, 1),
    ]


def test_biases_go_with_their_units_and_are_not_scored() -> None:
    heads = DependencyGraph(tiny_qwen2()).groups("head")[0]  # Qwen2: q/k/v biases, o none
    biases = [(s.parameter, s.width, s.scored) for s in heads.slices if "bias" in s.parameter]
    prefix = "model.layers.0.self_attn."
    assert biases == [
        (prefix + "q_proj.bias", 16, False),
        (prefix + "k_proj.bias", 8, False),
        (prefix + "v_proj.bias", 8, False),
    ]


def test_qwen3_per_head_norms_are_shared_by_all_heads() -> None:
    graph = DependencyGraph(tiny_qwen3())
    in_units = _in_units(graph)
    assert not any("q_norm" in name or "k_norm" in name for name in in_units)
    layer = {s.parameter for s in graph.groups("layer")[0].slices}
    assert "model.layers.0.self_attn.q_norm.weight" in layer


def test_gpt2_heads_are_sections_of_the_fused_projection() -> None:
    heads = DependencyGraph(tiny_gpt2(n_head=4)).groups("head")[0]  # 4 heads of 8, split 32
    prefix = "transformer.h.0.attn."
    assert [(s.parameter.removeprefix(prefix), s.dim, s.offset, s.width) for s in heads.slices] == [
        ("c_attn.weight", 1, 0, 8),
        ("c_attn.bias", 0, 0, 8),
        ("c_attn.weight", 1, 32, 8),
        ("c_attn.bias", 0, 32, 8),
        ("c_attn.weight", 1, 64, 8),
        ("c_attn.bias", 0, 64, 8),
        ("c_proj.weight", 0, 0, 8),
    ]
    channels = DependencyGraph(tiny_gpt2()).groups("channel")[0]
    assert _slices(channels.slices, "transformer.h.0.mlp.") == [
        ("c_fc.weight", 1, 0, 1),
        ("c_proj.weight", 0, 0, 1),
    ]


@pytest.mark.parametrize(
    "build",
    [tiny_llama, tiny_qwen3, tiny_gpt2, tiny_bert, tiny_vit],
    ids=["llama", "qwen3", "gpt2", "bert", "vit"],
)
def test_the_residual_stream_and_the_outputs_are_in_no_unit(build: Callable[[], nn.Module]) -> None:
    model = build()
    graph = DependencyGraph(model)
    blocks = graph.blocks
    assert blocks is not None
    in_units = _in_units(graph)
    outside = [name for name, _ in model.named_parameters() if not name.startswith(blocks.name)]
    assert outside and not in_units & set(outside)  # embeddings, final norm, LM head, classifier
    # within a block only the projections' own rows/columns: no residual-width norm or bias
    for name in in_units:
        assert "norm" not in name.lower()
        assert not name.endswith(("o_proj.bias", "down_proj.bias", "c_proj.bias", "fc2.bias"))
        assert not name.endswith(("output.dense.bias",))


def test_a_model_inside_a_lightning_module_is_found_under_its_wrapper_names() -> None:
    lightning = pytest.importorskip("lightning")

    class Wrapper(lightning.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama()

    wrapped = DependencyGraph(Wrapper())
    plain = DependencyGraph(tiny_llama())
    for kind in ("channel", "head", "layer"):
        assert [
            [(s.parameter.removeprefix("model."), s.dim, s.offset, s.width) for s in g.slices]
            for g in wrapped.groups(kind)
        ] == [
            [(s.parameter, s.dim, s.offset, s.width) for s in g.slices] for g in plain.groups(kind)
        ]
    assert wrapped.groups("head")[0].name == "model.model.layers.0.self_attn"
    assert wrapped.blocks is not None and wrapped.blocks.owner_name == "model"


def test_a_masked_model_is_analysed_under_its_parameters_own_names() -> None:
    model = tiny_llama()
    up = model.model.layers[0].mlp.up_proj
    custom_from_mask(up, "weight", torch.ones_like(up.weight))
    names = DependencyGraph(model).groups("channel")[0].parameters()
    assert "model.layers.0.mlp.up_proj.weight" in names


def test_summary_names_family_and_counts() -> None:
    text = str(DependencyGraph(tiny_bert()))
    assert text.splitlines() == [
        "DependencyGraph of BertForMaskedLM: bert family (BERT, RoBERTa), 2 blocks in "
        "'bert.encoder.layer'",
        "  channel: 2 groups, 128 units",
        "  head: 2 groups, 4 units",
        "  layer: none (the blocks of BertForMaskedLM ('bert.encoder.layer.0', ...) cannot be "
        "removed whole: its LayerNorms follow the residual additions (post-norm), so a block "
        "whose parameters are zero is not the identity)",
    ]
    # layers in the pruner's and the shrink report's words: one layer group, the container
    assert str(DependencyGraph(tiny_gpt2())).splitlines()[-1] == (
        "  layer: 1 group ('transformer.h'), 2 units"
    )
    assert repr(DependencyGraph(tiny_gpt2())) == (
        "DependencyGraph(GPT2LMHeadModel, family='gpt2', channel=256, head=4, layer=2)"
    )


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Expected `kind` to be one of .*but got 'neuron'"):
        DependencyGraph(tiny_llama()).groups("neuron")


def test_gpt2_scaled_by_layer_index_refuses_layers() -> None:
    model = tiny_gpt2()
    for block in model.transformer.h:
        block.attn.scale_attn_by_inverse_layer_idx = True
    graph = DependencyGraph(model)
    assert graph.kinds == ("channel", "head")
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        graph.groups("layer")


def _tiny_falcon() -> nn.Module:
    config = transformers.FalconConfig(
        vocab_size=97, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        new_decoder_architecture=False,
    )  # fmt: skip
    return transformers.FalconForCausalLM(config).eval()


@pytest.mark.parametrize("kind", ["channel", "head", "layer"])
@pytest.mark.parametrize("traced", [False, True], ids=["no-inputs", "example-inputs"])
def test_a_model_of_an_unknown_family_is_refused_naming_its_block_and_what_is_unknown(
    kind: str, traced: bool
) -> None:
    """Falcon's blocks hold a fused ``self_attention.query_key_value`` no family knows: each
    kind is refused naming the structure asked, the block class and that submodule, and the
    refusal suggests single weights, never example_inputs (tracing it fails inside torch.fx)."""
    model = _tiny_falcon()
    graph = DependencyGraph(model, torch.tensor([[1, 2, 3]]) if traced else None)
    if traced and kind == "channel":
        with pytest.raises(UnanalysableError, match=r"FalconDecoderLayer.*tracing failed"):
            graph.groups(kind)
        return
    with pytest.raises(ValueError) as refused:
        graph.groups(kind)
    message = str(refused.value)
    assert message.startswith(f"Expected a model with {kind} units for structure={kind!r}")
    assert "'transformer.h' (FalconDecoderLayer) hold 'self_attention.query_key_value'" in message
    assert message.endswith("prune single weights (structure='element'), which needs no analysis.")
    assert "example_inputs" not in message and "channel analysis" not in message


def test_a_pruner_on_an_unknown_family_refuses_before_any_change() -> None:
    from tensorplay.ao.pruning import Pruner
    from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule

    model = _tiny_falcon()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"head units for structure='head'.*FalconDecoderLayer"):
        Pruner(model, OneShotSchedule(0.5), structure="head", example_inputs=torch.tensor([[1]]))
    check()


def test_a_block_laid_out_like_no_family_names_what_the_closest_one_has() -> None:
    model = tiny_llama()
    for block in model.model.layers:
        del block.self_attn.o_proj
    graph = DependencyGraph(model)
    with pytest.raises(ValueError, match=r"closest, llama .*also has 'self_attn.o_proj'"):
        graph.groups("channel")


def test_a_parameter_the_family_does_not_know_is_named() -> None:
    model = tiny_llama()
    model.model.layers[1].self_attn.sinks = nn.Parameter(torch.zeros(4))  # as gpt-oss has
    with pytest.raises(UnanalysableError, match=r"'model.layers.1.self_attn.sinks' is not"):
        DependencyGraph(model)


def test_a_norm_over_all_heads_refuses_heads_only() -> None:
    model = tiny_qwen3()
    model.model.layers[1].self_attn.q_norm.weight = nn.Parameter(torch.ones(32))
    graph = DependencyGraph(model)
    assert graph.kinds == ("channel", "layer")
    with pytest.raises(
        ValueError,
        match=r"heads of Qwen3ForCausalLM \('model.layers.1', ...\) cannot be removed exactly: "
        r"'model.layers.1.self_attn.q_norm' normalises the queries of all heads together",
    ):
        graph.groups("head")


def test_two_models_in_one_wrapper_are_refused() -> None:
    wrapper = nn.ModuleDict({"student": tiny_llama(), "teacher": tiny_gpt2()})
    with pytest.raises(UnanalysableError, match=r"one Hugging Face model.*'student.model.layers'"):
        DependencyGraph(wrapper)


def test_a_block_unlike_the_first_is_named() -> None:
    model = tiny_llama()
    model.model.layers[2] = copy.deepcopy(tiny_gpt2().transformer.h[0])
    with pytest.raises(UnanalysableError, match=r"'model.layers.2' \(GPT2Block\) is not"):
        DependencyGraph(model)


def test_a_plain_model_is_traced_for_channels_only() -> None:
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 4, 1))
    graph = DependencyGraph(model, example_inputs=torch.randn(2, 3, 8, 8))
    assert graph.family == "traced" and graph.blocks is None
    assert graph.kinds == ("channel",)
    [channels] = graph.groups("channel")
    assert (channels.size, channels.parameters()) == (6, ("0.weight", "0.bias", "1.weight",
                                                          "1.bias", "3.weight"))  # fmt: skip
    for kind in ("head", "layer"):
        with pytest.raises(
            ValueError,
            match=rf"{kind} units for structure='{kind}', but Sequential is not a Hugging",
        ):
            graph.groups(kind)
