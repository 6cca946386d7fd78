"""A pruner made before ``shrink`` is spent: every method that reads or changes the model through
its targets raises :class:`SpentPrunerError` (before changing anything), its record stays
readable, a new pruner of the shrunk model counts right, and a pruner whose targets shrinking
left alone goes on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import DependencyGraph, Pruner, SpentPrunerError, shrink
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tests.hf_models import tiny_llama
from tests.model_state import unchanged

pytest.importorskip("transformers")

TOKENS = torch.tensor([[5, 3, 9, 1, 7, 2]])

REFUSED: dict[str, Callable[[Pruner, Any], Any]] = {
    "step()": lambda pruner, _: pruner.step(),
    "report()": lambda pruner, _: pruner.report(),
    "pruned_count()": lambda pruner, _: pruner.pruned_count(),
    "total_count()": lambda pruner, _: pruner.total_count(),
    "sparsity()": lambda pruner, _: pruner.sparsity(),
    "apply_masks()": lambda pruner, _: pruner.apply_masks(),
    "reparametrize()": lambda pruner, _: pruner.reparametrize(),
    "make_permanent()": lambda pruner, _: pruner.make_permanent(),
    "snapshot()": lambda pruner, _: pruner.snapshot(),
    "take_snapshot()": lambda pruner, _: pruner.take_snapshot(),
    "rewind()": lambda pruner, state: pruner.rewind(state["snapshot"]),
    "state_dict()": lambda pruner, _: pruner.state_dict(),
    "load_state_dict()": lambda pruner, state: pruner.load_state_dict(state),
    "attach()": lambda pruner, _: pruner.attach(torch.optim.SGD(pruner.model.parameters())),
    "held_by()": lambda pruner, _: pruner.held_by(torch.optim.SGD(pruner.model.parameters())),
    "accumulate()": lambda pruner, _: pruner.accumulate(),
    "mask_gradients()": lambda pruner, _: pruner.mask_gradients(),
}


def _pruned_then_shrunk(masking: str) -> tuple[nn.Module, Pruner, dict[str, Any]]:
    """A tiny Llama with half of each FFN's channels pruned (taylor scores), shrunk; the
    pruner's state saved before."""
    model = tiny_llama()
    pruner = Pruner(
        model, OneShotSchedule(0.5, step=1), structure="channel", scope="layerwise",
        masking=masking, importance="taylor", rewind="init",
    )  # type: ignore[arg-type]  # fmt: skip
    for _ in range(2):
        model(TOKENS, labels=TOKENS).loss.backward()
        pruner.accumulate()
        pruner.step()
    assert pruner.pruned_count() == 72
    state = pruner.state_dict()
    shrink(model)
    assert model.config.intermediate_size == 24
    return model, pruner, state


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
@pytest.mark.parametrize("method", list(REFUSED))
def test_every_method_that_reads_the_targets_refuses_a_spent_pruner(
    masking: str, method: str
) -> None:
    model, pruner, state = _pruned_then_shrunk(masking)
    check = unchanged(model)
    expected = (
        r"Expected a pruner whose targets are as they were when it was made, but shrink\(\) "
        r"has changed \(Linear, 'weight'\) \('model\.layers\.0\.mlp\.gate_proj\.weight'\) "
        rf"since: the pruner is spent, and {re_escape(method)} would use the units, masks and "
        r"counts of the model before shrinking\. Read pruner\.report\(\) and save "
        r"pruner\.state_dict\(\) before shrinking; to prune or count the shrunk model, build a "
        r"new Pruner on it\."
    )
    with pytest.raises(SpentPrunerError, match=expected):
        REFUSED[method](pruner, state)
    check()


def re_escape(text: str) -> str:
    return text.replace("(", r"\(").replace(")", r"\)")


def test_the_record_of_a_spent_pruner_stays_readable() -> None:
    _, pruner, state = _pruned_then_shrunk("inplace")
    assert pruner.history == state["history"] == [(1, 0.5, 72)]
    assert (pruner.last_step, pruner.last_pruned_step) == (1, 1)
    assert pruner.targets == state["targets"]
    assert pruner.target_sparsity() == 0.5
    assert pruner.aliases[pruner.targets[0]] == (pruner.targets[0],)


def test_a_new_pruner_of_the_shrunk_model_counts_its_units() -> None:
    model, spent, _ = _pruned_then_shrunk("inplace")
    fresh = Pruner(model, LinearSchedule(0.5, end_step=2, frequency=2), structure="channel")  # type: ignore[arg-type]
    assert (fresh.total_count(), fresh.pruned_count()) == (72, 0)
    assert fresh.step(2) == 36
    assert [row.numel for row in fresh.report().rows] == [24, 24, 24]
    with pytest.raises(SpentPrunerError):
        spent.report()  # the new pruner does not revive the old one


def test_a_second_shrink_spends_a_pruner_made_after_the_first() -> None:
    model, _, _ = _pruned_then_shrunk("reparametrize")
    second = Pruner(model, OneShotSchedule(0.5), structure="channel", scope="layerwise")  # type: ignore[arg-type]
    assert second.step() == 36
    shrink(model)
    assert model.config.intermediate_size == 12
    with pytest.raises(SpentPrunerError, match=r"report\(\) would use"):
        second.report()


def test_a_pruner_whose_targets_shrinking_left_alone_goes_on() -> None:
    """Heads and channels are pruned by two pruners; shrinking the channels spends the channel
    pruner alone: the head pruner's tensors keep their masks and shapes."""
    model = tiny_llama()
    heads = Pruner(model, OneShotSchedule(0.5), structure="head", scope="layerwise")  # type: ignore[arg-type]
    channels = Pruner(model, OneShotSchedule(0.5), structure="channel", scope="layerwise")  # type: ignore[arg-type]
    assert (heads.step(), channels.step()) == (3, 72)
    shrink(model, groups=DependencyGraph(model).groups("channel"))
    assert heads.pruned_count() == 3
    assert heads.state_dict()["history"] == [(0, 0.5, 3)]
    with pytest.raises(SpentPrunerError):
        channels.pruned_count()


def test_an_attached_optimizer_of_a_spent_pruner_refuses_to_step() -> None:
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    pruner = Pruner(model, OneShotSchedule(0.5), structure="channel", masking="inplace")  # type: ignore[arg-type]
    pruner.attach(optimizer)
    pruner.step()
    shrink(model)
    check = unchanged(model, optimizer)
    with pytest.raises(SpentPrunerError, match="the step of an attached optimizer would use"):
        optimizer.step()
    check()


def test_wanda_stops_observing_a_shrunk_model_and_its_forward_runs() -> None:
    """Wanda's forward hooks stay on the modules until make_permanent; once shrinking changed
    their layer, the narrower inputs feed no score (the pruner is spent) and the forward runs."""
    model = tiny_llama()
    pruner = Pruner(
        model, OneShotSchedule(0.5), structure="channel", scope="layerwise", importance="wanda"
    )  # type: ignore[arg-type]
    model(TOKENS)
    pruner.step()
    model.eval()
    with torch.no_grad():
        masked = model(TOKENS).logits
    observed = pruner.importance.batches()
    shrink(model)
    with torch.no_grad():
        shrunk = model(TOKENS).logits
    torch.testing.assert_close(shrunk, masked, atol=1e-5, rtol=1e-4)
    assert pruner.importance.batches() == observed
