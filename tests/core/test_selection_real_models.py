"""Selection on the architectures people prune, built from tiny configs (nothing downloaded).

Hugging Face GPT-2 holds its projections in ``transformers.pytorch_utils.Conv1D`` and ties its
head to the token embedding; BERT ties its MLM decoder to the word embedding; HF ResNet is
convolutions with a linear head; ``nn.TransformerEncoderLayer`` holds its query/key/value
projection as ``nn.MultiheadAttention.in_proj_weight``.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.ao.pruning.targets.parameters import (
    DEFAULT_MODULE_TYPES,
    KEEP_DENSE,
    SelectionWarning,
    select_parameters,
)
from tests.hf_models import tiny_bert, tiny_gpt2
from tests.model_state import unchanged

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _quiet_transformers() -> Iterator[None]:
    # Tiny vocabularies make transformers log about GPT-2's bos/eos ids; not our concern here.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    yield
    transformers.logging.set_verbosity(verbosity)


def gpt2() -> nn.Module:
    return tiny_gpt2()


def bert() -> nn.Module:
    return tiny_bert()


def resnet() -> nn.Module:
    config = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic", num_labels=3
    )
    return transformers.ResNetForImageClassification(config)


def digits_mlp() -> nn.Module:
    """The MLP of examples/models.py (64-256-256-10)."""
    return nn.Sequential(
        OrderedDict(
            fc1=nn.Linear(64, 256),
            act1=nn.ReLU(),
            fc2=nn.Linear(256, 256),
            act2=nn.ReLU(),
            fc3=nn.Linear(256, 10),
        )
    )


def plain_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(32 * 16, 10),
    )


GPT2_BLOCKS = [
    f"transformer.h.{layer}.{proj}.weight"
    for layer in range(2)
    for proj in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
]
BERT_ENCODER = [
    f"bert.encoder.layer.{layer}.{proj}.weight"
    for layer in range(2)
    for proj in (
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "intermediate.dense",
        "output.dense",
    )
]
RESNET_CONVS = [
    "resnet.embedder.embedder.convolution.weight",
    "resnet.encoder.stages.0.layers.0.layer.0.convolution.weight",
    "resnet.encoder.stages.0.layers.0.layer.1.convolution.weight",
    "resnet.encoder.stages.1.layers.0.shortcut.convolution.weight",
    "resnet.encoder.stages.1.layers.0.layer.0.convolution.weight",
    "resnet.encoder.stages.1.layers.0.layer.1.convolution.weight",
]


# -- GPT-2 --------------------------------------------------------------------------------


def test_gpt2_default_selects_every_conv1d_projection_and_the_tied_head_once() -> None:
    model = gpt2()
    assert type(model.transformer.h[0].attn.c_attn).__name__ == "Conv1D"
    assert model.lm_head.weight is model.transformer.wte.weight

    assert select_parameters(model) == [*GPT2_BLOCKS, "lm_head.weight"]


@pytest.mark.parametrize(
    ("keep_dense", "expected"),
    [
        pytest.param(["embeddings"], GPT2_BLOCKS, id="embeddings-drops-the-tied-head"),
        pytest.param(["last"], GPT2_BLOCKS, id="last-is-the-head"),
        pytest.param(["embeddings", "last"], GPT2_BLOCKS, id="both-drop-only-the-head"),
        pytest.param(["first"], [*GPT2_BLOCKS[1:], "lm_head.weight"], id="first"),
        pytest.param(["first", "last"], GPT2_BLOCKS[1:], id="first-and-last"),
    ],
)
def test_gpt2_keep_dense(keep_dense: list[str], expected: list[str]) -> None:
    assert select_parameters(gpt2(), keep_dense=keep_dense) == expected  # type: ignore[arg-type]


def test_gpt2_weights_and_biases_by_name() -> None:
    expected = [
        f"transformer.h.{layer}.{proj}.{name}"
        for layer in range(2)
        for proj in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
        for name in ("weight", "bias")
    ]
    names = select_parameters(gpt2(), names=["weight", "bias"])
    assert names == [*expected, "lm_head.weight"]  # the head has no bias


def test_gpt2_embeddings_selected_by_type_are_dropped_with_their_tied_head() -> None:
    model = gpt2()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SelectionWarning)  # only embeddings: it warns, see below
        assert select_parameters(model, module_types=["Embedding"]) == [
            "transformer.wte.weight",
            "transformer.wpe.weight",
        ]
    assert select_parameters(model, module_types=["Embedding", "Conv1D", "Linear"]) == [
        "transformer.wte.weight",
        "transformer.wpe.weight",
        *GPT2_BLOCKS,
    ]
    # "first" is wte, "last" is lm_head: both reach the same tensor.
    assert select_parameters(
        model, module_types=["Embedding", "Conv1D", "Linear"], keep_dense=["last"]
    ) == ["transformer.wpe.weight", *GPT2_BLOCKS]
    assert (
        select_parameters(
            model, module_types=["Embedding", "Conv1D", "Linear"], keep_dense=["embeddings"]
        )
        == GPT2_BLOCKS
    )


def test_pruner_prunes_every_gpt2_projection() -> None:
    model = gpt2()
    pruner = Pruner(model, OneShotSchedule(0.5), keep_dense=["embeddings"])
    assert pruner.targets == GPT2_BLOCKS
    pruner.step()
    assert pruner.pruned_count() == 24576 // 2
    for name in GPT2_BLOCKS:
        module = model.get_submodule(name.rpartition(".")[0])
        assert hasattr(module, "weight_mask"), name


def test_pruner_selects_by_names_and_keep_dense() -> None:
    model = digits_mlp()
    pruner = Pruner(model, OneShotSchedule(0.5), names=["weight", "bias"], keep_dense=["last"])
    assert pruner.targets == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    pruner = Pruner(digits_mlp(), OneShotSchedule(0.5), module_types=["Linear"], include=["fc3"])
    assert pruner.targets == ["fc3.weight"]


@pytest.mark.parametrize(
    ("kwargs", "listed"),
    [
        pytest.param({"names": ["weight"]}, r"names=\['weight'\]", id="names"),
        pytest.param({"module_types": ["Linear"]}, r"module_types=\['Linear'\]", id="types"),
        pytest.param({"include": ["fc"]}, r"include=\['fc'\]", id="include"),
        pytest.param({"exclude": ["fc"]}, r"exclude=\['fc'\]", id="exclude"),
        pytest.param({"keep_dense": ["last"]}, r"keep_dense=\['last'\]", id="keep-dense"),
    ],
)
def test_pruner_refuses_parameters_with_a_selection_filter(kwargs, listed: str) -> None:
    model = digits_mlp()
    check = unchanged(model)
    with pytest.raises(
        ValueError,
        match=r"Expected either `parameters` or the selection filters \(`module_types`, `names`, "
        r"`include`, `exclude`, `keep_dense`\), but got parameters=\['fc1.weight'\] with " + listed,
    ):
        Pruner(model, OneShotSchedule(0.5), parameters=["fc1.weight"], **kwargs)
    check()


# -- BERT, ResNet, torch's transformer layer ------------------------------------------------


def test_bert_default_and_keep_dense() -> None:
    model = bert()
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    head = ["cls.predictions.transform.dense.weight", "cls.predictions.decoder.weight"]

    assert select_parameters(model) == [*BERT_ENCODER, *head]
    assert select_parameters(model, keep_dense=["embeddings"]) == [*BERT_ENCODER, head[0]]
    assert select_parameters(model, keep_dense=["last"]) == [*BERT_ENCODER, head[0]]
    assert select_parameters(model, keep_dense=["first"]) == [*BERT_ENCODER[1:], *head]


def test_hf_resnet_default_and_keep_dense() -> None:
    model = resnet()
    assert select_parameters(model) == [*RESNET_CONVS, "classifier.1.weight"]
    assert select_parameters(model, keep_dense=["first", "last"]) == RESNET_CONVS[1:]
    assert select_parameters(model, keep_dense=["embeddings"]) == [
        *RESNET_CONVS,
        "classifier.1.weight",
    ]


def test_transformer_encoder_layer_prunes_the_attention_input_projection() -> None:
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    assert select_parameters(layer) == [
        "self_attn.in_proj_weight",
        "self_attn.out_proj.weight",
        "linear1.weight",
        "linear2.weight",
    ]
    # `names` are names: asking for weight and bias leaves in_proj_weight out.
    assert select_parameters(layer, names=["weight", "bias", "in_proj_weight", "in_proj_bias"]) == [
        "self_attn.in_proj_weight",
        "self_attn.in_proj_bias",
        "self_attn.out_proj.weight",
        "self_attn.out_proj.bias",
        "linear1.weight",
        "linear1.bias",
        "linear2.weight",
        "linear2.bias",
    ]


def test_pruned_attention_projection_runs_forward_and_backward() -> None:
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    pruner = Pruner(layer, OneShotSchedule(0.5))
    pruner.step()
    mask = layer.self_attn.in_proj_weight_mask
    assert int((mask == 0).sum()) > 0
    out = layer(torch.randn(2, 3, 16))
    out.sum().backward()
    grad = layer.self_attn.in_proj_weight_orig.grad
    assert grad is not None and bool((grad[mask == 0] == 0).all())


# -- the default module types, one by one ----------------------------------------------------


class Conv1D(nn.Module):
    """Stands for transformers.pytorch_utils.Conv1D: matched by class name, weight (in, out)."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))


def _lazy_linear() -> nn.Module:
    module = nn.LazyLinear(3)
    module(torch.zeros(1, 4))  # initialized, it becomes an nn.Linear
    return module


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        pytest.param(lambda: nn.Linear(4, 3), ["weight"], id="Linear"),
        pytest.param(
            lambda: nn.modules.linear.NonDynamicallyQuantizableLinear(4, 3),
            ["weight"],
            id="NonDynamicallyQuantizableLinear",
        ),
        pytest.param(_lazy_linear, ["weight"], id="LazyLinear"),
        pytest.param(lambda: nn.Bilinear(3, 4, 2), ["weight"], id="Bilinear"),
        pytest.param(lambda: nn.Conv1d(2, 3, 3), ["weight"], id="Conv1d"),
        pytest.param(lambda: nn.Conv2d(2, 3, 3), ["weight"], id="Conv2d"),
        pytest.param(lambda: nn.Conv3d(2, 3, 3), ["weight"], id="Conv3d"),
        pytest.param(lambda: nn.ConvTranspose1d(2, 3, 3), ["weight"], id="ConvTranspose1d"),
        pytest.param(lambda: nn.ConvTranspose2d(2, 3, 3), ["weight"], id="ConvTranspose2d"),
        pytest.param(lambda: nn.ConvTranspose3d(2, 3, 3), ["weight"], id="ConvTranspose3d"),
        pytest.param(lambda: Conv1D(3, 4), ["weight"], id="hf-Conv1D-by-name"),
        pytest.param(lambda: transformers.pytorch_utils.Conv1D(3, 4), ["weight"], id="hf-Conv1D"),
        pytest.param(
            lambda: nn.MultiheadAttention(8, 2),
            ["in_proj_weight", "out_proj.weight"],
            id="MultiheadAttention",
        ),
        pytest.param(
            lambda: nn.MultiheadAttention(8, 2, kdim=4, vdim=6),
            ["q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj.weight"],
            id="MultiheadAttention-kdim-vdim",
        ),
    ],
)
def test_default_module_types(build, expected: list[str]) -> None:
    assert select_parameters(build()) == expected


def test_default_module_types_list() -> None:
    names = [getattr(entry, "__name__", entry) for entry in DEFAULT_MODULE_TYPES]
    assert names == [
        "Linear",
        "Bilinear",
        "Conv1d",
        "Conv2d",
        "Conv3d",
        "ConvTranspose1d",
        "ConvTranspose2d",
        "ConvTranspose3d",
        "MultiheadAttention",
        "Conv1D",
    ]


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: nn.Embedding(10, 4), id="Embedding"),
        pytest.param(lambda: nn.LayerNorm(4), id="LayerNorm"),
        pytest.param(lambda: nn.BatchNorm2d(4), id="BatchNorm2d"),
        pytest.param(lambda: nn.LSTM(4, 4), id="LSTM"),
    ],
)
def test_not_in_the_default(build) -> None:
    with pytest.raises(ValueError, match="none matched"):
        select_parameters(nn.Sequential(build()))


def test_uninitialized_lazy_module_is_an_error() -> None:
    with pytest.raises(
        ValueError,
        match=r"Expected initialized parameters, but \(LazyLinear, 'weight'\) at '0.weight' is "
        r"uninitialized",
    ):
        select_parameters(nn.Sequential(nn.LazyLinear(3)))


# -- keep_dense on plain models ----------------------------------------------------------------


def test_keep_dense_first_and_last_follow_registration_order() -> None:
    model = digits_mlp()
    assert select_parameters(model, keep_dense=["first"]) == ["fc2.weight", "fc3.weight"]
    assert select_parameters(model, keep_dense=["last"]) == ["fc1.weight", "fc2.weight"]
    assert select_parameters(model, keep_dense="last") == ["fc1.weight", "fc2.weight"]
    assert select_parameters(model, keep_dense=["first", "last"]) == ["fc2.weight"]
    # Every entry is judged on the candidates, which `include`/`exclude` have already filtered.
    assert select_parameters(model, exclude=["fc3"], keep_dense=["last"]) == ["fc1.weight"]
    # With biases, a module's weight and bias are dropped together.
    assert select_parameters(model, names=["weight", "bias"], keep_dense=["first"]) == [
        "fc2.weight",
        "fc2.bias",
        "fc3.weight",
        "fc3.bias",
    ]


def test_keep_dense_embeddings_covers_embedding_bag_and_ties() -> None:
    model = nn.ModuleDict(
        {"bag": nn.EmbeddingBag(10, 4), "proj": nn.Linear(4, 4), "head": nn.Linear(4, 10)}
    )
    model["head"].weight = model["bag"].weight  # (10, 4): tied to the bag
    names = ["weight"]
    types = ["EmbeddingBag", "Linear"]
    assert select_parameters(model, module_types=types, names=names) == [
        "bag.weight",
        "proj.weight",
    ]
    assert select_parameters(model, module_types=types, names=names, keep_dense=["embeddings"]) == [
        "proj.weight"
    ]
    assert select_parameters(model, keep_dense=["embeddings"]) == ["proj.weight"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        pytest.param(
            {"keep_dense": ["head"]},
            ValueError,
            r"Expected `keep_dense` to hold entries of \('embeddings', 'first', 'last'\), but got "
            r"'head'\.",
            id="unknown-entry",
        ),
        pytest.param({"keep_dense": [None]}, ValueError, "but got None", id="non-string-entry"),
        pytest.param(
            {"keep_dense": 3}, TypeError, "Expected `keep_dense` to be a sequence", id="not-a-list"
        ),
        pytest.param(
            {"keep_dense": ["first", "last"], "exclude": ["fc2"]},
            ValueError,
            r"none matched .*exclude=\['fc2'\], keep_dense=\['first', 'last'\]",
            id="keep-dense-drops-everything",
        ),
        pytest.param(
            {"names": []},
            ValueError,
            "Expected `names` to hold at least one parameter name, but got none.",
            id="names-empty",
        ),
        pytest.param(
            {"names": ["weight", 3]},
            TypeError,
            "Expected `names` to hold parameter names, but got 3.",
            id="names-non-string",
        ),
        pytest.param(
            {"names": ["fc1.weight"]},
            TypeError,
            "Expected `names` to hold parameter names, but got 'fc1.weight'.",
            id="names-qualified",
        ),
    ],
)
def test_selection_argument_errors(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        select_parameters(digits_mlp(), **kwargs)


def test_keep_dense_values_are_the_documented_ones() -> None:
    assert KEEP_DENSE == ("embeddings", "first", "last")


# -- the warning ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(digits_mlp, id="digits-mlp"),
        pytest.param(plain_cnn, id="cnn"),
        pytest.param(gpt2, id="gpt2"),
        pytest.param(bert, id="bert"),
        pytest.param(lambda: transformers.BertModel(bert().config), id="bert-no-head"),
        pytest.param(resnet, id="hf-resnet"),
        pytest.param(lambda: nn.TransformerEncoderLayer(16, 2, 32), id="transformer-layer"),
    ],
)
@pytest.mark.parametrize("keep_dense", [[], ["embeddings", "first", "last"]], ids=["all", "kept"])
def test_no_warning_on_normal_models(build, keep_dense: list[str]) -> None:
    model = build()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        select_parameters(model, keep_dense=keep_dense)  # type: ignore[arg-type]
        Pruner(model, OneShotSchedule(0.5), keep_dense=keep_dense)  # type: ignore[arg-type]


def test_warning_when_only_the_tied_head_is_selected() -> None:
    # The default before Conv1D was recognised: nothing but GPT-2's head.
    with pytest.warns(SelectionWarning) as record:
        names = select_parameters(gpt2(), module_types=[nn.Linear, nn.Conv1d])
    assert names == ["lm_head.weight"]
    assert len(record) == 1
    assert str(record[0].message).startswith(
        "The selection looks incomplete: it holds 3,104 of the model's 29,728 floating-point "
        "parameters in tensors of 2 or more dimensions (10.4%), all of it embedding weights or "
        "tied to them, while `module_types`/`names` leave out Conv1D: 8 tensors, 24,576 "
        "parameters (add 'Conv1D' to `module_types`)."
    )
    assert record[0].filename == __file__  # points at the caller


def test_warning_when_only_embeddings_are_selected() -> None:
    with pytest.warns(SelectionWarning, match="all of it embedding weights") as record:
        select_parameters(bert(), module_types=["Embedding"])
    message = str(record[0].message)
    assert "Linear: 13 tensors" in message and "(add 'Linear' to `module_types`)" in message


def test_warning_on_low_coverage_names_the_class_and_the_names() -> None:
    model = nn.Sequential(nn.LSTM(8, 64), nn.Linear(64, 2))
    with pytest.warns(
        SelectionWarning,
        match=r"it holds 128 of the model's 18,560 .* \(0\.7%\), while `module_types`/`names` "
        r"leave out LSTM: 2 tensors, 18,432 parameters \(add 'LSTM' to `module_types` and add "
        r"'weight_ih_l0', 'weight_hh_l0' to `names`\)",
    ):
        assert select_parameters(model) == ["1.weight"]


def test_biases_alone_are_not_called_embeddings() -> None:
    with pytest.warns(SelectionWarning) as record:
        select_parameters(digits_mlp(), names=["bias"])
    message = str(record[0].message)
    assert "it holds 0 of the model's 84,480" in message
    assert "embedding" not in message
    assert "Linear: 3 tensors, 84,480 parameters (add 'weight' to `names`)" in message


def test_warning_from_the_pruner_points_at_the_users_call() -> None:
    with pytest.warns(SelectionWarning, match="Conv2d: 2 tensors") as record:
        Pruner(plain_cnn(), OneShotSchedule(0.5), module_types=["BatchNorm2d"])
    assert record[0].filename == __file__


def test_no_warning_for_what_the_user_left_out_on_purpose() -> None:
    model = plain_cnn()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Convolutions left out by a regex or by keep_dense are deliberate, not overlooked.
        assert select_parameters(model, include=["^8\\."]) == ["8.weight"]
        Pruner(model, OneShotSchedule(0.5), parameters=["8.weight"])
