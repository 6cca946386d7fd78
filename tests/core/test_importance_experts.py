"""``importance="reap"`` and ``"frequency"``: experts ranked by the routing they observe,
checked against a loop over the tokens."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import Pruner
from tensorplay.ao.pruning.importance.expert_routing import Reap
from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.pruner.one_shot import calibrate, prune_one_shot
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tests.model_state import unchanged
from tests.moe_models import EXPERTS, TOP_K, tiny_mixtral, tiny_qwen2_moe

Build = Callable[..., nn.Module]
BATCHES = [torch.tensor([[5, 17, 3, 88, 41, 9]]), torch.tensor([[1, 2, 3, 4], [50, 60, 70, 80]])]
FAMILIES = [
    pytest.param(tiny_qwen2_moe, id="qwen2_moe"),  # top-k weights not renormalised by the router
    pytest.param(tiny_mixtral, id="mixtral"),
]


def _moe_inputs(model: nn.Module) -> list[list[Tensor]]:
    """Per layer, the tokens each batch brings to its sparse MLP."""
    seen: list[list[Tensor]] = [[] for _ in model.model.layers]  # type: ignore[union-attr]
    handles = [
        layer.mlp.register_forward_hook(
            lambda module, args, output, index=index: seen[index].append(
                args[0].reshape(-1, args[0].shape[-1])
            )
        )
        for index, layer in enumerate(model.model.layers)  # type: ignore[union-attr]
    ]
    with torch.no_grad():
        for batch in BATCHES:
            model(batch)
    for handle in handles:
        handle.remove()
    return seen


@torch.no_grad()
def _by_hand(mlp: nn.Module, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """REAP and frequency of each expert, one token at a time."""
    router, experts = mlp.gate, mlp.experts
    reap = torch.zeros(EXPERTS, dtype=torch.float64)
    routed = torch.zeros(EXPERTS, dtype=torch.float64)
    for x in tokens:
        probabilities = torch.softmax(router.weight @ x, dim=-1)
        top, chosen = torch.topk(probabilities, TOP_K)
        for weight, expert in zip(top / top.sum(), chosen.tolist(), strict=True):
            gate, up = (experts.gate_up_proj[expert] @ x).chunk(2)
            output = experts.down_proj[expert] @ (nn.functional.silu(gate) * up)
            reap[expert] += float(weight) * float(output.norm())
            routed[expert] += 1
    return torch.where(routed > 0, reap / routed.clamp(min=1), 0), routed / len(tokens)


@pytest.mark.parametrize("build", FAMILIES)
@pytest.mark.parametrize("importance", ["reap", "frequency"])
def test_scores_match_a_loop_over_the_tokens_and_rank_the_experts(
    build: Build, importance: str
) -> None:
    model = build()
    reference = copy.deepcopy(model)
    pruner = Pruner(
        model, OneShotSchedule(0.5), structure="expert", scope="layerwise", importance=importance
    )
    calibrate(pruner, BATCHES)
    inputs = _moe_inputs(reference)
    for index, layer in enumerate(reference.model.layers):  # type: ignore[union-attr]
        expected = _by_hand(layer.mlp, torch.cat(inputs[index]))[importance == "frequency"]
        found = pruner.importance.expert_scores(f"model.layers.{index}.mlp.experts")  # type: ignore[attr-defined]
        torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-7)
    pruner.step()
    for index, layer in enumerate(reference.model.layers):  # type: ignore[union-attr]
        expected = _by_hand(layer.mlp, torch.cat(inputs[index]))[importance == "frequency"]
        lowest = sorted(torch.argsort(expected, stable=True)[: EXPERTS // 2].tolist())
        mask = model.model.layers[index].mlp.gate.weight_mask  # type: ignore[union-attr]
        assert torch.nonzero(mask.sum(dim=1) == 0).flatten().tolist() == lowest


def test_one_shot_defaults_to_reap_per_layer() -> None:
    pruner = prune_one_shot(tiny_mixtral(), BATCHES, 0.25, structure="expert")
    assert (pruner.config.importance, pruner.config.scope) == ("reap", "layerwise")
    assert [row.pruned for row in pruner.report().rows] == [2, 2]


def test_the_sums_resume_with_the_pruner_state() -> None:
    first = Pruner(tiny_mixtral(), OneShotSchedule(0.5), structure="expert", importance="reap")
    calibrate(first, BATCHES[:1])
    second = Pruner(tiny_mixtral(), OneShotSchedule(0.5), structure="expert", importance="reap")
    name = "model.layers.1.mlp.experts"
    assert not torch.equal(
        first.importance.expert_scores(name),  # type: ignore[attr-defined]
        second.importance.expert_scores(name),  # type: ignore[attr-defined]
    )
    second.load_state_dict(first.state_dict())
    calibrate(first, BATCHES[1:])
    calibrate(second, BATCHES[1:])
    assert torch.equal(
        first.importance.expert_scores(name),  # type: ignore[attr-defined]
        second.importance.expert_scores(name),  # type: ignore[attr-defined]
    )


def test_a_step_before_any_token_is_refused_unchanged() -> None:
    pruner = Pruner(tiny_mixtral(), OneShotSchedule(0.5), structure="expert", importance="reap")
    check = unchanged(pruner.model)  # as the build left it: its routing observers, no mask
    with pytest.raises(RuntimeError, match=r"observed at least one token .* calibration pass"):
        pruner.step()
    check()


@pytest.mark.parametrize("importance", ["reap", "frequency"])
def test_expert_scores_are_refused_for_other_structures(importance: str) -> None:
    with pytest.raises(
        ValueError, match=rf"'expert' with importance='{importance}', but got 'channel'"
    ):
        PrunerConfig(OneShotSchedule(0.5), structure="channel", importance=importance)


def test_reap_refuses_a_target_that_is_not_fused_experts() -> None:
    from tensorplay.ao.pruning.targets.tied import Target

    layer = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"gate_up_proj or down_proj of .* 'weight'"):
        Reap().bind([Target(("weight",), ((layer, "weight"),))])


def test_reap_accumulates_in_training_and_a_gradual_schedule_prunes_by_it() -> None:
    from tensorplay.ao.pruning import shrink
    from tensorplay.ao.pruning.pruner.schedules import LinearSchedule

    torch.manual_seed(0)
    model = tiny_mixtral()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    pruner = Pruner(
        model, LinearSchedule(0.5, end_step=4, frequency=2), structure="expert",
        scope="layerwise", importance="reap", masking="inplace",
    )  # fmt: skip
    pruner.attach(optimizer)
    model.train()
    for _ in range(5):
        for batch in BATCHES:
            model(batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        pruner.step()
    assert [(step, count) for step, _, count in pruner.history] == [(2, 4), (4, 4)]
    model.eval()
    with torch.no_grad():
        masked = model(BATCHES[0]).logits
        shrink(model)
        torch.testing.assert_close(model(BATCHES[0]).logits, masked, rtol=0, atol=1e-5)
    assert [layer.mlp.gate.weight.shape[0] for layer in model.model.layers] == [4, 4]  # type: ignore[union-attr]


def test_making_the_pruning_permanent_keeps_the_experts_unrouted() -> None:
    pruner = prune_one_shot(tiny_mixtral(), BATCHES, 0.5, structure="expert", make_permanent=False)
    with torch.no_grad():
        masked = pruner.model(BATCHES[0]).logits
        pruner.make_permanent()
        assert not hasattr(pruner.model.model.layers[0].mlp.gate, "weight_mask")  # type: ignore[union-attr]
        torch.testing.assert_close(pruner.model(BATCHES[0]).logits, masked, rtol=0, atol=0)
