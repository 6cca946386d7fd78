"""A masked expert is never routed to: masked = shrunk = reloaded, in both masking modes, in
training and in cached generation."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import Pruner, load_shrunk, shrink
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.ao.pruning.structured.units.routing import remove_routing
from tests.model_state import unchanged
from tests.moe_models import EXPERTS, MOE_MODELS, tiny_mixtral

Build = Callable[..., nn.Module]
FAMILIES = [pytest.param(build, id=name) for name, build in MOE_MODELS.items()]
MODES = ["reparametrize", "inplace"]
TOKENS = torch.tensor([[5, 17, 3, 88, 41, 9, 60], [1, 2, 3, 4, 5, 6, 7]])


def _pruned(build: Build, masking: str, scope: str = "layerwise", sparsity: float = 0.5) -> Pruner:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the selection leaves out the experts: it chooses layers
        pruner = Pruner(
            build(), OneShotSchedule(sparsity), structure="expert", scope=scope, masking=masking
        )
    pruner.step()
    return pruner


def _routers(model: nn.Module) -> list[nn.Module]:
    return [layer.mlp.gate for layer in model.model.layers]  # type: ignore[union-attr]


@pytest.mark.parametrize("masking", MODES)
@pytest.mark.parametrize("build", FAMILIES)
def test_masked_equals_shrunk_equals_reloaded(build: Build, masking: str, tmp_path: Path) -> None:
    model = _pruned(build, masking).model
    with torch.no_grad():
        masked = model(TOKENS).logits
    report = shrink(model)
    assert report.config == "uniform"
    assert [router.weight.shape[0] for router in _routers(model)] == [EXPERTS // 2] * 2
    assert model.config.num_experts == EXPERTS // 2
    with torch.no_grad():
        shrunk = model(TOKENS).logits
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        loaded = reloaded(TOKENS).logits
    torch.testing.assert_close(shrunk, masked, rtol=0, atol=1e-5)
    torch.testing.assert_close(loaded, shrunk, rtol=0, atol=1e-5)


@pytest.mark.parametrize("masking", MODES)
@pytest.mark.parametrize("build", FAMILIES)
def test_masked_and_shrunk_generate_the_same_tokens_with_the_cache(
    build: Build, masking: str
) -> None:
    model = _pruned(build, masking).model
    shrunk = copy.deepcopy(model)
    shrink(shrunk)
    options = {"max_new_tokens": 6, "do_sample": False, "use_cache": True, "pad_token_id": 0}
    masked_tokens = model.generate(TOKENS, **options)  # type: ignore[operator]
    shrunk_tokens = shrunk.generate(TOKENS, **options)  # type: ignore[operator]
    assert torch.equal(masked_tokens, shrunk_tokens)


@pytest.mark.parametrize("masking", MODES)
@pytest.mark.parametrize("build", FAMILIES)
def test_masked_and_shrunk_train_alike(build: Build, masking: str) -> None:
    model = _pruned(build, masking).model
    shrunk = copy.deepcopy(model)
    shrink(shrunk)
    losses, grads = [], []
    for each in (model, shrunk):
        each.train()
        loss = each(TOKENS, labels=TOKENS).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append(each.model.layers[0].self_attn.q_proj.weight.grad)  # type: ignore[union-attr]
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-5)


def test_zeroed_experts_without_the_routing_hook_still_take_part() -> None:
    """The test above fails without the hook: a zero logit takes part in the softmax."""
    model = _pruned(tiny_mixtral, "reparametrize").model
    with torch.no_grad():
        masked = model(TOKENS).logits
        for router in _routers(model):
            remove_routing(router)
        unhooked = model(TOKENS).logits
    assert (unhooked - masked).abs().max() > 1e-3


def test_global_counts_differ_per_layer_and_load_with_load_shrunk(tmp_path: Path) -> None:
    model = tiny_mixtral()
    with torch.no_grad():  # layer 0's experts larger: a global ranking takes layer 1's first
        model.model.layers[0].mlp.experts.gate_up_proj.mul_(3.0)  # type: ignore[union-attr]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pruner = Pruner(model, OneShotSchedule(0.25), structure="expert", scope="global")
    pruner.step()
    with torch.no_grad():
        masked = model(TOKENS).logits
    report = shrink(model)
    assert [router.weight.shape[0] for router in _routers(model)] == [EXPERTS, EXPERTS - 4]
    assert report.config == "per_layer"
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS).logits, masked, rtol=0, atol=1e-5)
    model.save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        type(model).from_pretrained(tmp_path)
    loaded = load_shrunk(type(model), tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(TOKENS).logits, masked, rtol=0, atol=1e-5)


@pytest.mark.parametrize("masking", MODES)
def test_a_target_leaving_fewer_than_top_k_experts_is_refused_when_built(masking: str) -> None:
    model = tiny_mixtral()
    check = unchanged(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"its top_k experts \(2; at most"):
            Pruner(
                model, OneShotSchedule(0.9, step=50), structure="expert", scope="layerwise",
                masking=masking,
            )  # fmt: skip
    check()  # no routing hook, no record, no mask


def test_shrink_refuses_a_layer_left_with_fewer_than_top_k_experts() -> None:
    model = tiny_mixtral()
    with torch.no_grad():
        for layer in model.model.layers:  # type: ignore[union-attr]
            layer.mlp.gate.weight[1:] = 0
            layer.mlp.experts.gate_up_proj[1:] = 0
            layer.mlp.experts.down_proj[1:] = 0
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp' to keep at least 2 expert units"):
        shrink(model)
    check()


@pytest.mark.parametrize("build", FAMILIES)
def test_the_load_balancing_loss_runs_on_the_shrunk_model(build: Build) -> None:
    model = _pruned(build, "reparametrize").model
    shrink(model)
    assert model.num_experts == EXPERTS // 2  # type: ignore[union-attr]
    output = model(TOKENS, labels=TOKENS, output_router_logits=True)
    assert output.aux_loss is not None and torch.isfinite(output.aux_loss)


def test_a_router_of_zeros_without_masks_routes_as_it_would() -> None:
    """A router not loaded yet (transformers builds them as zeros) is no pruned router."""
    model = tiny_mixtral()
    Pruner(model, OneShotSchedule(0.5), structure="expert")
    with torch.no_grad():
        for router in _routers(model):
            router.weight.zero_()
        hooked = model(TOKENS).logits
        for router in _routers(model):
            remove_routing(router)
        assert torch.equal(model(TOKENS).logits, hooked)


@pytest.mark.parametrize("masking", MODES)
def test_a_resumed_run_routes_around_the_masked_experts(masking: str) -> None:
    from tensorplay.ao.pruning.masking.restore import restore_pruning

    pruner = _pruned(tiny_mixtral, masking)
    with torch.no_grad():
        masked = pruner.model(TOKENS).logits
    saved, state = pruner.model.state_dict(), pruner.state_dict()
    fresh = tiny_mixtral(seed=1)
    restore_pruning(fresh, saved)
    fresh.load_state_dict(saved)
    with torch.no_grad():
        unhooked = fresh(TOKENS).logits  # no pruner yet: the router computes the zero logits
    resumed = Pruner(
        fresh, OneShotSchedule(0.5), structure="expert", scope="layerwise", masking=masking
    )
    resumed.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(fresh(TOKENS).logits, masked, rtol=0, atol=0)
    assert (unhooked - masked).abs().max() > 1e-3
    assert resumed.step() == 0  # already at the target
