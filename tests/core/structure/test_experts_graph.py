"""The experts of the mixture-of-experts families in the dependency graph."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import DependencyGraph
from tensorplay.ao.pruning.structured.dependency.families import UnanalysableError
from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
from tests.moe_models import (
    EXPERTS,
    TOP_K,
    tiny_mixtral,
    tiny_olmoe,
    tiny_qwen2_moe,
    tiny_qwen3_moe,
)

Build = Callable[..., nn.Module]

# Channels: 2 layers x 8 experts x 16 routed channels, and Qwen2-MoE's 2 x 24 shared ones.
MOE = [
    pytest.param(
        tiny_qwen2_moe, {"channel": 304, "head": 4, "layer": 2, "expert": 16}, id="qwen2_moe"
    ),
    pytest.param(
        tiny_qwen3_moe, {"channel": 256, "head": 4, "layer": 2, "expert": 16}, id="qwen3_moe"
    ),
    pytest.param(tiny_mixtral, {"channel": 256, "head": 4, "layer": 2, "expert": 16}, id="mixtral"),
    pytest.param(tiny_olmoe, {"channel": 256, "layer": 2, "expert": 16}, id="olmoe"),
]


@pytest.mark.parametrize(("build", "counts"), MOE)
def test_each_moe_family_has_one_expert_group_per_layer(
    build: Build, counts: dict[str, int]
) -> None:
    model = build()
    graph = DependencyGraph(model)
    assert graph.family == "moe"
    assert graph.counts() == counts
    experts = graph.groups("expert")
    assert [group.name for group in experts] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    for index, group in enumerate(experts):
        mlp = f"model.layers.{index}.mlp"
        assert (group.kind, group.size, group.min_kept) == ("expert", EXPERTS, TOP_K)
        assert group.slices == (
            Slice(f"{mlp}.experts.gate_up_proj", 0),
            Slice(f"{mlp}.experts.down_proj", 0),
            Slice(f"{mlp}.gate.weight", 0, scored=False),
        )


def test_the_shared_expert_is_channels_never_an_expert() -> None:
    graph = DependencyGraph(tiny_qwen2_moe())
    channels = graph.groups("channel")[0]
    assert (channels.name, channels.size) == ("model.layers.0.mlp.shared_expert", 24)
    assert channels.parameters() == (
        "model.layers.0.mlp.shared_expert.gate_proj.weight",
        "model.layers.0.mlp.shared_expert.up_proj.weight",
        "model.layers.0.mlp.shared_expert.down_proj.weight",
    )
    spanned = {name for group in graph.groups("expert") for name in group.parameters()}
    assert not any("shared_expert" in name for name in spanned)


def test_olmoe_heads_are_refused_its_norms_mix_them() -> None:
    graph = DependencyGraph(tiny_olmoe())
    with pytest.raises(
        ValueError,
        match=r"head units for structure='head', but the heads of OlmoeForCausalLM .*q_norm",
    ):
        graph.groups("head")


def test_dense_families_have_no_expert_kind() -> None:
    from tests.hf_models import tiny_llama

    graph = DependencyGraph(tiny_llama())
    assert graph.kinds == ("channel", "head", "layer")
    with pytest.raises(
        ValueError, match=r"expert units for structure='expert', but the llama blocks"
    ):
        graph.groups("expert")


def test_a_mixture_of_dense_and_sparse_blocks_is_refused() -> None:
    model = tiny_qwen2_moe(mlp_only_layers=[1])
    with pytest.raises(
        UnanalysableError, match=r"'model.layers.1' \(Qwen2MoeDecoderLayer\) is not"
    ):
        DependencyGraph(model)


def test_expert_slices_zeroed_remove_the_expert_from_every_tensor() -> None:
    model = tiny_mixtral()
    group = DependencyGraph(model).groups("expert")[1]
    with torch.no_grad():
        for piece in group.slices:
            model.get_parameter(piece.parameter)[3] = 0
    experts = model.model.layers[1].mlp.experts
    assert experts.gate_up_proj[3].count_nonzero() == 0
    assert experts.gate_up_proj[2].count_nonzero() > 0
    assert model.model.layers[1].mlp.gate.weight[3].count_nonzero() == 0


def _gpt_oss() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.GptOssConfig(
        vocab_size=97, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
        num_experts_per_tok=2,
    )  # fmt: skip
    return transformers.GptOssForCausalLM(config)


def _deepseek_v3() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.DeepseekV3Config(
        vocab_size=97, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=0,
        q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
    )  # fmt: skip
    return transformers.DeepseekV3ForCausalLM(config)


@pytest.mark.parametrize(
    ("build", "name"),
    [(_gpt_oss, "GptOssForCausalLM"), (_deepseek_v3, "DeepseekV3ForCausalLM")],
    ids=["gpt_oss", "deepseek_v3"],
)
def test_routers_of_other_kinds_are_refused(build: Build, name: str) -> None:
    """gpt-oss takes the softmax after the top-k, DeepSeek-V3 a grouped sigmoid: no family."""
    graph = DependencyGraph(build())
    with pytest.raises(
        ValueError, match=rf"structure='expert', but {name} is a .* no known family"
    ):
        graph.groups("expert")
