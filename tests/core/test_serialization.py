"""Pruned modules travel: state_dicts between tensorplay and torch, pickle, save, deepcopy, RNNs.

Every round trip first proves that the target differs from the source, then loads strictly, then
compares exactly.
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from types import ModuleType

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

import tensorplay.ao.pruning as tp_prune
from tests.core.parity import (
    Call,
    assert_same_reparametrization,
    hook_signature,
    run_parity,
    seed_cpu,
)

LIBS = {"tensorplay": tp_prune, "torch": torch_prune}


def model() -> nn.Sequential:
    seed_cpu(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16, 3))


X = torch.randn(2, 2, 4, 4, generator=torch.Generator().manual_seed(1))


def prune(lib: ModuleType, net: nn.Module, seed: int) -> nn.Module:
    """Two tensors pruned, one of them twice (so its hook is a PruningContainer)."""
    seed_cpu(seed)
    lib.l1_unstructured(net[0], "weight", amount=0.3)
    lib.random_structured(net[0], "weight", amount=1, dim=0)
    lib.ln_structured(net[3], "weight", amount=0.5, n=2, dim=1)
    lib.random_unstructured(net[3], "bias", amount=1)
    return net


def masks(net: nn.Module) -> dict[str, Tensor]:
    return {k: v for k, v in net.state_dict().items() if k.endswith("_mask")}


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sd_a, sd_b = a.state_dict(), b.state_dict()
    assert list(sd_a) == list(sd_b)
    for key in sd_a:
        assert sd_a[key].dtype == sd_b[key].dtype and torch.equal(sd_a[key], sd_b[key]), key


@pytest.mark.parametrize(
    ("source", "target"),
    [
        pytest.param("tensorplay", "torch", id="tensorplay-to-torch"),
        pytest.param("torch", "tensorplay", id="torch-to-tensorplay"),
        pytest.param("tensorplay", "tensorplay", id="tensorplay-to-tensorplay"),
    ],
)
def test_state_dict_loads_strictly_into_a_twin(source: str, target: str) -> None:
    src = prune(LIBS[source], model(), seed=1)
    dst = model()
    with torch.no_grad():
        for p in dst.parameters():
            p.add_(1.0)  # different values too, not only different masks
    dst = prune(LIBS[target], dst, seed=2)
    assert any(not torch.equal(v, masks(dst)[k]) for k, v in masks(src).items())
    assert not torch.equal(src(X), dst(X))
    buffer = io.BytesIO()
    torch.save(src.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    dst.load_state_dict(state, strict=True)
    assert_same_state(src, dst)
    assert torch.equal(src(X), dst(X))
    assert [hook_signature(m) for m in src.modules()] == [hook_signature(m) for m in dst.modules()]


def test_identical_pruning_gives_identical_state_dicts() -> None:
    ours, theirs = prune(tp_prune, model(), seed=3), prune(torch_prune, model(), seed=3)
    assert_same_state(ours, theirs)
    assert_same_reparametrization(ours, theirs)
    assert torch.equal(ours(X), theirs(X))


@pytest.mark.parametrize(
    "round_trip",
    [
        pytest.param(lambda m: pickle.loads(pickle.dumps(m)), id="pickle"),
        pytest.param(lambda m: _torch_save_load(m), id="torch-save"),
        pytest.param(copy.deepcopy, id="deepcopy"),
    ],
)
def test_whole_module_round_trip(round_trip: Callable[[nn.Module], nn.Module]) -> None:
    net = prune(tp_prune, model(), seed=4)
    expected = net(X)
    clone = round_trip(net)
    assert clone is not net and clone[0].weight_orig is not net[0].weight_orig
    assert_same_state(net, clone)
    assert torch.equal(clone(X), expected)
    assert [hook_signature(m) for m in clone.modules()] == [
        hook_signature(m) for m in net.modules()
    ]
    # the copy goes on pruning on its own, as a container, and leaves the original alone
    before = net[3].weight_mask.clone()
    tp_prune.l1_unstructured(clone[3], "weight", amount=5)
    assert hook_signature(clone[3]) == [
        ("RandomUnstructured", "bias", ()),
        ("PruningContainer", "weight", ("LnStructured", "L1Unstructured")),
    ]
    assert torch.equal(net[3].weight_mask, before)
    assert int((clone[3].weight_mask == 0).sum()) == int((before == 0).sum()) + 5
    tp_prune.remove(clone[0], "weight")
    assert tp_prune.is_pruned(net[0])
    # a deep copy of the round-tripped module copies it, not the module it came from
    again = copy.deepcopy(clone)
    assert_same_state(clone, again)
    assert torch.equal(again(X), clone(X))


def _torch_save_load(module: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    loaded: nn.Module = torch.load(buffer, weights_only=False)
    return loaded


@pytest.mark.parametrize("forward_first", [False, True], ids=["before-forward", "after-forward"])
def test_deepcopy_of_a_pruned_module(forward_first: bool) -> None:
    """torch cannot deep-copy a pruned module (``weight`` is a non-leaf tensor); tensorplay can."""
    net = prune(tp_prune, model(), seed=5)
    if forward_first:
        net(X).sum().backward()
    clone = copy.deepcopy(net)
    assert_same_state(net, clone)
    assert torch.equal(clone(X), net(X))
    assert torch.equal(clone[3].weight, clone[3].weight_mask * clone[3].weight_orig)
    hook_net = next(iter(net[0]._forward_pre_hooks.values()))
    hook_clone = next(iter(clone[0]._forward_pre_hooks.values()))
    assert hook_clone is not hook_net and hook_clone[0] is not hook_net[0]
    # gradients flow to the copy's own parameters
    clone(X).sum().backward()
    assert clone[0].weight_orig.grad is not None
    assert clone[0].weight_orig.grad is not net[0].weight_orig.grad
    # the copy keeps deep-copying, the original still works
    assert torch.equal(copy.deepcopy(clone)(X), net(X))


def test_deepcopy_after_remove_is_a_plain_copy() -> None:
    net = prune(tp_prune, model(), seed=6)
    for module, name in ((net[0], "weight"), (net[3], "weight"), (net[3], "bias")):
        tp_prune.remove(module, name)
    for module in net.modules():
        assert "__deepcopy__" not in vars(module)
    clone = copy.deepcopy(net)
    assert_same_state(net, clone)
    assert not tp_prune.is_pruned(clone)


def test_deepcopy_keeps_shared_memo() -> None:
    """A pruned module reached twice in one deepcopy is copied once (the memo is honoured)."""
    layer = tp_prune.l1_unstructured(nn.Linear(3, 3), "weight", amount=4)
    pair = nn.ModuleList([layer, layer])
    clone = copy.deepcopy(pair)
    assert clone[0] is clone[1] and clone[0] is not layer


@pytest.mark.parametrize("rnn", [nn.LSTM, nn.GRU], ids=["lstm", "gru"])
def test_rnn_prune_forward_remove(rnn: type[nn.RNNBase]) -> None:
    seed_cpu(7)
    module = rnn(6, 5, num_layers=2)
    x = torch.randn(4, 3, 6, generator=torch.Generator().manual_seed(8))
    calls = [
        Call("l1_unstructured", "weight_ih_l0", {"amount": 0.5}),
        Call("ln_structured", "weight_hh_l1", {"amount": 2, "n": 2, "dim": 0}),
        Call("random_unstructured", "weight_hh_l1", {"amount": 3}),
        Call("random_unstructured", "bias_ih_l0", {"amount": 0.4}),
    ]
    twins = run_parity(module, calls, seed=9, inputs=(x,))
    ours = twins.ours
    assert sum(isinstance(p, nn.Parameter) for p in ours._flat_weights) == 5
    pruned_out = ours(x)[0]
    assert torch.equal(copy.deepcopy(ours)(x)[0], pruned_out)
    for name in ("weight_ih_l0", "weight_hh_l1", "bias_ih_l0"):
        twins.remove(name)
    assert sum(isinstance(p, nn.Parameter) for p in ours._flat_weights) == 8
    # the same names as before pruning (in torch's order, which twins.remove has compared)
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(
        n for n, _ in module.named_parameters()
    )
    assert torch.equal(ours(x)[0], pruned_out)
    assert torch.equal(ours(x)[0], twins.theirs(x)[0])
