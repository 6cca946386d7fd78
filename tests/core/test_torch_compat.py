"""Code written against ``torch.nn.utils.prune`` works unchanged on ``tensorplay.ao.pruning``.

torch's own pruning tests, ported and run against both libraries (so each test is shown to hold
for torch too), plus the private names and ``unittest.mock`` patching that torch code relies on.
"""

from __future__ import annotations

import pickle
import unittest.mock as mock
from copy import deepcopy
from types import ModuleType

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

import tensorplay.ao.pruning as tp_prune
from tests.core.parity import seed_cpu
from tests.model_state import unchanged

BOTH = pytest.mark.parametrize("lib", [tp_prune, torch_prune], ids=["tensorplay", "torch"])
LINEAR_AND_CONV3D = pytest.mark.parametrize(
    "make", [lambda: nn.Linear(5, 7), lambda: nn.Conv3d(2, 2, 2)], ids=["linear", "conv3d"]
)
NAMES = pytest.mark.parametrize("name", ["weight", "bias"])


def test_public_names_match_torch() -> None:
    ours = set(tp_prune.__all__)
    theirs = {
        "BasePruningMethod",
        "PruningContainer",
        "Identity",
        "RandomUnstructured",
        "L1Unstructured",
        "RandomStructured",
        "LnStructured",
        "CustomFromMask",
        "identity",
        "random_unstructured",
        "l1_unstructured",
        "random_structured",
        "ln_structured",
        "global_unstructured",
        "custom_from_mask",
        "remove",
        "is_pruned",
        "_validate_pruning_amount_init",
        "_validate_pruning_amount",
        "_compute_nparams_toprune",
    }
    assert theirs <= ours
    for name in theirs:
        assert hasattr(torch_prune, name), name


@pytest.mark.parametrize(
    "name",
    [
        "identity",
        "random_unstructured",
        "l1_unstructured",
        "random_structured",
        "ln_structured",
        "custom_from_mask",
        "remove",
        "is_pruned",
    ],
)
def test_signatures_match_torch(name: str) -> None:
    import inspect

    ours = inspect.signature(getattr(tp_prune, name))
    theirs = inspect.signature(getattr(torch_prune, name))
    assert list(ours.parameters) == list(theirs.parameters)
    for key, parameter in ours.parameters.items():
        assert parameter.default == theirs.parameters[key].default, key
        assert parameter.kind == theirs.parameters[key].kind, key


@pytest.mark.parametrize(
    "cls",
    ["Identity", "RandomUnstructured", "L1Unstructured", "RandomStructured", "LnStructured"],
)
def test_class_signatures_match_torch(cls: str) -> None:
    import inspect

    for attr in ("__init__", "apply"):
        ours = inspect.signature(getattr(getattr(tp_prune, cls), attr))
        theirs = inspect.signature(getattr(getattr(torch_prune, cls), attr))
        assert list(ours.parameters) == list(theirs.parameters), attr
        for key, parameter in ours.parameters.items():
            assert parameter.default == theirs.parameters[key].default, (attr, key)
    assert getattr(tp_prune, cls).PRUNING_TYPE == getattr(torch_prune, cls).PRUNING_TYPE


# --- unittest.mock reaches the functional forms -------------------------------------------------


def test_patched_compute_mask_is_what_l1_unstructured_uses() -> None:
    module = nn.Linear(5, 2)
    mask = torch.zeros_like(module.weight)
    mask[1, 0] = mask[0, 3] = 1
    with mock.patch.object(tp_prune.L1Unstructured, "compute_mask", return_value=mask) as patched:
        tp_prune.l1_unstructured(module, "weight", amount=0.9)  # the amount is ignored
    patched.assert_called_once()
    assert torch.equal(module.weight_mask, mask)
    y = module(torch.ones(1, 5))
    assert torch.equal(y[0, 0], module.weight_orig[0, 3] + module.bias[0])
    assert torch.equal(y[0, 1], module.weight_orig[1, 0] + module.bias[1])


def test_patch_by_dotted_path_as_torch_tests_do() -> None:
    module = nn.Linear(5, 2)
    with mock.patch("tensorplay.ao.pruning.RandomUnstructured.compute_mask") as compute_mask:
        compute_mask.return_value = torch.ones_like(module.weight)
        tp_prune.random_unstructured(module, name="weight", amount=0.9)
    assert torch.equal(module.weight_mask, torch.ones(2, 5))


@LINEAR_AND_CONV3D
@NAMES
def test_patched_failure_rolls_back(make: type[nn.Module], name: str) -> None:
    """torch's test_pruning_rollback, with the stronger 'exactly unchanged' check."""
    module = make()
    check = unchanged(module)
    with mock.patch.object(tp_prune.L1Unstructured, "compute_mask") as compute_mask:
        compute_mask.side_effect = Exception("HA!")
        with pytest.raises(Exception, match="HA!"):
            tp_prune.l1_unstructured(module, name=name, amount=0.9)
    check()


def test_patched_failure_on_second_pruning_keeps_the_first() -> None:
    module = tp_prune.l1_unstructured(nn.Linear(5, 2), "weight", amount=3)
    check = unchanged(module)
    failing = mock.patch.object(tp_prune.LnStructured, "compute_mask", side_effect=Exception("HA!"))
    with failing, pytest.raises(Exception, match="HA!"):
        tp_prune.ln_structured(module, "weight", amount=1, n=2, dim=0)
    check()


# --- torch's tests, run on both libraries -------------------------------------------------------


@BOTH
@LINEAR_AND_CONV3D
@NAMES
def test_random_pruning_reparametrizes(lib: ModuleType, make: type[nn.Module], name: str) -> None:
    module = make()
    original = getattr(module, name)
    lib.random_unstructured(module, name=name, amount=0.1)
    for suffix in ("_mask", "_orig", ""):
        assert getattr(module, name + suffix).shape == original.shape
    assert getattr(module, name + "_orig") is original
    expected = original * getattr(module, name + "_mask").to(dtype=original.dtype)
    assert torch.equal(getattr(module, name), expected)
    assert getattr(module, name + "_mask").dtype == original.dtype


@BOTH
def test_identity_pruning_keeps_forward_and_grads(lib: ModuleType) -> None:
    """Pruned by identity, a layer computes what its dense twin computes, with the same
    gradients, at every forward: also after its ``weight_orig`` changed (a training step)."""
    torch.manual_seed(0)
    module = nn.Linear(5, 2)
    dense = deepcopy(module)
    lib.identity(module, name="weight")
    assert torch.equal(module.weight_mask, torch.ones(2, 5))
    for step in range(2):
        x = torch.randn(3, 5)
        out, expected = module(x), dense(x)
        assert torch.equal(out, expected), step
        (out * torch.arange(2.0)).sum().backward()  # unequal weights per output: rows differ
        (expected * torch.arange(2.0)).sum().backward()
        assert module.weight_orig.grad is not None and dense.weight.grad is not None
        assert torch.equal(module.weight_orig.grad, dense.weight.grad), step
        assert torch.equal(module.bias.grad, dense.bias.grad), step
        with torch.no_grad():  # a training step, the same on both
            for orig, twin in ((module.weight_orig, dense.weight), (module.bias, dense.bias)):
                orig.sub_(0.5 * orig.grad)
                twin.sub_(0.5 * twin.grad)
        module.zero_grad()
        dense.zero_grad()


@BOTH
def test_pruned_units_get_no_gradient(lib: ModuleType) -> None:
    module = nn.Linear(5, 2)
    mask = torch.ones_like(module.weight)
    mask[1, 0] = mask[0, 3] = 0
    lib.custom_from_mask(module, "weight", mask)
    module(torch.ones(1, 5)).sum().backward()
    assert torch.equal(module.weight_orig.grad, mask)
    assert torch.equal(module.bias.grad, torch.ones(2))


@BOTH
def test_remove_keeps_forward_and_parameter_identity(lib: ModuleType) -> None:
    module = nn.Linear(5, 2, bias=False)
    weight = module.weight
    lib.random_unstructured(module, name="weight", amount=0.9)
    assert next(iter(module.parameters())) is weight
    y = module(torch.ones(1, 5))
    lib.remove(module, "weight")
    assert next(iter(module.parameters())) is weight
    assert torch.equal(module(torch.ones(1, 5)), y)
    assert list(module.state_dict()) == ["weight"]
    assert not lib.is_pruned(module)


@BOTH
@LINEAR_AND_CONV3D
@NAMES
def test_remove(lib: ModuleType, make: type[nn.Module], name: str) -> None:
    module = make()
    lib.random_unstructured(module, name, amount=0.5)
    assert name + "_orig" in dict(module.named_parameters())
    assert name + "_mask" in dict(module.named_buffers())
    assert name not in dict(module.named_parameters())
    pruned = getattr(module, name)
    lib.remove(module, name)
    assert name in dict(module.named_parameters())
    assert name + "_orig" not in dict(module.named_parameters())
    assert name + "_mask" not in dict(module.named_buffers())
    assert torch.equal(getattr(module, name), pruned)


@BOTH
def test_multiple_pruning_calls(lib: ModuleType) -> None:
    module = nn.Conv3d(2, 2, 2)
    lib.l1_unstructured(module, name="weight", amount=0.1)
    first = module.weight_mask
    lib.ln_structured(module, name="weight", amount=0.3, n=2, dim=0)
    hook = next(iter(module._forward_pre_hooks.values()))
    assert isinstance(hook, lib.PruningContainer)
    assert hook._tensor_name == "weight"
    assert len(hook) == 2
    assert isinstance(hook[0], lib.L1Unstructured) and isinstance(hook[1], lib.LnStructured)
    assert torch.all(module.weight_mask[first == 0] == 0)
    lib.ln_structured(module, name="weight", amount=0.1, n=float("inf"), dim=1)
    hook = next(iter(module._forward_pre_hooks.values()))
    assert hook._tensor_name == "weight" and len(hook) == 3
    assert [type(m).__name__ for m in hook] == ["L1Unstructured", "LnStructured", "LnStructured"]


@BOTH
def test_pruning_container_compute_mask(lib: ModuleType) -> None:
    container = lib.PruningContainer()
    container._tensor_name = "test"
    assert len(container) == 0
    t = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.float32)
    default_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]])
    expected = [
        [[0, 0, 1, 0], [1, 1, 0, 1]],
        [[0, 0, 0, 0], [1, 1, 0, 1]],
        [[0, 1, 1, 0], [0, 1, 0, 1]],
    ]
    methods = [
        lib.L1Unstructured(amount=2),
        lib.LnStructured(amount=1, n=2, dim=0),
        lib.LnStructured(amount=1, n=2, dim=1),
    ]
    for method, mask in zip(methods, expected, strict=True):
        method._tensor_name = "test"
        container.add_pruning_method(method)
        computed = container.compute_mask(t, default_mask.clone())
        assert torch.equal(computed, torch.tensor(mask, dtype=torch.float32))


@BOTH
def test_l1_unstructured_pruning(lib: ModuleType) -> None:
    module = nn.Linear(4, 2)
    module.weight = nn.Parameter(torch.tensor([[1.0, 2, 3, 4], [-4, -3, -2, -1]]))
    lib.l1_unstructured(module, "weight", amount=2)
    assert module.weight.tolist() == [[0, 2, 3, 4], [-4, -3, -2, 0]]
    lib.l1_unstructured(module, "weight", amount=2)
    assert module.weight.tolist() == [[0, 0, 3, 4], [-4, -3, 0, 0]]


@BOTH
def test_l1_unstructured_pruning_with_importance_scores(lib: ModuleType) -> None:
    module = nn.Linear(4, 2)
    module.weight = nn.Parameter(torch.tensor([[1.0, 2, 3, 4], [-4, -3, -2, -1]]))
    scores = torch.tensor([[4.0, 2, 1, 3], [-3, -1, -2, -4]])
    lib.l1_unstructured(module, "weight", amount=2, importance_scores=scores)
    assert module.weight.tolist() == [[1, 2, 0, 4], [-4, 0, -2, -1]]
    lib.l1_unstructured(module, "weight", amount=2, importance_scores=scores)
    assert module.weight.tolist() == [[1, 0, 0, 4], [-4, 0, 0, -1]]


@BOTH
def test_unstructured_pruning_same_magnitude(lib: ModuleType) -> None:
    seed_cpu(0)
    t = 2 * torch.randint(low=-1, high=2, size=(10, 7))
    mask = lib.L1Unstructured(amount=0.2).compute_mask(t, default_mask=torch.ones_like(t))
    assert int(torch.sum(mask == 0)) == lib._compute_nparams_toprune(0.2, t.nelement()) == 14


@BOTH
def test_random_structured_pruning_amount(lib: ModuleType) -> None:
    t = 2 * torch.randint(low=-1, high=2, size=(5, 4, 2)).float()
    mask = lib.RandomStructured(amount=0.6, dim=2).compute_mask(t, torch.ones_like(t))
    assert sorted(torch.sum(mask == 0, dim=(0, 1)).tolist()) == [0, 20]


CONV_WEIGHT = [[[[1.0, 2.0], [1.0, 2.5]], [[0.5, 1.0], [0.1, 0.1]], [[-3.0, -5.0], [0.1, -1.0]]]]
CONV_SCORES = [[[[10.0, 1.0], [10.0, 1.0]], [[30.0, 3.0], [30.0, 3.0]], [[-20.0, -2.0], [-20, -2]]]]


@BOTH
@pytest.mark.parametrize(
    ("scores", "channel", "column"),
    [pytest.param(None, 1, 0, id="weights"), pytest.param(CONV_SCORES, 0, 1, id="scores")],
)
def test_ln_structured_pruning(
    lib: ModuleType, scores: list[object] | None, channel: int, column: int
) -> None:
    module = nn.Conv2d(3, 1, 2)
    module.weight.data = torch.tensor(CONV_WEIGHT)
    importance = None if scores is None else torch.tensor(scores)
    expected = torch.ones_like(module.weight)
    expected[:, channel] = 0
    lib.ln_structured(module, "weight", amount=1, n=2, dim=1, importance_scores=importance)
    assert torch.equal(module.weight_mask, expected)
    expected[:, :, :, column] = 0
    lib.ln_structured(module, "weight", amount=1, n=1, dim=-1, importance_scores=importance)
    assert torch.equal(module.weight_mask, expected)


@BOTH
def test_custom_from_mask(lib: ModuleType) -> None:
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]])
    default_mask = torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]])
    computed = lib.CustomFromMask(mask=mask).compute_mask(torch.rand(2, 4), default_mask)
    assert computed.tolist() == [[0, 0, 0, 0], [0, 0, 1, 1]]


@BOTH
def test_prune_method(lib: ModuleType) -> None:
    p = lib.L1Unstructured(amount=2)
    t = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8]])
    default_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 1]])
    assert torch.equal(p.prune(t, default_mask), t * torch.tensor([[0, 0, 1, 0], [1, 1, 0, 1]]))
    assert torch.equal(p.prune(t, default_mask, importance_scores=t), p.prune(t, default_mask))
    scores = torch.tensor([[1, 2, 3, 4], [1.5, 1.6, 1.7, 1.8]])
    expected = t * torch.tensor([[0, 1, 1, 0], [0, 1, 0, 1]])
    assert torch.equal(p.prune(t, default_mask, importance_scores=scores), expected)


@BOTH
@LINEAR_AND_CONV3D
@NAMES
def test_pickle_and_is_pruned(lib: ModuleType, make: type[nn.Module], name: str) -> None:
    module = make()
    assert not lib.is_pruned(module)
    with pytest.raises(ValueError, match="has to be pruned before pruning can be removed"):
        lib.remove(module, name)
    lib.random_unstructured(module, name=name, amount=0.1)
    assert lib.is_pruned(nn.Sequential(nn.ReLU(), module))
    copy = pickle.loads(pickle.dumps(module))
    assert isinstance(copy, type(module))
    assert torch.equal(getattr(copy, name + "_mask"), getattr(module, name + "_mask"))


@BOTH
def test_rnn_pruning(lib: ModuleType) -> None:
    lstm = nn.LSTM(32, 32)
    lib.l1_unstructured(lstm, "weight_ih_l0", 0.5)
    assert sum(isinstance(p, nn.Parameter) for p in lstm._flat_weights) == 3
    lib.remove(lstm, "weight_ih_l0")
    assert sum(isinstance(p, nn.Parameter) for p in lstm._flat_weights) == 4
    assert lstm._parameters["weight_ih_l0"] is not None
    assert "weight_ih_l0_orig" not in lstm._parameters
    assert "weight_ih_l0" in dict(lstm.named_parameters())
    assert "weight_ih_l0_orig" not in dict(lstm.named_parameters())


def test_hooks_carry_torch_private_tensor_name() -> None:
    module = tp_prune.identity(nn.Linear(2, 2), "weight")
    tp_prune.l1_unstructured(module, "bias", amount=1)
    tp_prune.l1_unstructured(module, "bias", amount=1)
    hooks = list(module._forward_pre_hooks.values())
    assert [h._tensor_name for h in hooks] == ["weight", "bias"]
    assert [m._tensor_name for m in hooks[1]] == ["bias", "bias"]
