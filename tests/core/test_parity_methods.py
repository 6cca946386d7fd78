"""Every method and functional form against ``torch.nn.utils.prune``, call for call."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

import tensorplay.ao.pruning as tp_prune
from tests.core.parity import (
    CLASS_OF,
    STRUCTURED,
    Call,
    Twins,
    count_to_prune,
    reference_mask,
    run_parity,
    seed_cpu,
)

INF = math.inf


def _linear(bias: bool = True, dtype: torch.dtype = torch.float32) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(5, 4, bias=bias, dtype=dtype)


def _conv2d() -> nn.Conv2d:
    torch.manual_seed(1)
    return nn.Conv2d(3, 4, 2)


def _x(*shape: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(2))


LINEAR_X = (_x(3, 5),)
CONV_X = (_x(2, 3, 4, 4),)

CASES = [
    pytest.param(_linear(), [Call("identity", "weight")], LINEAR_X, id="linear-identity"),
    pytest.param(
        _linear(),
        [Call("l1_unstructured", "weight", {"amount": 7})],
        LINEAR_X,
        id="linear-int-amount",
    ),
    pytest.param(
        _linear(), [Call("l1_unstructured", "bias", {"amount": 0.5})], LINEAR_X, id="bias-float"
    ),
    pytest.param(
        _linear(), [Call("l1_unstructured", "weight", {"amount": 0})], LINEAR_X, id="zero-int"
    ),
    pytest.param(
        _linear(), [Call("l1_unstructured", "weight", {"amount": 0.0})], LINEAR_X, id="zero-float"
    ),
    pytest.param(
        _linear(), [Call("l1_unstructured", "weight", {"amount": 1.0})], LINEAR_X, id="everything"
    ),
    pytest.param(
        _linear(), [Call("l1_unstructured", "weight", {"amount": 20})], LINEAR_X, id="all-int"
    ),
    pytest.param(
        _linear(dtype=torch.float64),
        [Call("random_unstructured", "weight", {"amount": 0.3})],
        (LINEAR_X[0].double(),),
        id="float64-random",
    ),
    pytest.param(
        _conv2d(),
        [Call("random_structured", "weight", {"amount": 2, "dim": 1}, form="class")],
        CONV_X,
        id="conv2d-random-structured-class",
    ),
    pytest.param(
        _conv2d(),
        [Call("ln_structured", "weight", {"amount": 0.5, "n": 2, "dim": 0})],
        CONV_X,
        id="conv2d-l2-dim0",
    ),
    pytest.param(
        _conv2d(),
        [Call("ln_structured", "weight", {"amount": 1, "n": -INF, "dim": -1})],
        CONV_X,
        id="conv2d-minus-inf-last-dim",
    ),
    pytest.param(
        _linear(),
        [Call("ln_structured", "weight", {"amount": 2, "n": "fro", "dim": 1})],
        LINEAR_X,
        id="linear-fro",
    ),
    pytest.param(
        _linear(),
        [Call("custom_from_mask", "bias", {"mask": torch.tensor([0, 1, 1, 0])})],
        LINEAR_X,
        id="custom-int-mask",
    ),
    pytest.param(
        _linear(),
        [
            Call("l1_unstructured", "weight", {"amount": 0.3}),
            Call("ln_structured", "weight", {"amount": 1, "n": 2, "dim": 0}),
            Call("random_unstructured", "weight", {"amount": 2}, form="class"),
        ],
        LINEAR_X,
        id="three-rounds-mixed",
    ),
    pytest.param(
        _conv2d(),
        [
            Call("ln_structured", "weight", {"amount": 2, "n": 1, "dim": 0}),
            Call("random_structured", "weight", {"amount": 0.5, "dim": 0}),
            Call("ln_structured", "weight", {"amount": 1, "n": INF, "dim": 0}),
        ],
        CONV_X,
        id="structured-respects-earlier-channels",
    ),
    pytest.param(
        _linear(),
        [
            Call("l1_unstructured", "weight", {"amount": 3}),
            Call(
                "l1_unstructured", "weight", {"amount": 3, "importance_scores": _x(4, 5).double()}
            ),
        ],
        LINEAR_X,
        id="float64-scores-second-round",
    ),
    pytest.param(
        nn.Sequential(_linear(), nn.ReLU(), nn.Linear(4, 2)),
        [
            Call("l1_unstructured", "weight", {"amount": 0.5}, target="0"),
            Call("random_unstructured", "bias", {"amount": 1}, target="2"),
            Call("identity", "weight", target="2"),
        ],
        LINEAR_X,
        id="sequential-submodules",
    ),
]


@pytest.mark.parametrize(("module", "calls", "inputs"), CASES)
def test_named_cases(module: nn.Module, calls: list[Call], inputs: tuple[Tensor, ...]) -> None:
    twins = run_parity(module, calls, seed=3, inputs=inputs)
    assert twins.masks_equal()
    pruned = [n for n, _ in twins.ours.named_buffers() if n.endswith("_mask")]
    assert pruned, "every case prunes something"


def test_structured_respects_earlier_masks() -> None:
    """A channel pruned unstructured-wise stays pruned, and fully pruned channels are skipped."""
    twins = run_parity(
        _linear(),
        [
            Call(
                "custom_from_mask",
                "weight",
                {"mask": torch.ones(4, 5).index_fill(0, torch.tensor([1]), 0)},
            ),
            Call("ln_structured", "weight", {"amount": 2, "n": 1, "dim": 0}),
        ],
    )
    mask = twins.ours.weight_mask
    # row 1 was already gone: 2 more rows are pruned out of the 3 left, so 3 rows are zero.
    assert int((mask.sum(dim=1) == 0).sum()) == 3
    assert torch.equal(mask, twins.theirs.weight_mask)


def test_ties_prune_lowest_index_first() -> None:
    """Where torch may pick any tied unit, tensorplay always picks the lowest index."""
    module = nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        module.weight.copy_(torch.tensor([[1.0, 2.0, 1.0, 3.0], [1.0, 3.0, 2.0, 1.0]]))
    twins = run_parity(module, [Call("l1_unstructured", "weight", {"amount": 3})])
    assert twins.ours.weight_mask.tolist() == [[0, 1, 0, 1], [0, 1, 1, 1]]
    channel = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        channel.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]]))
    twins = run_parity(channel, [Call("ln_structured", "weight", {"amount": 1, "n": 1, "dim": 0})])
    assert twins.ours.weight_mask.tolist() == [[0, 0], [1, 1], [1, 1]]


def test_nan_scores_rank_above_every_number() -> None:
    """NaN scores are pruned last, as torch.topk ranks them; the count is still exact."""
    module = nn.Linear(3, 2)
    scores = torch.tensor([[math.nan, 1.0, INF], [3.0, math.nan, 0.0]])
    twins = run_parity(
        module, [Call("l1_unstructured", "weight", {"amount": 5, "importance_scores": scores})]
    )
    assert twins.ours.weight_mask.tolist() == [[0, 0, 0], [0, 1, 0]]


# --- properties -------------------------------------------------------------------------------


@st.composite
def modules(draw: st.DrawFn) -> tuple[nn.Module, tuple[Tensor, ...], bool]:
    """A small Linear/Conv1d/Conv2d, its input, and whether its values tie on purpose."""
    kind = draw(st.sampled_from(["linear", "conv1d", "conv2d"]))
    bias = draw(st.booleans())
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    ties = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    seed_cpu(seed)
    module: nn.Module
    if kind == "linear":
        n_in, n_out = draw(st.integers(1, 6)), draw(st.integers(1, 6))
        module, shape = nn.Linear(n_in, n_out, bias=bias, dtype=dtype), (2, n_in)
    else:
        c_in, c_out, k = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 2))
        conv = nn.Conv1d if kind == "conv1d" else nn.Conv2d
        module = conv(c_in, c_out, k, bias=bias, dtype=dtype)
        shape = (2, c_in, 3) if kind == "conv1d" else (2, c_in, 3, 3)
    if ties:
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randint(-2, 3, p.shape))
    return module, (torch.randn(*shape, dtype=dtype),), ties


def _scores(shape: torch.Size, seed: int, ties: bool, dtype: torch.dtype) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    if ties:
        return torch.randint(-2, 3, shape, generator=gen).to(dtype)
    return torch.randn(shape, generator=gen, dtype=dtype)


def _amount(draw: st.DrawFn, available: int) -> int | float:
    return draw(
        st.one_of(
            st.integers(0, available),
            st.floats(0.0, 1.0),
            st.sampled_from([0, 0.0, 1.0, available]),
        )
    )


@st.composite
def calls(draw: st.DrawFn, twins: Twins, ties: bool) -> Call:
    """One call valid on both twins' current state."""
    names = sorted(n.removesuffix("_orig") for n, _ in twins.ours.named_parameters())
    name = draw(st.sampled_from(names))
    tensor = getattr(twins.ours, name)
    choices = list(CLASS_OF)
    if tensor.dim() < 2:
        choices = [c for c in choices if c not in STRUCTURED]
    method = draw(st.sampled_from(choices))
    form = draw(st.sampled_from(["function", "class"]))
    kwargs: dict[str, Any] = {}
    if method in STRUCTURED:
        kwargs["dim"] = draw(st.integers(-tensor.dim(), tensor.dim() - 1))
        kwargs["amount"] = _amount(draw, twins.available(name, kwargs["dim"]))
    elif method in ("random_unstructured", "l1_unstructured"):
        kwargs["amount"] = _amount(draw, twins.available(name))
    if method == "ln_structured":
        norms: list[Any] = [1, 2, INF, -INF] + (["fro"] if tensor.dim() == 2 else [])
        kwargs["n"] = draw(st.sampled_from(norms))
    if method in ("l1_unstructured", "ln_structured") and draw(st.booleans()):
        dtype = draw(st.sampled_from([tensor.dtype, torch.float64]))
        kwargs["importance_scores"] = _scores(tensor.shape, draw(st.integers(0, 99)), ties, dtype)
    if method == "custom_from_mask":
        gen = torch.Generator().manual_seed(draw(st.integers(0, 99)))
        bits = torch.rand(tensor.shape, generator=gen) < 0.7
        kwargs["mask"] = bits.to(draw(st.sampled_from([torch.bool, torch.int64, tensor.dtype])))
    return Call(method, name, kwargs, form=form)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=modules(), data=st.data(), seed=st.integers(0, 2**16))
def test_random_modules_and_rounds(
    case: tuple[nn.Module, tuple[Tensor, ...], bool], data: st.DataObject, seed: int
) -> None:
    module, inputs, ties = case
    twins = Twins(module)
    for round_ in range(data.draw(st.integers(1, 3), label="rounds")):
        twins.apply(data.draw(calls(twins, ties), label=f"call {round_}"), seed=seed + round_)
        twins.check_forward(*inputs)
    pruned = sorted({hook._tensor_name for hook in twins.ours._forward_pre_hooks.values()})
    for name in data.draw(st.lists(st.sampled_from(pruned), unique=True), label="remove"):
        twins.remove(name)
    twins.check_forward(*inputs)


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
    ties=st.booleans(),
    data=st.data(),
)
def test_compute_mask_prune_and_container_on_bare_tensors(
    shape: list[int], seed: int, ties: bool, data: st.DataObject
) -> None:
    """``compute_mask``, ``prune`` and ``PruningContainer.compute_mask`` outside of any module."""
    t = _scores(torch.Size(shape), seed, ties, torch.float32)
    default = (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < 0.8).float()
    amount = _amount(data.draw, int(default.sum()))
    for cls in ("L1Unstructured", "RandomUnstructured"):
        results = []
        for lib in (tp_prune, torch_prune):
            method = getattr(lib, cls)(amount)
            method._tensor_name = "t"
            container = lib.PruningContainer(method)
            before = default.clone()  # torch's container writes into its default_mask
            seed_cpu(seed)
            alone = method.compute_mask(t, before)
            seed_cpu(seed)
            combined = container.compute_mask(t, before)
            seed_cpu(seed)
            pruned = method.prune(t, default_mask=default, importance_scores=t.flip(-1))
            seed_cpu(seed)
            assert torch.equal(pruned, t * method.compute_mask(t.flip(-1), default))
            results.append((alone, combined))
            if lib is tp_prune:
                assert torch.equal(before, default), "tensorplay leaves default_mask alone"
        (alone, combined), (alone_torch, combined_torch) = results
        for ours, theirs in ((alone, alone_torch), (combined, combined_torch)):
            assert ours.dtype == theirs.dtype
            if cls == "RandomUnstructured" or not ties:
                assert torch.equal(ours, theirs)
        # On its own a method may re-prune pruned units; in a container it never does.
        assert int((combined == 0).sum()) == int((combined_torch == 0).sum())
        if cls == "L1Unstructured":
            # alone: the k lowest of all units; combined: of the units `default` left.
            k = count_to_prune(amount, t.numel())
            expected = default.clone()
            expected.view(-1)[torch.sort(t.abs().view(-1), stable=True).indices[:k]] = 0
            assert torch.equal(alone, expected)
            call = Call("l1_unstructured", "t", {"amount": amount})
            assert torch.equal(combined.double(), reference_mask(call, t, default))
