"""Selecting parameters, resolving names to (module, name) pairs and methods by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.methods import (
    L1Unstructured,
    RandomUnstructured,
    l1_unstructured,
)
from tensorplay.ao.pruning.targets.parameters import (
    method_name,
    resolve_method,
    resolve_parameters,
    select_parameters,
)


class MyLinear(nn.Linear):
    """A subclass: selected by the class name of its base too."""


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.conv1 = nn.Conv1d(4, 4, 3)
        self.conv2 = nn.Conv2d(1, 2, 3)
        self.conv3 = nn.Conv3d(1, 2, 3)
        self.norm = nn.BatchNorm1d(4)
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), MyLinear(8, 4, bias=False))
        self.head = nn.Linear(4, 2)


class HalfMagnitude(BasePruningMethod):
    """A custom unstructured method reached through its import path."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: int | float) -> None:
        self.amount = amount

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        return default_mask


# -- select_parameters -----------------------------------------------------------------------


def test_default_selects_weights_of_linear_and_conv_in_module_order() -> None:
    assert select_parameters(Net()) == [
        "conv1.weight",
        "conv2.weight",
        "conv3.weight",
        "encoder.0.weight",
        "encoder.2.weight",
        "head.weight",
    ]


def test_names_select_several_parameters_per_module_and_skip_missing() -> None:
    names = select_parameters(Net(), module_types=[nn.Linear], names=("weight", "bias"))
    assert names == [
        "encoder.0.weight",
        "encoder.0.bias",
        "encoder.2.weight",  # no bias
        "head.weight",
        "head.bias",
    ]


def test_module_types_by_class_name_matches_subclasses() -> None:
    assert select_parameters(Net(), module_types=["Linear"]) == [
        "encoder.0.weight",
        "encoder.2.weight",
        "head.weight",
    ]
    assert select_parameters(Net(), module_types=["MyLinear", "Embedding"]) == [
        "embed.weight",
        "encoder.2.weight",
    ]


def test_module_types_by_import_path() -> None:
    assert select_parameters(Net(), module_types=["torch.nn.Conv2d"]) == ["conv2.weight"]
    assert select_parameters(Net(), module_types=[f"{__name__}.MyLinear"]) == ["encoder.2.weight"]


def test_include_and_exclude_use_re_search_on_the_full_name() -> None:
    model = Net()
    assert select_parameters(model, include=[r"^encoder\."]) == [
        "encoder.0.weight",
        "encoder.2.weight",
    ]
    assert select_parameters(model, exclude=["conv", r"head"]) == [
        "encoder.0.weight",
        "encoder.2.weight",
    ]
    assert select_parameters(model, include=["conv"], exclude=["conv2"]) == [
        "conv1.weight",
        "conv3.weight",
    ]
    assert select_parameters(model, include="head") == ["head.weight"]


def test_root_module_parameters_have_bare_names() -> None:
    assert select_parameters(nn.Linear(2, 2), names=["weight", "bias"]) == ["weight", "bias"]


def test_pruned_tensors_are_found_under_their_own_name() -> None:
    model = Net()
    l1_unstructured(model.head, "weight", amount=3)
    l1_unstructured(model.head, "bias", amount=1)
    assert "head.weight_orig" in dict(model.named_parameters())
    assert select_parameters(model, include=["head"], names=["weight", "bias"]) == [
        "head.weight",
        "head.bias",
    ]


def test_tied_parameters_are_listed_once() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    assert select_parameters(model) == ["0.weight"]


def test_empty_selection_names_the_filters() -> None:
    with pytest.raises(
        ValueError,
        match=r"none matched module_types=\['Linear'\], names=\['weight'\], include=\['nothing'\]",
    ):
        select_parameters(Net(), module_types=[nn.Linear], names=["weight"], include=["nothing"])
    with pytest.raises(ValueError, match="Expected the selection to match at least one parameter"):
        select_parameters(nn.Sequential(nn.ReLU()))


def test_invalid_regex() -> None:
    with pytest.raises(ValueError, match=r"Expected `exclude` to hold valid regexes, but got '\('"):
        select_parameters(Net(), exclude=["("])


def test_non_string_regex() -> None:
    with pytest.raises(TypeError, match="Expected `include` to hold regex strings, but got 3"):
        select_parameters(Net(), include=[3])  # type: ignore[list-item]


def test_bad_module_type_entries() -> None:
    with pytest.raises(TypeError, match=r"Expected `module_types` to hold nn\.Module subclasses"):
        select_parameters(Net(), module_types=[int])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"Expected `module_types` to hold nn\.Module subclasses"):
        select_parameters(Net(), module_types=["not a name"])
    with pytest.raises(ValueError, match="Expected an import path"):
        select_parameters(Net(), module_types=["no_such_pkg.Linear"])
    with pytest.raises(TypeError, match="Expected `module_types` to be a sequence"):
        select_parameters(Net(), module_types=3)  # type: ignore[arg-type]


# -- resolve_parameters ----------------------------------------------------------------------


def test_resolve_parameters_returns_module_objects() -> None:
    model = Net()
    pairs = resolve_parameters(model, ["encoder.2.weight", "head.bias"])
    assert len(pairs) == 2
    assert pairs[0][0] is model.encoder[2] and pairs[0][1] == "weight"
    assert pairs[1][0] is model.head and pairs[1][1] == "bias"


def test_resolve_parameters_finds_pruned_tensors() -> None:
    model = Net()
    l1_unstructured(model.head, "weight", amount=2)
    [(module, name)] = resolve_parameters(model, ["head.weight"])
    assert module is model.head and name == "weight"


@pytest.mark.parametrize(
    ("names", "match"),
    [
        pytest.param(
            ["encoder.5.weight"],
            r"Expected 'encoder.5.weight' to name a parameter, but the model has no module "
            r"'encoder.5'.",
            id="missing-module",
        ),
        pytest.param(
            ["encoder.2.bias"],
            r"but \(MyLinear, 'bias'\) is not a parameter of module 'encoder.2'",
            id="missing-parameter",
        ),
        pytest.param(
            ["norm.running_mean"],
            r"\(BatchNorm1d, 'running_mean'\) is not a parameter",
            id="buffer",
        ),
        pytest.param(
            ["head.weight", "head.weight"],
            "Expected `names` to be unique, but 'head.weight' is repeated.",
            id="repeated",
        ),
        pytest.param([], "Expected `names` to name at least one parameter", id="empty"),
    ],
)
def test_resolve_parameters_errors(names: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_parameters(Net(), names)


def test_resolve_parameters_rejects_non_string() -> None:
    with pytest.raises(TypeError, match="Expected `names` to hold str, but got 3"):
        resolve_parameters(Net(), [3])  # type: ignore[list-item]


# -- resolve_method --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        pytest.param("l1_unstructured", L1Unstructured, id="snake"),
        pytest.param("random_unstructured", RandomUnstructured, id="snake-random"),
        pytest.param("L1Unstructured", L1Unstructured, id="class-name"),
        pytest.param(L1Unstructured, L1Unstructured, id="class"),
        pytest.param(
            "tensorplay.ao.pruning.parity.methods.RandomUnstructured", RandomUnstructured, id="path"
        ),
        pytest.param(f"{__name__}.HalfMagnitude", HalfMagnitude, id="user-path"),
    ],
)
def test_resolve_method(method: object, expected: type[BasePruningMethod]) -> None:
    assert resolve_method(method) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("method", "match"),
    [
        pytest.param(
            "ln_structured",
            r"Expected `method` to be an unstructured pruning method, but got 'ln_structured' "
            r"\(PRUNING_TYPE 'structured'\)",
            id="structured",
        ),
        pytest.param("RandomStructured", "PRUNING_TYPE 'structured'", id="structured-class"),
        pytest.param("custom_from_mask", "PRUNING_TYPE 'global'", id="global"),
        pytest.param(
            "l2_unstructured",
            r"Expected `method` to be one of \['identity', 'l1_unstructured', "
            r"'random_unstructured'\], a class name or an import path, but got 'l2_unstructured'",
            id="unknown",
        ),
    ],
)
def test_resolve_method_value_errors(method: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_method(method)


def test_resolve_method_rejects_non_methods() -> None:
    with pytest.raises(TypeError, match="Expected `method` to name a BasePruningMethod subclass"):
        resolve_method("torch.nn.Linear")
    with pytest.raises(TypeError, match="Expected `method` to name a BasePruningMethod subclass"):
        resolve_method(nn.Linear)  # type: ignore[arg-type]


def test_method_name_round_trips() -> None:
    assert method_name(L1Unstructured) == "l1_unstructured"
    assert method_name(HalfMagnitude) == f"{__name__}.HalfMagnitude"
    for cls in (L1Unstructured, RandomUnstructured, HalfMagnitude):
        assert resolve_method(method_name(cls)) is cls
