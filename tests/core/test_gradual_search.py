"""``SearchedPruner``: a training run pruned to the mix a search chose under a budget.

Oracles: the one-shot search (``prune_one_shot(..., search=True)`` on a deep copy of the dense
model) chooses the same candidate; at the schedule's end every kind holds the chosen candidate's
units and the shrunk model its parameters; at every step a shrunk copy computes the masked
model's logits; a run resumed from its state ends bit for bit where the unbroken run does; every
refusal leaves the model as it was.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import (
    CubicSchedule,
    LinearSchedule,
    SearchedPruner,
    prune_one_shot,
    schedule_from_dict,
    shrink,
)
from tensorplay.ao.pruning.pruner.gradual_search import KindSchedule
from tensorplay.ao.pruning.structured.units.budget import model_params
from tests.family_models import FAMILY_MODELS
from tests.model_state import unchanged

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _batches(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(3, 97, (2, 16), generator=generator)} for _ in range(2)]


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """One step of causal-LM training on tokens seeded by ``step``."""
    tokens = torch.randint(3, 97, (2, 16), generator=torch.Generator().manual_seed(100 + step))
    model.train()
    model(input_ids=tokens, labels=tokens).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    model.eval()


def _logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def _run(pruner: SearchedPruner, steps: range) -> None:
    optimizer = torch.optim.SGD(pruner.model.parameters(), lr=0.05)
    for step in steps:
        _train_step(pruner.model, optimizer, step)
        pruner.step(step)


CASES = [
    pytest.param("llama", ("layer", "hidden", "channel"), None, id="llama-depth-hidden-ffn"),
    pytest.param("gpt2", ("layer", "hidden", "head"), None, id="gpt2-depth-hidden-heads"),
    pytest.param("qwen3_moe", ("expert", "channel"), {"channel": "magnitude"}, id="qwen3-moe"),
]


@pytest.mark.parametrize(("family", "kinds", "importance"), CASES)
def test_the_run_ends_at_the_candidate_the_one_shot_search_chooses(
    family: str, kinds: tuple[str, ...], importance: dict[str, str] | None
) -> None:
    model = FAMILY_MODELS[family].build()
    batches = _batches(1)
    budget = int(0.75 * model_params(model))
    options = {"target_params": budget, "structure": kinds, "importance": importance}
    oracle = prune_one_shot(
        copy.deepcopy(model), batches, search=True, search_grid=2, make_permanent=False,
        **options,
    )  # fmt: skip
    pruner = SearchedPruner(model, LinearSchedule(end_step=4, frequency=2), batches,
                            search_grid=2, **options)  # fmt: skip
    same = ("allocation", "units", "params", "score", "meets", "chosen")
    assert [{k: r[k] for k in same} for r in pruner.search_report()] == [
        {k: r[k] for k in same} for r in oracle.search_report()
    ]
    assert list(pruner.pruners) == [kind for kind, n in pruner.chosen["units"].items() if n]
    _run(pruner, range(6))
    for kind, pruned in pruner.chosen["units"].items():
        assert (
            pruner.pruners[kind].pruned_count() == pruned if pruned else kind not in pruner.pruners
        )
    assert pruner.kept_params() == pruner.chosen["params"] <= budget
    masked = _logits(model, batches[0])
    assert shrink(model).parameters_after == pruner.chosen["params"]
    torch.testing.assert_close(_logits(model, batches[0]), masked, atol=1e-5, rtol=1e-5)


def test_every_step_is_exactly_shrinkable_and_widths_follow_the_schedule() -> None:
    """Depth goes when the pruner is built; each width reaches its share on the schedule's
    pruning steps; at every step a shrunk copy computes the masked model's logits (magnitude
    scores: a copy made while the pruner observes activations would carry its hooks)."""
    model = FAMILY_MODELS["llama"].build()
    batches = _batches(2)
    mix = {"layer": 0.5, "hidden": 0.25, "channel": 0.25}
    schedule = LinearSchedule(end_step=4, frequency=2)
    pruner = SearchedPruner(model, schedule, batches, target_params=0.5,
                            structure=("layer", "hidden", "channel"), allocation=mix,
                            importance="magnitude")  # fmt: skip
    assert pruner.allocation == mix and [r["allocation"] for r in pruner.search_report()] == [mix]
    assert pruner.pruners["layer"].pruned_count() == pruner.chosen["units"]["layer"] == 1
    assert pruner.dropped and set(pruner.pruners) == {"layer", "hidden", "channel"}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hidden, channel = pruner.pruners["hidden"], pruner.pruners["channel"]
    counts = []
    for step in range(5):
        _train_step(model, optimizer, step)
        pruner.step(step)
        # channels go one by one; hidden channels in multiples of the 4 query heads
        assert channel.pruned_count() == round(
            pruner.shares["channel"] * schedule(step) * channel.total_count()
        )
        counts.append(hidden.pruned_count())
        assert counts[-1] % 4 == 0 and counts == sorted(counts)
        shrunk = copy.deepcopy(model)
        shrink(shrunk)
        torch.testing.assert_close(
            _logits(shrunk, batches[0]), _logits(model, batches[0]), atol=1e-5, rtol=1e-5
        )
    assert hidden.pruned_count() == pruner.chosen["units"]["hidden"] == 4
    assert channel.pruned_count() == pruner.chosen["units"]["channel"]
    assert [entry[:2] for entry in pruner.history] == [
        (2, "channel"),
        (4, "hidden"),
        (4, "channel"),
    ]
    assert pruner.last_step == 4
    assert pruner.kept_params() == pruner.chosen["params"]


def test_a_resumed_run_ends_bit_for_bit_where_the_unbroken_run_does() -> None:
    options = {"target_params": 0.75, "structure": ("layer", "channel"),
               "allocation": {"layer": 0.5, "channel": 0.5}}  # fmt: skip
    schedule = CubicSchedule(end_step=6, frequency=2)
    whole = SearchedPruner(FAMILY_MODELS["llama"].build(), schedule, _batches(), **options)
    _run(whole, range(8))

    first = SearchedPruner(FAMILY_MODELS["llama"].build(), schedule, _batches(), **options)
    _run(first, range(3))
    model_state = copy.deepcopy(first.model.state_dict())
    pruner_state = copy.deepcopy(first.state_dict())

    resumed = SearchedPruner(
        FAMILY_MODELS["llama"].build(), schedule, _batches(),
        target_params=0.75, structure=("layer", "channel"),
        allocation=pruner_state["allocation"],
    )  # fmt: skip
    resumed.reparametrize()
    resumed.model.load_state_dict(model_state)
    resumed.load_state_dict(pruner_state)
    assert resumed.last_step == 2
    _run(resumed, range(3, 8))
    assert resumed.history == whole.history
    expected = whole.model.state_dict()
    found = resumed.model.state_dict()
    assert list(found) == list(expected)
    for key, value in expected.items():
        assert torch.equal(found[key], value), key


def test_a_run_of_depth_alone_counts_its_steps_and_resumes_them() -> None:
    """With the layers alone chosen, no width pruner counts the steps: the run does, and its
    state carries them."""
    options = {"target_params": 0.8, "structure": ("layer", "channel"),
               "allocation": {"layer": 1.0}}  # fmt: skip
    schedule = LinearSchedule(end_step=4, frequency=2)
    pruner = SearchedPruner(FAMILY_MODELS["llama"].build(), schedule, _batches(), **options)
    assert pruner.kinds == ("layer",) and pruner.last_step == -1
    assert [pruner.step() for _ in range(3)] == [0, 0, 0]
    assert pruner.last_step == 2 and pruner.target_sparsity() == schedule(2) == 0.5
    pruner.step(5)
    state = pruner.state_dict()
    assert state["last_step"] == 5 and state["pruners"] == {}
    again = SearchedPruner(FAMILY_MODELS["llama"].build(), schedule, _batches(), **options)
    again.load_state_dict(state)
    assert again.last_step == 5
    with pytest.raises(TypeError, match="`step` to be an int"):
        again.step(1.5)  # type: ignore[arg-type]


def test_the_report_holds_every_kind_and_the_optimizers_reach_every_width() -> None:
    model = FAMILY_MODELS["llama"].build()
    pruner = SearchedPruner(
        model, LinearSchedule(end_step=2), _batches(), target_params=0.5,
        structure=("layer", "hidden", "channel"),
        allocation={"layer": 0.4, "hidden": 0.4, "channel": 0.2},
    )  # fmt: skip
    _run(pruner, range(3))
    report = pruner.report()
    kinds = {row.name.split("/")[0] for row in report.rows}
    assert kinds == {"layer", "hidden", "channel"} and report.target is None
    assert report.pruned == sum(part.report().pruned for part in pruner.pruners.values())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    held = pruner.held_by(optimizer)
    assert len(held) == len(set(held)) and set(held) == {
        name for part in pruner.pruners.values() for name in part.held_by(optimizer)
    }
    pruner.optimizers = [optimizer]
    assert pruner.optimizers == [optimizer]
    assert [pruner.pruners[kind].optimizers for kind in ("hidden", "channel")] == [[optimizer]] * 2
    assert pruner.mode.name == "reparametrize" and not pruner.permanent
    pruner.make_permanent()
    assert pruner.permanent


def test_a_state_of_another_search_is_refused_before_anything_changes() -> None:
    pruner = SearchedPruner(FAMILY_MODELS["llama"].build(), LinearSchedule(end_step=2),
                            _batches(), target_params=0.75, structure=("layer", "channel"),
                            allocation={"layer": 0.5, "channel": 0.5})  # fmt: skip
    state = pruner.state_dict()
    other = {**state, "allocation": {"layer": 0.0, "channel": 1.0}}
    check = unchanged(pruner.model)
    with pytest.raises(ValueError, match=r"allocation=\{'layer': 0.0, 'channel': 1.0\}"):
        pruner.load_state_dict(other)
    with pytest.raises(ValueError, match="version"):
        pruner.load_state_dict({**state, "version": 99})
    check()
    assert pruner.last_step == -1


def test_a_state_one_kind_refuses_is_loaded_by_none() -> None:
    options = {"target_params": 0.5, "structure": ("layer", "hidden", "channel"),
               "allocation": {"layer": 0.4, "hidden": 0.4, "channel": 0.2}}  # fmt: skip
    schedule = LinearSchedule(end_step=2)
    ran = SearchedPruner(FAMILY_MODELS["llama"].build(), schedule, _batches(), **options)
    _run(ran, range(2))
    state = copy.deepcopy(ran.state_dict())
    state["pruners"]["channel"]["version"] = 99  # the last kind loaded refuses its part
    fresh = SearchedPruner(FAMILY_MODELS["llama"].build(), schedule, _batches(), **options)
    assert list(fresh.pruners) == ["layer", "hidden", "channel"]
    before = copy.deepcopy(fresh.state_dict())
    with pytest.raises(ValueError, match="version"):
        fresh.load_state_dict(state)
    assert repr(fresh.state_dict()) == repr(before)
    assert fresh.last_step == -1 and fresh.history == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        pytest.param({"schedule": LinearSchedule(0.5, end_step=2)}, ValueError,
                     "without its own target", id="schedule-with-a-target"),
        pytest.param({"scope": "global"}, ValueError, "layerwise", id="scope"),
        pytest.param({"target_params": None}, ValueError, "Expected a budget", id="no-budget"),
        pytest.param({"target_params": 0.02}, ValueError, "meet every budget", id="unmet"),
        pytest.param({"structure": ("channel",)}, ValueError, "at least two kinds",
                     id="one-kind"),
        pytest.param({"search_score": "mse"}, ValueError, "search_score", id="score"),
        pytest.param({"allocation": {"layer": 1.0}}, ValueError, "either", id="grid-and-mix"),
        pytest.param({"search_grid": None, "allocation": {"layer": 0.5}}, ValueError,
                     "sum to 1", id="bad-mix"),
        pytest.param({"schedule": 3}, TypeError, "Schedule", id="not-a-schedule"),
        pytest.param({"masking": "inplace"}, ValueError, "reparametrize", id="lean-masks"),
    ],
)  # fmt: skip
def test_refusals_leave_the_model_as_it_was(
    kwargs: dict, error: type[Exception], match: str
) -> None:
    model = FAMILY_MODELS["llama"].build()
    arguments = {"schedule": LinearSchedule(end_step=2), "target_params": 0.75,
                 "structure": ("layer", "channel"), "search_grid": 2, **kwargs}  # fmt: skip
    schedule = arguments.pop("schedule")
    check = unchanged(model)
    with pytest.raises(error, match=match):
        SearchedPruner(model, schedule, _batches(), **arguments)
    check()


def test_a_step_one_kind_refuses_is_taken_by_none() -> None:
    """Taylor scores need gradients the loop never accumulated: the channels refuse the
    pruning step, and the hidden width, which could, does not take it either."""
    model = FAMILY_MODELS["llama"].build()
    pruner = SearchedPruner(
        model, LinearSchedule(end_step=2), _batches(), target_params=0.75,
        structure=("hidden", "channel"), allocation={"hidden": 0.5, "channel": 0.5},
        importance={"hidden": "magnitude", "channel": "taylor"},
        forward=lambda model, batch: model(**batch, labels=batch["input_ids"]).loss,
    )  # fmt: skip
    assert set(pruner.pruners) == {"hidden", "channel"}
    _ = pruner.step(0)  # the schedule's target is 0 at step 0: no scores are needed
    check = unchanged(model)
    with pytest.raises(RuntimeError, match=r"accumulated gradients"):
        pruner.step(1)
    check()
    assert [p.last_step for p in pruner.pruners.values()] == [0, 0]
    assert pruner.history == []
    model.train()
    tokens = _batches(5)[0]["input_ids"]
    model(input_ids=tokens, labels=tokens).loss.backward()
    assert pruner.accumulate() > 0  # the channels' Taylor scores now hold gradients
    assert pruner.step(1) > 0
    assert ("channel" in {entry[1] for entry in pruner.history}) and pruner.last_step == 1


def _same(found: object, expected: object) -> bool:
    """Equal plain data, with tensors compared bit for bit."""
    if isinstance(expected, torch.Tensor):
        return isinstance(found, torch.Tensor) and torch.equal(found, expected)
    if isinstance(expected, dict):
        return (
            isinstance(found, dict)
            and list(found) == list(expected)
            and all(_same(found[key], value) for key, value in expected.items())
        )
    if isinstance(expected, (list, tuple)):
        return (
            type(found) is type(expected)
            and len(found) == len(expected)
            and all(_same(f, e) for f, e in zip(found, expected, strict=True))
        )
    return found == expected


def test_a_step_refused_while_a_kind_ranks_is_taken_by_none() -> None:
    """The hidden width ranks what it observed, the channels rank weights, and one weight is
    NaN: the method refuses the channels' scores after the hidden width has pruned its share.
    No kind takes the step (its counter, history, observed statistics and masks), and once the
    weight is mended the run prunes exactly as a run that never saw the NaN."""

    def build() -> SearchedPruner:
        return SearchedPruner(
            FAMILY_MODELS["llama"].build(), LinearSchedule(end_step=2), _batches(),
            target_params=0.75, structure=("hidden", "channel"),
            allocation={"hidden": 0.5, "channel": 0.5},
            importance={"hidden": "activation", "channel": "magnitude"},
        )  # fmt: skip

    def observe(model: nn.Module) -> None:
        with torch.no_grad():
            for batch in _batches(3):
                model(**batch)

    clean, broken = build(), build()
    assert list(broken.pruners) == ["hidden", "channel"]  # the hidden width steps first
    for pruner in (clean, broken):
        observe(pruner.model)
        pruner.step(0)
        observe(pruner.model)
    weight = broken.model.model.layers[0].mlp.gate_proj.weight
    value = weight[3, 0].item()
    with torch.no_grad():
        weight[3, 0] = float("nan")
    before = copy.deepcopy(broken.state_dict())
    check = unchanged(broken.model)
    with pytest.raises(ValueError, match="finite importance scores"):
        broken.step(1)
    check()
    assert _same(broken.state_dict(), before)
    assert [pruner.last_step for pruner in broken.pruners.values()] == [0, 0]

    with torch.no_grad():
        weight[3, 0] = value
    for pruner in (clean, broken):
        pruner.step(1)
        observe(pruner.model)
        pruner.step(2)
    assert broken.history == clean.history and {e[1] for e in clean.history} == {
        "hidden",
        "channel",
    }
    timed = "search_report"  # each search's own timing
    assert _same(
        {key: value for key, value in broken.state_dict().items() if key != timed},
        {key: value for key, value in clean.state_dict().items() if key != timed},
    )
    assert _same(broken.model.state_dict(), clean.model.state_dict())


def test_kind_schedule_scales_the_way_to_the_budget_and_round_trips() -> None:
    part = KindSchedule(CubicSchedule(end_step=8, frequency=2), 0.25)
    assert [part(step) for step in (0, 4, 8, 9)] == [
        0.25 * CubicSchedule(end_step=8, frequency=2)(step) for step in (0, 4, 8, 9)
    ]
    assert part(8) == 0.25
    assert schedule_from_dict(part.to_dict()) == part
    with pytest.raises(ValueError, match="without its own target"):
        KindSchedule(CubicSchedule(0.5, end_step=8), 0.25)
    with pytest.raises(ValueError, match="share"):
        KindSchedule(CubicSchedule(end_step=8), 1.0)
