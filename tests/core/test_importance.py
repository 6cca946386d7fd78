"""Importance scores against hand-computed oracles: movement, Taylor, Wanda; their errors,
accumulation through attached optimizers, and resuming mid-accumulation bit for bit."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tensorplay.ao.pruning.importance.order import ordered
from tensorplay.ao.pruning.masking.readers import mask_of
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tests.core.test_row_scope import Conv1D
from tests.model_state import unchanged

MASKINGS = ["reparametrize", "inplace"]


def keep(module: nn.Module, name: str = "weight") -> Tensor:
    mask = mask_of(module, name)
    assert mask is not None
    return mask.bool()


def lowest(scores: Tensor, count: int) -> Tensor:
    """The keep mask that prunes the ``count`` lowest scores (distinct values)."""
    result = torch.ones(scores.numel(), dtype=torch.bool)
    result[scores.reshape(-1).argsort()[:count]] = False
    return result.view(scores.shape)


def lowest_per_row(scores: Tensor, count: int) -> Tensor:
    return torch.stack([lowest(row, count) for row in scores])


def set_gradients(pruner: Pruner, layer: nn.Linear, weights: list[Tensor], grads: list[Tensor]):
    """Step by hand: the weight takes each value, its gradient each value, then accumulate."""
    param = getattr(layer, "weight_orig", layer.weight)  # the reparametrization's unpruned values
    for weight, grad in zip(weights, grads, strict=True):
        with torch.no_grad():
            param.copy_(weight)
        param.grad = grad.clone()
        assert pruner.accumulate() == 1


# -- oracles -----------------------------------------------------------------------------------


@pytest.mark.parametrize("masking", MASKINGS)
def test_movement_is_minus_the_sum_of_weight_times_gradient_ranked_signed(masking):
    torch.manual_seed(0)
    layer = nn.Linear(5, 4, bias=False)
    pruner = Pruner(layer, OneShotSchedule(0.4), importance="movement", masking=masking)
    pruner.reparametrize()
    weights = [torch.randn(4, 5) for _ in range(3)]
    grads = [torch.randn(4, 5) for _ in range(3)]
    set_gradients(pruner, layer, weights, grads)
    expected = -sum(w * g for w, g in zip(weights, grads, strict=True))
    totals = pruner.importance.totals()["weight"]  # type: ignore[attr-defined]
    assert torch.allclose(totals, expected, rtol=1e-6, atol=1e-7)  # (a fused multiply-add)
    assert pruner.step() == 8
    # Signed: the most negative first, not the smallest |S|.
    assert torch.equal(keep(layer), lowest(expected, 8))
    assert not torch.equal(keep(layer), lowest(expected.abs(), 8))
    assert pruner.importance.steps() == {"weight": 3}  # type: ignore[attr-defined]  # no reset


@pytest.mark.parametrize("masking", MASKINGS)
def test_taylor_is_the_sum_of_absolute_weight_times_gradient_reset_after_pruning(masking):
    torch.manual_seed(1)
    layer = nn.Linear(6, 3, bias=False)
    schedule = LinearSchedule(0.5, end_step=2, frequency=1)
    pruner = Pruner(layer, schedule, importance="taylor", masking=masking)
    pruner.reparametrize()
    weights = [torch.randn(3, 6) for _ in range(2)]
    grads = [torch.randn(3, 6) for _ in range(2)]
    set_gradients(pruner, layer, weights, grads)
    expected = sum((w * g).abs() for w, g in zip(weights, grads, strict=True))
    assert torch.allclose(pruner.importance.scores(pruner._targets)[0], expected, rtol=1e-6)
    pruner.step(0)  # target 0: prunes nothing, but it is a pruning step: the sums restart
    assert pruner.importance.steps() == {"weight": 0}  # type: ignore[attr-defined]
    check = unchanged(layer)
    with pytest.raises(RuntimeError, match=r"importance='taylor'.*\['weight'\] have none"):
        pruner.step(1)
    check()
    set_gradients(pruner, layer, weights[:1], grads[:1])
    assert pruner.step(1) == round(schedule(1) * 18)
    assert torch.equal(keep(layer), lowest((weights[0] * grads[0]).abs(), round(schedule(1) * 18)))


def wanda_oracle(weight: Tensor, inputs: list[Tensor]) -> Tensor:
    """|W| * ||X_j||, the norm over every token of every batch, feature j = column j."""
    tokens = torch.cat([x.reshape(-1, x.shape[-1]) for x in inputs])
    return weight.abs() * tokens.norm(dim=0)


@pytest.mark.parametrize("masking", MASKINGS)
def test_wanda_linear_is_weight_times_input_feature_norm_per_row(masking):
    torch.manual_seed(2)
    layer = nn.Linear(6, 4)
    weight = layer.weight.detach().clone()
    pruner = Pruner(layer, OneShotSchedule(0.5), importance="wanda", scope="row", masking=masking)
    inputs = [torch.randn(3, 2, 6) * torch.arange(1.0, 7.0), torch.randn(5, 6)]
    with torch.no_grad():
        for x in inputs:
            layer(x)
    expected = wanda_oracle(weight, inputs)
    assert torch.allclose(pruner.importance.scores(pruner._targets)[0], expected, rtol=1e-6)
    assert pruner.step() == 4 * 3
    assert torch.equal(keep(layer), lowest_per_row(expected, 3))


@pytest.mark.parametrize("masking", MASKINGS)
def test_wanda_conv1d_scales_the_rows_of_its_in_out_weight(masking):
    torch.manual_seed(3)
    layer = Conv1D(5, 3)
    weight = layer.weight.detach().clone()  # (in, out): feature j scales row j
    pruner = Pruner(layer, OneShotSchedule(0.4), importance="wanda", scope="row", masking=masking)
    inputs = [torch.randn(4, 5) * torch.tensor([0.1, 1.0, 3.0, 0.5, 2.0])]
    layer(inputs[0])
    expected = wanda_oracle(weight.T, inputs).T
    assert torch.allclose(pruner.importance.scores(pruner._targets)[0], expected, rtol=1e-6)
    pruner.step()
    # Rows are output units: the columns of the stored tensor, 5 units each, 2 pruned.
    assert torch.equal(keep(layer), lowest_per_row(expected.T, 2).T)


def conv_oracle(conv: nn.Conv2d, x: Tensor) -> Tensor:
    """|W[o, c, i, j]| * the norm over samples and output positions of the input it multiplies,
    by explicit loops (independent of F.unfold)."""
    pad = conv.padding[0]
    xp = F.pad(x, (pad, pad, pad, pad))
    out_h = (x.shape[2] + 2 * pad - conv.kernel_size[0]) // conv.stride[0] + 1
    out_w = (x.shape[3] + 2 * pad - conv.kernel_size[1]) // conv.stride[1] + 1
    per_group_in = conv.in_channels // conv.groups
    per_group_out = conv.out_channels // conv.groups
    weight = conv.weight.detach()
    norms = torch.zeros_like(weight)
    for o in range(conv.out_channels):
        group = o // per_group_out
        for c in range(per_group_in):
            for i in range(conv.kernel_size[0]):
                for j in range(conv.kernel_size[1]):
                    total = 0.0
                    for p in range(out_h):
                        for q in range(out_w):
                            r, s = p * conv.stride[0] + i, q * conv.stride[1] + j
                            total += float((xp[:, group * per_group_in + c, r, s] ** 2).sum())
                    norms[o, c, i, j] = total**0.5
    return weight.abs() * norms


@pytest.mark.parametrize("groups", [1, 2])
def test_wanda_conv2d_scales_by_the_unfolded_patch_features(groups):
    torch.manual_seed(4)
    conv = nn.Conv2d(4, 4, 3, padding=1, stride=2, groups=groups)
    pruner = Pruner(conv, OneShotSchedule(0.5), importance="wanda", scope="row")
    x = torch.randn(2, 4, 5, 5)
    conv(x)
    expected = conv_oracle(conv, x)
    assert torch.allclose(pruner.importance.scores(pruner._targets)[0], expected, rtol=1e-5)


def test_wanda_norms_are_reset_after_each_pruning_step():
    layer = nn.Linear(4, 2)
    pruner = Pruner(layer, LinearSchedule(0.5, end_step=2, frequency=1), importance="wanda")
    layer(torch.randn(3, 4))
    pruner.step(0)
    assert pruner.importance.batches() == {"weight": 0}  # type: ignore[attr-defined]
    check = unchanged(layer)
    with pytest.raises(RuntimeError, match=r"observed at least one batch.*\['weight'\] saw none"):
        pruner.step(1)
    check()


def test_ordered_keys_keep_the_order_of_signed_values():
    values = torch.tensor([3.0, -1e-38, -0.0, 0.0, -7.5, 1e-45, float("-inf"), 2.0])
    keys = ordered(values)
    assert keys.dtype == torch.float64 and bool((keys >= 0).all())
    assert torch.equal(keys.argsort(stable=True), values.argsort(stable=True))
    assert keys[2] == keys[3]
    bf16 = torch.randn(1000).to(torch.bfloat16)
    keys = ordered(bf16)
    assert keys.dtype == torch.float32 and bool((keys >= 0).all())
    assert torch.equal(keys.argsort(stable=True), bf16.float().argsort(stable=True))
    assert len(set(keys.tolist())) == len(set(bf16.float().tolist()))  # equal values, equal keys


# -- accumulation through the optimizer --------------------------------------------------------


@pytest.mark.parametrize("masking", MASKINGS)
def test_attached_optimizers_accumulate_once_per_step_with_gradient_accumulation(masking):
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    pruner = Pruner(model, OneShotSchedule(0.5, step=4), importance="movement", masking=masking)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pruner.attach(optimizer)
    expected = [torch.zeros(5, 6), torch.zeros(3, 5)]
    for step in range(6):
        for _ in range(2):  # two backward passes per optimizer step
            model(torch.randn(4, 6)).pow(2).mean().backward()
        for total, layer in zip(expected, (model[0], model[2]), strict=True):
            param = getattr(layer, "weight_orig", layer.weight)
            total.sub_(param.detach() * param.grad)
        optimizer.step()
        optimizer.zero_grad()
        pruner.step(step)
        if step == 3:
            totals = pruner.importance.totals()  # type: ignore[attr-defined]
            assert torch.allclose(totals["0.weight"], expected[0], atol=1e-7)
            assert torch.allclose(totals["2.weight"], expected[1], atol=1e-7)
    assert pruner.importance.steps() == {"0.weight": 6, "2.weight": 6}  # type: ignore[attr-defined]


def test_magnitude_still_refuses_attach_with_the_reparametrization():
    pruner = Pruner(nn.Linear(2, 2), OneShotSchedule(0.5))
    optimizer = torch.optim.SGD(pruner.model.parameters(), lr=0.1)
    check = unchanged(pruner.model, optimizer)
    with pytest.raises(ValueError, match="masking='inplace' to attach optimizers to"):
        pruner.attach(optimizer)
    check()


def test_bfloat16_accumulators_take_two_bytes_per_parameter():
    layer = nn.Linear(8, 4)
    pruner = Pruner(layer, OneShotSchedule(0.5), importance="taylor", accumulator_dtype="bfloat16")
    layer(torch.randn(2, 8)).sum().backward()
    pruner.accumulate()
    total = pruner.importance.state_dict()["sums"]["weight"]
    assert (total.dtype, total.element_size(), total.device) == (
        torch.bfloat16,
        2,
        layer.weight.device,
    )


# -- errors before anything changes ------------------------------------------------------------


def test_an_unknown_importance_names_the_choices():
    with pytest.raises(
        ValueError,
        match=r"`importance` to be one of \('magnitude', 'movement', 'taylor', 'wanda', "
        r"'activation', 'reap', 'frequency'\), but got 'l3'",
    ):
        PrunerConfig(OneShotSchedule(0.5), importance="l3")


def test_an_unknown_accumulator_dtype_names_the_choices():
    with pytest.raises(ValueError, match=r"\('float32', 'bfloat16'\), but got 'float16'"):
        PrunerConfig(OneShotSchedule(0.5), accumulator_dtype="float16")  # type: ignore[arg-type]


def test_importance_and_importance_fn_together_are_refused():
    layer = nn.Linear(2, 2)
    check = unchanged(layer)
    with pytest.raises(ValueError, match="either `importance_fn` or `importance`"):
        Pruner(
            layer, OneShotSchedule(0.5), importance="taylor", importance_fn=lambda m, n: m.weight
        )
    check()


def test_importance_with_random_unstructured_is_refused():
    with pytest.raises(ValueError, match="random_unstructured, which ignores them"):
        PrunerConfig(OneShotSchedule(0.5), importance="wanda", method="random_unstructured")


def test_wanda_refuses_a_target_without_input_features_and_installs_nothing():
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 4))
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"'0.weight' \(Embedding, 'weight'\) is not: exclude it"):
        Pruner(model, OneShotSchedule(0.5), parameters=["0.weight", "1.weight"], importance="wanda")
    check()  # no observer on model[1]


@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize(
    ("importance", "match"),
    [("wanda", "saw none: run a calibration pass"), ("movement", "call pruner.accumulate()")],
)
def test_a_score_with_nothing_observed_fails_before_anything_changes(importance, match, masking):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    pruner = Pruner(model, OneShotSchedule(0.5), importance=importance, masking=masking)
    check = unchanged(model)  # as the build left it: its observers, no mask yet
    with pytest.raises(RuntimeError, match=match):
        pruner.step()
    check()
    assert (pruner.last_step, pruner.history) == (-1, [])


def test_a_gradient_score_names_a_target_without_gradients():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    pruner = Pruner(model, OneShotSchedule(0.5), importance="taylor")
    model[1].weight.grad = torch.ones(2, 4)
    pruner.accumulate()
    check = unchanged(model)
    with pytest.raises(RuntimeError, match=r"\['0.weight'\] have none"):
        pruner.step()
    check()


# -- resume mid-accumulation -------------------------------------------------------------------


def _run(
    importance: str, masking: str, steps: range, state: dict[str, Any] | None = None
) -> tuple[nn.Module, Pruner, torch.optim.Optimizer]:
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    scope = "row" if importance == "wanda" else "global"
    schedule = LinearSchedule(0.7, end_step=8, frequency=4)
    pruner = Pruner(model, schedule, importance=importance, masking=masking, scope=scope)
    pruner.reparametrize()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if pruner.importance.needs_gradients or pruner.mode.hooks_optimizers:
        pruner.attach(optimizer)
    if state is not None:
        model.load_state_dict(state["model"], strict=True)
        optimizer.load_state_dict(state["optimizer"])
        pruner.load_state_dict(state["pruner"])
    data = torch.Generator().manual_seed(7)
    batches = [torch.randn(4, 6, generator=data) for _ in range(12)]
    for step in steps:
        model(batches[step]).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        pruner.step(step)
    return model, pruner, optimizer


def _saved(model: nn.Module, pruner: Pruner, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    buffer = io.BytesIO()
    state = {
        "model": model.state_dict(),
        "pruner": pruner.state_dict(),
        "optimizer": optimizer.state_dict(),
    }
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize("importance", ["movement", "taylor", "wanda"])
def test_resume_mid_accumulation_equals_an_uninterrupted_run_bit_for_bit(importance, masking):
    whole, whole_pruner, _ = _run(importance, masking, range(11))
    first, first_pruner, optimizer = _run(importance, masking, range(6))  # 2 steps into the sums
    state = _saved(first, first_pruner, optimizer)
    fresh = _run(importance, masking, range(0))[1].state_dict()["importance_state"]
    assert fresh != state["pruner"]["importance_state"]  # the saved state holds accumulation
    resumed, resumed_pruner, _ = _run(importance, masking, range(6, 11), state)
    after, expected = resumed.state_dict(), whole.state_dict()
    assert sorted(after) == sorted(expected)
    assert all(torch.equal(after[k], v) for k, v in expected.items())
    assert resumed_pruner.history == whole_pruner.history and len(whole_pruner.history) == 2


def test_a_version_3_state_loads_into_a_movement_pruner_with_empty_accumulators():
    state = Pruner(nn.Linear(3, 2), OneShotSchedule(0.5)).state_dict()
    dropped = ("importance", "importance_state", "structure", "multiple_of")
    old = {k: v for k, v in state.items() if k not in dropped}
    old["version"] = 3
    layer = nn.Linear(3, 2)
    pruner = Pruner(layer, OneShotSchedule(0.5), importance="movement")
    layer(torch.randn(1, 3)).sum().backward()
    pruner.accumulate()
    with pytest.warns(UserWarning, match="importance: 'magnitude' -> 'movement'"):
        pruner.load_state_dict(old)
    assert pruner.importance.steps() == {"weight": 0}  # type: ignore[attr-defined]


def test_a_pruning_step_at_target_zero_needs_no_scores():
    """A gradual schedule's first pruning step (target 0) comes before any gradient."""
    layer = nn.Linear(4, 3)
    pruner = Pruner(
        layer, LinearSchedule(0.5, end_step=2, frequency=1), importance="taylor", scope="layerwise"
    )
    assert pruner.step(0) == 0
    layer(torch.randn(2, 4)).sum().backward()
    pruner.accumulate()
    assert pruner.step(1) == round(0.25 * 12)


@pytest.mark.parametrize("importance", ["movement", "taylor"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_step_with_a_non_finite_gradient_adds_nothing(importance, bad):
    # The step AMP's GradScaler skips: one inf would otherwise stay in the total for good.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    pruner = Pruner(model, OneShotSchedule(0.5), importance=importance)
    model(torch.randn(2, 4)).sum().backward()
    assert pruner.accumulate() == 2
    before = {name: total.clone() for name, total in pruner.importance.totals().items()}  # type: ignore[attr-defined]
    model[1].weight.grad[0, 1] = bad  # one entry of the second layer: the first is not added
    assert pruner.accumulate() == 0
    assert pruner.importance.skipped == 1  # type: ignore[attr-defined]
    assert pruner.importance.steps() == {"0.weight": 1, "1.weight": 1}  # type: ignore[attr-defined]
    after = pruner.importance.totals()  # type: ignore[attr-defined]
    assert all(torch.equal(after[name], total) for name, total in before.items())
    assert pruner.step() == round(0.5 * 18)
