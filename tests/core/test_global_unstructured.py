"""``global_unstructured``: parity with torch, the tie rule, tied weights, devices and dtypes,
user-defined methods, every error (model unchanged afterwards), and what repeated calls hold."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

from tensorplay.ao.pruning import (
    BasePruningMethod,
    CustomFromMask,
    L1Unstructured,
    PruningContainer,
    PruningShapeError,
    RandomStructured,
    RandomUnstructured,
    global_unstructured,
    l1_unstructured,
)
from tensorplay.ao.pruning import selection as selection_module
from tensorplay.ao.pruning.parity.reparametrization import find_hook
from tests.core.parity import assert_same_reparametrization
from tests.model_state import unchanged

Pairs = list[tuple[nn.Module, str]]


def make_net(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(12, 7), nn.ReLU(), nn.Linear(7, 3)
    ).to(dtype)


def pairs_of(net: nn.Module) -> Pairs:
    return [(net[0], "weight"), (net[2], "weight"), (net[2], "bias"), (net[4], "weight")]


def masks_of(pairs: Pairs) -> list[Tensor]:
    return [getattr(m, n + "_mask") for m, n in pairs]


def reference_global(scores: list[Tensor], masks: list[Tensor | None], k: int) -> list[Tensor]:
    """Concatenate, stable-sort |score| among the units still unpruned, prune the first k."""
    flat = torch.cat([s.detach().double().abs().reshape(-1) for s in scores])
    available = torch.cat(
        [
            torch.ones(s.numel(), dtype=torch.bool) if m is None else m.reshape(-1) == 1
            for s, m in zip(scores, masks, strict=True)
        ]
    )
    order = torch.sort(flat.masked_fill(~available, float("inf")), stable=True).indices
    keep = available.clone()
    keep[order[:k]] = False
    keep &= available
    parts = keep.split([s.numel() for s in scores])
    return [part.view(s.shape) for part, s in zip(parts, scores, strict=True)]


@pytest.mark.parametrize(
    "amounts",
    [
        pytest.param([0.3], id="float"),
        pytest.param([25], id="int"),
        pytest.param([0.0], id="zero"),
        pytest.param([1.0], id="everything"),
        pytest.param([0.5, 0.5, 10], id="repeated"),
        pytest.param([0, 1.0], id="zero-then-everything"),
    ],
)
def test_parity_with_torch(amounts: list[float | int]) -> None:
    net = make_net()
    ours, theirs = copy.deepcopy(net), copy.deepcopy(net)
    for amount in amounts:
        global_unstructured(pairs_of(ours), L1Unstructured, amount=amount)
        torch_prune.global_unstructured(pairs_of(theirs), torch_prune.L1Unstructured, amount=amount)
        for a, b in zip(masks_of(pairs_of(ours)), masks_of(pairs_of(theirs)), strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)  # continuous scores: no ties
        assert_same_reparametrization(ours, theirs, bounded_global=True)
    x = torch.randn(5, 2, 4, 4)
    assert torch.equal(ours(x), theirs(x))
    hooks = [h for h in ours[2]._forward_pre_hooks.values()]
    assert len(hooks) == 2  # weight and bias
    assert all(type(h) is CustomFromMask for h in hooks)  # bounded: one hook however often
    assert ours[2].weight.grad_fn is not None  # ``name`` is mask * orig, as in torch


@pytest.mark.parametrize("into", ["ours", "theirs"])
def test_parity_with_torch_state_dict_loads_both_ways(into: str) -> None:
    """A state pruned by one library loads strictly into a model pruned by the other, from other
    values with other masks: the loaded model holds the saved values and masks and computes
    what the saved one computes."""
    ours, theirs = make_net(seed=0), make_net(seed=1)
    global_unstructured(pairs_of(ours), L1Unstructured, amount=0.4)
    torch_prune.global_unstructured(pairs_of(theirs), torch_prune.L1Unstructured, amount=0.4)
    source, target = (theirs, ours) if into == "ours" else (ours, theirs)
    x = torch.randn(5, 2, 4, 4)
    target(x)  # a forward before the load: the pruned tensors computed from the old state
    saved = {key: value.clone() for key, value in source.state_dict().items()}
    old_masks = [mask.clone() for mask in masks_of(pairs_of(target))]
    assert any(
        not torch.equal(old, new)
        for old, new in zip(old_masks, masks_of(pairs_of(source)), strict=True)
    )  # the masks differ: the load has something to carry
    target.load_state_dict(source.state_dict(), strict=True)
    loaded = target.state_dict()
    assert list(loaded) == list(saved)
    for key, value in saved.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
    assert torch.equal(target(x), source(x))
    for module, name in pairs_of(target):  # the pruned tensor is the loaded mask * orig
        expected = getattr(module, name + "_mask") * getattr(module, name + "_orig")
        assert torch.equal(getattr(module, name), expected), name


@pytest.mark.parametrize("amount", [0.5, 13, 40])
def test_ties_prune_the_count_and_follow_the_rule(amount: float) -> None:
    net = make_net()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randint(-2, 3, p.shape))
    ours, theirs = copy.deepcopy(net), copy.deepcopy(net)
    scores = [getattr(m, n).detach().clone() for m, n in pairs_of(ours)]
    global_unstructured(pairs_of(ours), L1Unstructured, amount=amount)
    torch_prune.global_unstructured(pairs_of(theirs), torch_prune.L1Unstructured, amount=amount)
    total = sum(s.numel() for s in scores)
    k = amount if isinstance(amount, int) else round(amount * total)
    for masks in (masks_of(pairs_of(ours)), masks_of(pairs_of(theirs))):
        assert sum(int((m == 0).sum()) for m in masks) == k
        flat_scores = torch.cat([s.abs().reshape(-1) for s in scores])
        flat_masks = torch.cat([m.reshape(-1) for m in masks])
        assert flat_scores[flat_masks == 0].max() <= flat_scores[flat_masks == 1].min()
    expected = reference_global(scores, [None] * len(scores), k)
    for got, want in zip(masks_of(pairs_of(ours)), expected, strict=True):
        assert torch.equal(got.bool(), want)


def test_repeated_pruning_keeps_pruned_units_and_counts_the_rest() -> None:
    net = make_net()
    pairs = pairs_of(net)
    global_unstructured(pairs, L1Unstructured, amount=0.5)
    before = [m.clone() for m in masks_of(pairs)]
    remaining = sum(int(m.sum()) for m in before)
    scores = [torch.randn(getattr(m, n).shape) for m, n in pairs]
    global_unstructured(
        pairs, L1Unstructured, importance_scores=dict(zip(pairs, scores, strict=True)), amount=0.5
    )
    after = masks_of(pairs)
    assert sum(int(m.sum()) for m in after) == remaining - round(0.5 * remaining)
    expected = reference_global(scores, before, round(0.5 * remaining))
    for got, want in zip(after, expected, strict=True):
        assert torch.equal(got.bool(), want)


def test_generator_of_pairs() -> None:
    ours, theirs = make_net(), make_net()
    global_unstructured((pair for pair in pairs_of(ours)), L1Unstructured, amount=0.3)
    global_unstructured(pairs_of(theirs), L1Unstructured, amount=0.3)
    for a, b in zip(masks_of(pairs_of(ours)), masks_of(pairs_of(theirs)), strict=True):
        assert torch.equal(a, b)


def test_tied_weights_count_once_and_share_one_mask() -> None:
    torch.manual_seed(0)
    first, second, other = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 2)
    second.weight = first.weight
    pairs: Pairs = [(first, "weight"), (other, "weight"), (second, "weight")]
    scores = [first.weight.detach().clone(), other.weight.detach().clone()]
    global_unstructured(pairs, L1Unstructured, amount=20)
    assert first.weight_mask is second.weight_mask
    assert first.weight_orig is second.weight_orig
    assert int((first.weight_mask == 0).sum() + (other.weight_mask == 0).sum()) == 20
    expected = reference_global(scores, [None, None], 20)
    assert torch.equal(first.weight_mask.bool(), expected[0])
    assert torch.equal(other.weight_mask.bool(), expected[1])
    global_unstructured(pairs, L1Unstructured, amount=0.5)  # again: still shared, in place
    assert first.weight_mask is second.weight_mask
    assert int((first.weight_mask == 0).sum() + (other.weight_mask == 0).sum()) == 34
    assert torch.equal(first.weight, second.weight)


@pytest.mark.parametrize("dtypes", [(torch.float16, torch.bfloat16, torch.float32)])
def test_mixed_dtypes_compare_exactly(dtypes: tuple[torch.dtype, ...]) -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(8, 8).to(dtype) for dtype in dtypes]
    pairs: Pairs = [(layer, "weight") for layer in layers]
    scores = [layer.weight.detach().clone() for layer in layers]
    global_unstructured(pairs, L1Unstructured, amount=0.6)
    for layer, dtype, want in zip(
        layers, dtypes, reference_global(scores, [None] * 3, round(0.6 * 192)), strict=True
    ):
        assert layer.weight_mask.dtype == dtype
        assert torch.equal(layer.weight_mask.bool(), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_mixed_devices() -> None:
    torch.manual_seed(0)
    layers = [nn.Linear(30, 30), nn.Linear(30, 30).cuda(), nn.Linear(30, 10).cuda().half()]
    pairs: Pairs = [(layer, "weight") for layer in layers]
    scores = [layer.weight.detach().cpu() for layer in layers]
    global_unstructured(pairs, L1Unstructured, amount=0.5)
    expected = reference_global(scores, [None] * 3, round(0.5 * 2100))
    for layer, want in zip(layers, expected, strict=True):
        assert layer.weight_mask.device == layer.weight.device
        assert torch.equal(layer.weight_mask.bool().cpu(), want)


def test_random_unstructured_counts_and_reproducibility() -> None:
    nets = [make_net(), make_net()]
    for net in nets:
        torch.manual_seed(5)
        global_unstructured(pairs_of(net), RandomUnstructured, amount=0.4)
        global_unstructured(pairs_of(net), RandomUnstructured, amount=7)
    total = sum(getattr(m, n).numel() for m, n in pairs_of(nets[0]))
    first = round(0.4 * total)
    pruned = sum(int((m == 0).sum()) for m in masks_of(pairs_of(nets[0])))
    assert pruned == first + 7
    for a, b in zip(masks_of(pairs_of(nets[0])), masks_of(pairs_of(nets[1])), strict=True):
        assert torch.equal(a, b)


def test_random_unstructured_draws_once_from_the_global_rng() -> None:
    net = make_net()
    torch.manual_seed(3)
    global_unstructured(pairs_of(net), RandomUnstructured, amount=0.4)
    after_call = torch.rand(3)
    torch.manual_seed(3)
    torch.randint(0, 2**62, (1,))
    assert torch.equal(torch.rand(3), after_call)


class PruneLargest(BasePruningMethod):
    """A user-defined method: prune the ``amount`` largest |scores| (its own compute_mask)."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: int) -> None:
        self.amount = amount

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        mask = default_mask.clone()
        mask.view(-1)[torch.topk(t.abs().view(-1), self.amount).indices] = 0
        return mask


def test_user_defined_method_decides() -> None:
    net = make_net()
    pairs = pairs_of(net)
    flat = torch.cat([getattr(m, n).detach().abs().reshape(-1) for m, n in pairs])
    global_unstructured(pairs, PruneLargest, amount=5)
    masks = torch.cat([m.reshape(-1) for m in masks_of(pairs)])
    assert torch.equal(
        torch.nonzero(masks == 0).view(-1).sort().values, flat.topk(5).indices.sort().values
    )
    global_unstructured(pairs, PruneLargest, amount=5)  # again: only units not yet pruned
    assert int((torch.cat([m.reshape(-1) for m in masks_of(pairs)]) == 0).sum()) == 10


def test_patched_compute_mask_is_reached() -> None:
    net = make_net()

    def prune_first(self: Any, t: Tensor, default_mask: Tensor) -> Tensor:
        mask = default_mask.clone()
        mask.view(-1)[:3] = 0
        return mask

    with mock.patch.object(
        L1Unstructured, "compute_mask", autospec=True, side_effect=prune_first
    ) as patched:
        global_unstructured(pairs_of(net), L1Unstructured, amount=0.5)
    assert patched.call_count == 1
    assert net[0].weight_mask.view(-1)[:3].tolist() == [0, 0, 0]
    assert sum(int((m == 0).sum()) for m in masks_of(pairs_of(net))) == 3


# --- errors: each branch, and the model exactly as before -------------------------------------


def _pruned_once() -> nn.Sequential:
    net = make_net()
    global_unstructured(pairs_of(net), L1Unstructured, amount=0.3)
    return net


def _bad_call(
    make_args: Callable[[nn.Sequential], tuple[Any, Any, dict[str, Any]]],
) -> Callable[[nn.Sequential], None]:
    def call(net: nn.Sequential) -> None:
        params, scores, kwargs = make_args(net)
        method = kwargs.pop("method", L1Unstructured)
        global_unstructured(params, method, importance_scores=scores, **kwargs)

    return call


def _nan_scores(net: nn.Sequential) -> dict[Any, Tensor]:
    """A NaN at flat index 27, or at the first unit not yet pruned after it."""
    scores = torch.randn(net[2].weight.shape)
    mask = getattr(net[2], "weight_mask", torch.ones_like(scores)).reshape(-1)
    where = 27 + int(torch.nonzero(mask[27:] == 1)[0])
    scores.view(-1)[where] = float("nan")
    scores.view(-1)[:where][mask[:where] == 0] = float("nan")  # pruned units: ignored
    return {(net[2], "weight"): scores}


def _inf_scores(net: nn.Sequential) -> dict[Any, Tensor]:
    scores = torch.randn(net[4].weight.shape)
    scores[1, 1] = float("-inf")
    return {(net[4], "weight"): scores}


ERRORS = [
    pytest.param(
        lambda n: (5, None, {"amount": 0.5}),
        TypeError,
        "parameters is not an Iterable",
        id="not-iterable",
    ),
    pytest.param(
        lambda n: (pairs_of(n), [1], {"amount": 0.5}),
        TypeError,
        "importance_scores must be of type dict",
        id="scores-not-dict",
    ),
    pytest.param(
        lambda n: (pairs_of(n), None, {"amount": 0.5, "dim": 0, "method": RandomStructured}),
        TypeError,
        'Only "unstructured" PRUNING_TYPE',
        id="structured-method",
    ),
    pytest.param(
        lambda n: ([*pairs_of(n), (n[0],)], None, {"amount": 0.5}),
        TypeError,
        r"an \(nn.Module, str\) pair, but got \(Conv2d.*at position 4",
        id="not-a-pair",
    ),
    pytest.param(
        lambda n: ([*pairs_of(n), (n[0], 3)], None, {"amount": 0.5}),
        TypeError,
        r"\(nn.Module, str\) pair, but got .*3\) at position 4",
        id="name-not-str",
    ),
    pytest.param(
        lambda n: ([*pairs_of(n), (n[2], "wieght")], None, {"amount": 0.5}),
        AttributeError,
        r"\(Linear, 'wieght'\) to name a parameter, but Linear has no attribute 'wieght'",
        id="no-such-tensor",
    ),
    pytest.param(
        lambda n: ([*pairs_of(n), (n[3], "training")], None, {"amount": 0.5}),
        TypeError,
        r"\(ReLU, 'training'\) to name a parameter, but it is bool",
        id="not-a-parameter",
    ),
    pytest.param(
        lambda n: ([*pairs_of(n), (n[2], "weight")], None, {"amount": 0.5}),
        ValueError,
        r"\(Linear, 'weight'\) is listed at positions 1 and 4",
        id="pair-twice",
    ),
    pytest.param(lambda n: ([], None, {"amount": 0.5}), ValueError, "at least one", id="empty"),
    pytest.param(
        lambda n: (pairs_of(n), {(n[2], "weight"): torch.ones(3, 3)}, {"amount": 0.5}),
        PruningShapeError,
        r"`importance_scores` for \(Linear, 'weight'\) to have its shape \(7, 12\), but got "
        r"\(3, 3\)",
        id="score-shape",
    ),
    pytest.param(
        lambda n: (pairs_of(n), {(n[2], "weight"): [1.0]}, {"amount": 0.5}),
        TypeError,
        r"`importance_scores` for \(Linear, 'weight'\) to be a Tensor, but got list",
        id="score-not-tensor",
    ),
    pytest.param(
        lambda n: (pairs_of(n), _nan_scores(n), {"amount": 0.5}),
        ValueError,
        r"finite importance scores, but \(Linear, 'weight'\) has nan at flat index \d+\.",
        id="nan-score",
    ),
    pytest.param(  # every unit left: pruned before, the masks are cleared in place, no cut
        lambda n: (pairs_of(n), _nan_scores(n), {"amount": 1.0}),
        ValueError,
        r"finite importance scores, but \(Linear, 'weight'\) has nan at flat index \d+\.",
        id="nan-score-everything",
    ),
    pytest.param(
        lambda n: (pairs_of(n), _inf_scores(n), {"amount": 0.5}),
        ValueError,
        r"finite importance scores, but \(Linear, 'weight'\) has -inf at flat index 8",
        id="inf-score",
    ),
    pytest.param(
        lambda n: (pairs_of(n), _nan_scores(n), {"amount": 5, "method": PruneLargest}),
        ValueError,
        r"finite importance scores, but \(Linear, 'weight'\) has nan",
        id="nan-score-user-method",
    ),
    pytest.param(
        lambda n: (pairs_of(n), None, {"amount": 10_000}),
        ValueError,
        r"at most the number of units not yet pruned \(\d+\), but got 10000",
        id="int-amount-too-large",
    ),
    pytest.param(
        lambda n: (pairs_of(n), None, {"amount": 1.5}),
        ValueError,
        r"float in \[0, 1\] or a non-negative int, but got 1.5",
        id="float-amount-above-one",
    ),
    pytest.param(
        lambda n: (pairs_of(n), None, {"amount": -0.1}),
        ValueError,
        r"float in \[0, 1\] or a non-negative int, but got -0.1",
        id="float-amount-negative",
    ),
    pytest.param(
        lambda n: (pairs_of(n), None, {"amount": 0.5, "method": RandomUnstructured, "seed": 1}),
        TypeError,
        "unexpected keyword argument 'seed'",
        id="unknown-kwarg",
    ),
    pytest.param(
        lambda n: (pairs_of(n), None, {"amount": 0.5, "method": "l1"}),
        TypeError,
        r"`pruning_method` to be a BasePruningMethod subclass such as L1Unstructured, but got "
        r"'l1'",
        id="method-name",
    ),
    pytest.param(
        lambda n: (
            pairs_of(n),
            {(n[2], "weight"): torch.ones(7, 12, device="meta")},
            {"amount": 0.5},
        ),
        ValueError,
        r"`importance_scores` for \(Linear, 'weight'\) to hold values on a device they can be "
        r"read from \(its parameter is on cpu\), but got a tensor on meta",
        id="scores-on-meta",
    ),
]


@pytest.mark.parametrize("pruned_before", [False, True], ids=["fresh", "pruned-before"])
@pytest.mark.parametrize(("make_args", "error", "match"), ERRORS)
def test_errors_leave_the_model_unchanged(
    make_args: Callable[[nn.Sequential], tuple[Any, Any, dict[str, Any]]],
    error: type[Exception],
    match: str,
    pruned_before: bool,
) -> None:
    net = _pruned_once() if pruned_before else make_net()
    check = unchanged(net)
    with pytest.raises(error, match=match):
        _bad_call(make_args)(net)
    check()


def test_int_amount_too_large_counts_only_units_not_yet_pruned() -> None:
    net = make_net()
    global_unstructured(pairs_of(net), L1Unstructured, amount=100)
    left = sum(int(m.sum()) for m in masks_of(pairs_of(net)))
    check = unchanged(net)
    with pytest.raises(ValueError, match=rf"not yet pruned \({left}\), but got {left + 1}\."):
        global_unstructured(pairs_of(net), L1Unstructured, amount=left + 1)
    check()
    global_unstructured(pairs_of(net), L1Unstructured, amount=left)
    assert all(int(m.sum()) == 0 for m in masks_of(pairs_of(net)))


def test_tied_pairs_with_different_pruning_raise() -> None:
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    second.weight = first.weight
    with pytest.warns(UserWarning, match=r"also held by \(Linear, 'weight'\)"):
        l1_unstructured(first, "weight", amount=3)  # leaves `second` unmasked, and says so
    check_first, check_second = unchanged(first), unchanged(second)
    with pytest.raises(ValueError, match=r"share one parameter, to share its pruning mask"):
        global_unstructured([(first, "weight"), (second, "weight")], L1Unstructured, amount=2)
    check_first()
    check_second()


def test_tied_pairs_with_two_score_tensors_raise() -> None:
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    second.weight = first.weight
    pairs: Pairs = [(first, "weight"), (second, "weight")]
    scores = {pair: torch.randn(4, 4) for pair in pairs}
    check_first, check_second = unchanged(first), unchanged(second)
    with pytest.raises(ValueError, match=r"to have one tensor of importance scores"):
        global_unstructured(pairs, L1Unstructured, importance_scores=scores, amount=2)
    check_first()
    check_second()


# --- what repeated calls leave behind ---------------------------------------------------------


def _tensor_bytes(module: nn.Module) -> int:
    """Bytes of the distinct storages a module reaches: parameters, buffers, attributes, hooks."""
    seen: dict[int, int] = {}

    def add(t: Tensor) -> None:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()

    for sub in module.modules():
        for t in [*sub._parameters.values(), *sub._buffers.values(), *vars(sub).values()]:
            if isinstance(t, Tensor):
                add(t)
        for hook in sub._forward_pre_hooks.values():
            for member in hook if isinstance(hook, PruningContainer) else [hook]:
                if isinstance(getattr(member, "mask", None), Tensor):
                    add(member.mask)
    return sum(seen.values())


def test_ten_calls_hold_only_the_mask_and_the_masked_tensor() -> None:
    net = make_net()
    pairs = pairs_of(net)
    global_unstructured(pairs, L1Unstructured, amount=0.1)
    held = _tensor_bytes(net)
    masks = masks_of(pairs)
    hooks = [find_hook(module, name)[1] for module, name in pairs]
    for _ in range(9):
        global_unstructured(pairs, L1Unstructured, amount=0.1)
    assert _tensor_bytes(net) == held
    for (module, name), mask, first in zip(pairs, masks, hooks, strict=True):
        assert getattr(module, name + "_mask") is mask  # updated in place
        hook = find_hook(module, name)[1]
        assert hook is first and type(hook) is CustomFromMask  # bounded: the first call's hook
        assert hook.mask is mask


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        pytest.param(None, ["CustomFromMask"], id="global-only"),
        pytest.param(l1_unstructured, ["L1Unstructured", "CustomFromMask"], id="after-l1"),
    ],
)
def test_repeated_global_pruning_keeps_the_hook_state_bounded(
    first: Callable[..., nn.Module] | None, expected: list[str]
) -> None:
    layer = nn.Linear(32, 32)
    if first is not None:
        first(layer, "weight", amount=1)
    global_unstructured([(layer, "weight")], L1Unstructured, amount=1)
    size = len(pickle.dumps(layer))
    for _ in range(50):
        global_unstructured([(layer, "weight")], L1Unstructured, amount=1)
    hook = find_hook(layer, "weight")[1]
    members = list(hook) if isinstance(hook, PruningContainer) else [hook]
    assert [type(member).__name__ for member in members] == expected
    assert len(pickle.dumps(layer)) == size  # the mask's values change, not its size
    assert int((layer.weight_mask == 0).sum()) == 51 + (first is not None)


def test_no_reference_to_an_earlier_call_survives() -> None:
    net = make_net()
    pairs = pairs_of(net)
    created: list[weakref.ref[Tensor]] = []
    original = selection_module.keep_masks

    def tracking(*args: Any, **kwargs: Any) -> list[Tensor]:
        out = original(*args, **kwargs)
        created.extend(weakref.ref(t) for t in out)
        return out

    import tensorplay.ao.pruning.parity.global_unstructured as global_pruning

    with mock.patch.object(global_pruning, "keep_masks", side_effect=tracking):
        for _ in range(10):
            global_unstructured(pairs, L1Unstructured, amount=0.1)
    gc.collect()
    # The first call's masks became the buffers; the later calls cleared those in place and
    # made no mask-sized tensor (no keep factor) that could outlive them.
    assert len(created) == len(pairs)
    buffers = masks_of(pairs)
    assert all(ref() is buffer for ref, buffer in zip(created, buffers, strict=True))
