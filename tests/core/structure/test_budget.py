"""Pruning to a parameter budget: ``target_params=`` on ``prune_one_shot`` and the ``Pruner``.

The shrunk model's parameters (every one, tied ones once) are compared exactly with the budget:
at most it, and more than it minus the largest unit's parameters (one unit per layer with
``scope="layerwise"``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import shrink
from tensorplay.ao.pruning.parity.aliases import alias_map
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.pruner.one_shot import prune_one_shot
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule
from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
from tensorplay.ao.pruning.structured.dependency.unit_groups import shapes_of
from tensorplay.ao.pruning.structured.units.budget import budget_keys, plan_global, unit_params
from tests.hf_models import VOCAB, tiny_gpt2, tiny_llama
from tests.model_state import unchanged

BOTH = ("channel", "head")


def _params(model: nn.Module) -> int:
    return sum(param.numel() for param in model.parameters())  # tied ones once


def _unit_sizes(model: nn.Module, kinds: tuple[str, ...]) -> dict[str, int]:
    """Per group of ``kinds``, one unit's parameters, read before pruning."""
    graph, shapes = DependencyGraph(model), shapes_of(model)
    aliases = {name: tied.names[0] for name, tied in alias_map(model).items()}
    return {group.name: unit_params(group, shapes, aliases) for group in graph.groups(kinds)}


def _batches() -> list[Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (2, 12), generator=generator) for _ in range(2)]


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2], ids=["llama-gqa", "gpt2"])
def test_a_fraction_of_the_parameters_lands_within_one_unit_of_the_budget(
    build: Callable[[], nn.Module],
) -> None:
    model = build()
    total, sizes = _params(model), _unit_sizes(model, BOTH)
    budget = int(0.8 * total)
    prune_one_shot(model, _batches(), target_params=0.8, structure=BOTH)
    shrink(model)
    assert budget - max(sizes.values()) < _params(model) <= budget


def test_an_int_budget_counts_every_parameter_embeddings_included() -> None:
    model = tiny_llama()
    sizes = _unit_sizes(model, ("channel",))
    budget = _params(model) - 1000
    prune_one_shot(model, _batches(), target_params=budget, structure="channel")
    shrink(model)
    assert budget - max(sizes.values()) < _params(model) <= budget


def test_layers_are_priced_whole_and_a_budget_between_two_sizes_rounds_down() -> None:
    model = tiny_llama()
    layer = max(_unit_sizes(model, ("layer",)).values())  # 7744: attention, FFN, two norms
    budget = _params(model) - layer - 1  # one layer is not enough: two go
    prune_one_shot(model, _batches(), target_params=budget, structure="layer")
    shrink(model)
    assert len(model.model.layers) == 1 and _params(model) == budget + 1 - layer


def test_units_of_two_kinds_are_standardised_before_being_priced() -> None:
    # Heads score 100x higher raw; standardised, the lowest head is as cheap as the lowest channel.
    channels, heads = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([100.0, 200.0, 300.0])
    keys = budget_keys([channels, heads], ["channel", "head"], [1, 1])
    assert torch.equal(keys[0], keys[1])
    priced = [keys[0] / 10, keys[1] / 40]
    assert plan_global(priced, [10, 40], [2, 2], need=50) == [1, 1]  # the head's -1.22/40 next
    assert plan_global(priced, [10, 40], [2, 2], need=10) == [1, 0]


def test_layerwise_keeps_equal_widths_and_loads_with_plain_from_pretrained(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model = tiny_llama()
    sizes = _unit_sizes(model, BOTH)
    budget = int(0.7 * _params(model))
    prune_one_shot(model, _batches(), target_params=0.7, structure=BOTH, scope="layerwise")
    shrink(model)
    widths = {len(layer.mlp.up_proj.weight) for layer in model.model.layers}
    heads = {len(layer.self_attn.q_proj.weight) for layer in model.model.layers}
    assert len(widths) == 1 and len(heads) == 1
    layers = len(model.model.layers)
    assert budget - layers * max(sizes.values()) < _params(model) <= budget
    model.save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    tokens = _batches()[0]
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens).logits, model(tokens).logits, rtol=0, atol=0)


ONE_OF = "exactly one of `sparsity` and budgets"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        pytest.param({"sparsity": 0.5, "target_params": 0.8}, ONE_OF, id="both"),
        pytest.param({}, ONE_OF, id="neither"),
        pytest.param({"target_params": 1.5}, r"in \(0, 1\], but got 1.5", id="float-above-1"),
        pytest.param({"target_params": 0.0}, r"in \(0, 1\], but got 0.0", id="float-zero"),
        # 29472 - 3 layers * (47 channels * 96 + 1 key/value group * 1536) = 11328
        pytest.param({"target_params": 1000}, "at least 11328, the smallest size", id="too-small"),
        pytest.param({"target_params": 0.8, "structure": "element"}, "or a tuple", id="elements"),
        pytest.param({"target_params": 0.8, "structure": ("layer", "head")}, "holds", id="overlap"),
        pytest.param({"sparsity": 0.5, "structure": BOTH}, "a budget .* with", id="no-budget"),
    ],
)
def test_refusals_name_the_culprit_and_leave_the_model_unchanged(
    arguments: dict[str, object], message: str
) -> None:
    model = tiny_llama()
    check = unchanged(model)
    options: dict[str, object] = {"structure": BOTH, **arguments}
    with pytest.raises(ValueError, match=message):
        prune_one_shot(model, _batches(), **options)  # type: ignore[arg-type]
    check()


def test_a_list_of_kinds_from_yaml_is_a_tuple_and_one_kind_is_that_kind() -> None:
    schedule = OneShotSchedule()
    kinds: object = ["channel", "head"]  # as a LightningCLI YAML file gives them
    assert PrunerConfig(schedule, structure=kinds, target_params=0.5).structure == BOTH  # type: ignore[arg-type]
    assert PrunerConfig(OneShotSchedule(0.5), structure=("head",)).structure == "head"


def test_a_gradual_schedule_reaches_the_budget_at_its_end_step() -> None:
    model = tiny_llama()
    sizes = _unit_sizes(model, BOTH)
    budget = int(0.75 * _params(model))
    schedule = CubicSchedule(end_step=4, frequency=1)
    assert not schedule.has_target() and schedule(4) == 1.0  # the whole way at its end
    pruner = Pruner(model, schedule, structure=BOTH, target_params=0.75)
    removed = []
    for step in range(5):
        pruner.step(step)
        removed.append(pruner.pruned_count())
    assert removed == sorted(removed) and removed[0] < removed[-1]
    assert [step for step, _, count in pruner.history] == sorted({s for s, _, _ in pruner.history})
    assert all(count > 0 for _, _, count in pruner.history) and pruner.history[-1][0] == 4
    assert "(target" not in str(pruner.report())  # the budget counts parameters, not units
    pruner.make_permanent()
    shrink(model)
    assert budget - max(sizes.values()) < _params(model) <= budget


@pytest.mark.parametrize(
    ("schedule", "target_params", "given"),
    [
        pytest.param(CubicSchedule(0.5, end_step=4), 0.8, "both", id="both"),
        pytest.param(CubicSchedule(end_step=4), None, "neither", id="neither"),
        pytest.param(OneShotSchedule(), None, "neither", id="one-shot-neither"),
    ],
)
def test_the_pruner_takes_exactly_one_of_the_schedule_target_and_the_budget(
    schedule: CubicSchedule | OneShotSchedule, target_params: float | None, given: str
) -> None:
    with pytest.raises(ValueError, match=f"final sparsity and budgets .*, but got {given}"):
        PrunerConfig(schedule, structure="channel", target_params=target_params)
