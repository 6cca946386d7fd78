"""The Pruner: exact counts and masks against an oracle, scopes, minimum density, state, resume,
rewinding, making pruning permanent, validation."""

from __future__ import annotations

import io
import math
import pickle
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking.restore import restore_pruning
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.methods import CustomFromMask
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import (
    CallableSchedule,
    ConstantSchedule,
    CubicSchedule,
    LinearSchedule,
    OneShotSchedule,
)
from tests.model_state import unchanged

TARGETS = ["0.weight", "2.weight", "4.weight"]
SIZES = [48, 40, 15]
TOTAL = sum(SIZES)  # 103


def make_mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5), nn.ReLU(), nn.Linear(5, 3))


def train_step(model: nn.Module, step: int) -> None:
    """A stand-in for an optimizer step: a perturbation that depends on the step alone."""
    generator = torch.Generator().manual_seed(1000 + step)
    params = sorted(model.named_parameters(), key=lambda item: item[0].removesuffix("_orig"))
    with torch.no_grad():
        for _, param in params:
            param.add_(0.05 * torch.randn(param.shape, generator=generator))


def _module(model: nn.Module, fq_name: str) -> tuple[nn.Module, str]:
    module_name, _, name = fq_name.rpartition(".")
    return model.get_submodule(module_name), name


def masks_of(model: nn.Module, targets: Sequence[str] = TARGETS) -> list[Tensor]:
    masks = []
    for fq_name in targets:
        module, name = _module(model, fq_name)
        mask = getattr(module, name + "_mask", None)
        masks.append(torch.ones_like(getattr(module, name)) if mask is None else mask.clone())
    return masks


def values_of(model: nn.Module, targets: Sequence[str] = TARGETS) -> list[Tensor]:
    values = []
    for fq_name in targets:
        module, name = _module(model, fq_name)
        values.append(getattr(module, name + "_orig", getattr(module, name)).detach().clone())
    return values


def zeros(mask: Tensor) -> int:
    return int((mask == 0).sum())


def greedy(
    scores: Sequence[Tensor], masks: Sequence[Tensor], count: int, caps: Sequence[int] | None = None
) -> list[Tensor]:
    """The oracle: unpruned units by increasing |score|, skipping tensors that hit their cap."""
    units = sorted(
        (abs(value), i, j)
        for i, (score, mask) in enumerate(zip(scores, masks, strict=True))
        for j, (value, keep) in enumerate(
            zip(score.flatten().tolist(), mask.flatten().tolist(), strict=True)
        )
        if keep
    )
    new = [mask.clone().flatten() for mask in masks]
    taken = [0] * len(masks)
    for _, i, j in units:
        if count == 0:
            break
        if caps is not None and taken[i] >= caps[i]:
            continue
        new[i][j] = 0
        taken[i] += 1
        count -= 1
    return [flat.view_as(mask) for flat, mask in zip(new, masks, strict=True)]


def assert_masks_equal(got: Iterable[Tensor], expected: Iterable[Tensor]) -> None:
    got, expected = list(got), list(expected)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


# -- exact counts and masks ------------------------------------------------------------------


def test_global_counts_and_masks_match_the_formula_and_oracle_at_every_step() -> None:
    model = make_mlp()
    schedule = CubicSchedule(final_sparsity=0.8, end_step=12, frequency=3)
    pruner = Pruner(model, schedule)
    assert pruner.targets == TARGETS and pruner.total_count() == TOTAL
    expected_masks = masks_of(model)
    done, newly = 0, []
    for step in range(20):
        train_step(model, step)
        scores = values_of(model)
        got = pruner.step()
        if step % 3 == 0 and step <= 12:
            target = 0.8 - 0.8 * (1 - step / 12) ** 3
            count = round(target * TOTAL) - done
            assert got == count
            expected_masks = greedy(scores, expected_masks, count)
            done += count
            newly.append(got)
        else:
            assert got == 0
        assert pruner.last_step == step
        assert_masks_equal(masks_of(model), expected_masks)
        assert pruner.pruned_count() == done
    assert newly == [0, 48, 24, 9, 1]
    assert [(step, pruned) for step, _, pruned in pruner.history] == [
        (3, 48),
        (6, 24),
        (9, 9),
        (12, 1),
    ]
    assert [target for _, target, _ in pruner.history] == pytest.approx([0.4625, 0.7, 0.7875, 0.8])
    assert pruner.last_pruned_step == 12


def test_target_is_held_after_the_end() -> None:
    model = make_mlp()
    pruner = Pruner(model, LinearSchedule(0.5, end_step=4))
    for step in range(5):
        pruner.step(step)
    masks = masks_of(model)
    assert pruner.pruned_count() == round(0.5 * TOTAL)
    for step in range(5, 30):
        train_step(model, step)
        assert pruner.step(step) == 0
        assert pruner.target_sparsity() == 0.5
    assert_masks_equal(masks_of(model), masks)


def test_constant_schedule_prunes_once_then_holds() -> None:
    pruner = Pruner(make_mlp(), ConstantSchedule(0.3, start_step=2))
    assert [pruner.step() for _ in range(6)] == [0, 0, round(0.3 * TOTAL), 0, 0, 0]


def test_layerwise_prunes_each_tensor_to_the_target() -> None:
    model = make_mlp()
    pruner = Pruner(model, LinearSchedule(0.5, end_step=4, frequency=2), scope="layerwise")
    expected_masks = masks_of(model)
    per_tensor = [0, 0, 0]
    for step in range(7):
        train_step(model, step)
        scores = values_of(model)
        got = pruner.step()
        if step in (0, 2, 4):
            target = step / 8
            counts = [round(target * n) - done for n, done in zip(SIZES, per_tensor, strict=True)]
            expected_masks = [
                greedy([s], [m], c)[0]
                for s, m, c in zip(scores, expected_masks, counts, strict=True)
            ]
            per_tensor = [done + c for done, c in zip(per_tensor, counts, strict=True)]
            assert got == sum(counts)
        else:
            assert got == 0
        assert [zeros(m) for m in masks_of(model)] == per_tensor
        assert_masks_equal(masks_of(model), expected_masks)
    # round(0.25 * n) then round(0.5 * n); 7.5 rounds to even.
    assert per_tensor == [24, 20, 8]


def test_step_never_prunes_one_step_twice_and_counts_from_the_last_step() -> None:
    pruner = Pruner(make_mlp(), LinearSchedule(0.6, end_step=6, frequency=2))
    assert pruner.step() == 0 and pruner.last_step == 0
    assert pruner.step(4) == round(0.4 * TOTAL)
    assert pruner.step(4) == 0
    assert pruner.step(2) == 0  # before the last pruned step
    assert pruner.last_step == 2 and pruner.last_pruned_step == 4
    assert pruner.step(6) == round(0.6 * TOTAL) - round(0.4 * TOTAL)
    assert pruner.step() == 0 and pruner.last_step == 7


def test_importance_fn_ranks_units() -> None:
    model = make_mlp()

    def largest_first(module: nn.Module, name: str) -> Tensor:
        return 1.0 / (getattr(module, name + "_orig", getattr(module, name)).abs() + 1e-3)

    pruner = Pruner(model, OneShotSchedule(0.4), importance_fn=largest_first)
    scores = [1.0 / (v.abs() + 1e-3) for v in values_of(model)]
    assert pruner.step() == round(0.4 * TOTAL)
    assert_masks_equal(masks_of(model), greedy(scores, masks_of(make_mlp()), round(0.4 * TOTAL)))


def test_importance_fn_with_wrong_shape_leaves_the_model_alone() -> None:
    model = make_mlp()
    check = unchanged(model)
    pruner = Pruner(model, OneShotSchedule(0.4), importance_fn=lambda m, n: torch.ones(3))
    with pytest.raises(
        ValueError,
        match=r"Expected `importance_fn` to return a tensor of shape \(8, 6\) for '0.weight', "
        r"but got \(3,\).",
    ):
        pruner.step()
    check()
    assert pruner.last_step == -1 and pruner.last_pruned_step == -1


def test_random_method_prunes_exact_counts_reproducibly() -> None:
    masks = []
    for _ in range(2):
        model = make_mlp()
        pruner = Pruner(model, CubicSchedule(0.9, end_step=4), method="random_unstructured")
        torch.manual_seed(7)
        counts = [pruner.step() for _ in range(6)]
        assert sum(counts) == round(0.9 * TOTAL)
        assert counts == [
            round(CubicSchedule(0.9, end_step=4)(t) * TOTAL)
            - round(CubicSchedule(0.9, end_step=4)(t - 1) * TOTAL)
            if 0 < t <= 4
            else 0
            for t in range(6)
        ]
        masks.append(masks_of(model))
    assert_masks_equal(masks[0], masks[1])


# -- minimum density -------------------------------------------------------------------------


def small_last_layers() -> nn.Sequential:
    """Layer 4 holds the smallest weights and layer 2 the next, so global pruning empties them."""
    model = make_mlp()
    with torch.no_grad():
        model[2].weight.mul_(1e-4)
        model[4].weight.mul_(1e-8)
    return model


@pytest.mark.parametrize(
    ("target", "expected_counts"),
    [
        pytest.param(0.437, [1, 32, 12], id="second-cap-found-after-the-first"),
        pytest.param(0.3, [0, 19, 12], id="one-cap-redistributed"),
        pytest.param(0.7, [28, 32, 12], id="two-caps"),
        pytest.param(0.8, [38, 32, 12], id="all-caps-exactly"),
    ],
)
def test_min_density_caps_each_tensor_and_redistributes(
    target: float, expected_counts: list[int]
) -> None:
    model = small_last_layers()
    caps = [n - math.ceil(0.2 * n - 1e-9) for n in SIZES]  # keep 10, 8, 3
    assert caps == [38, 32, 12]
    scores = values_of(model)
    pruner = Pruner(model, OneShotSchedule(target), min_density=0.2)
    count = round(target * TOTAL)
    assert pruner.step() == count
    expected = greedy(scores, masks_of(small_last_layers()), count, caps)
    assert_masks_equal(masks_of(model), expected)
    assert [zeros(m) for m in masks_of(model)] == expected_counts
    assert all((n - z) / n >= 0.2 for n, z in zip(SIZES, expected_counts, strict=True))


def test_min_density_prunes_fewer_than_asked_when_every_tensor_is_capped() -> None:
    model = small_last_layers()
    pruner = Pruner(model, OneShotSchedule(0.95), min_density=0.2)
    assert pruner.step() == 38 + 32 + 12
    assert [zeros(m) for m in masks_of(model)] == [38, 32, 12]
    assert pruner.sparsity() < pruner.target_sparsity() == 0.95


def test_min_density_over_several_steps_with_random_method() -> None:
    model = make_mlp()
    pruner = Pruner(
        model, LinearSchedule(0.9, end_step=3), method="random_unstructured", min_density=0.3
    )
    torch.manual_seed(0)
    for _ in range(5):
        pruner.step()
        for n, mask in zip(SIZES, masks_of(model), strict=True):
            assert (n - zeros(mask)) / n >= 0.3
    assert [zeros(m) for m in masks_of(model)] == [48 - 15, 40 - 12, 15 - 5]


def test_min_density_layerwise_and_exact_in_float_arithmetic() -> None:
    model = nn.Sequential(nn.Linear(10, 3), nn.Linear(3, 10))  # 30 units each
    pruner = Pruner(model, OneShotSchedule(0.95), scope="layerwise", min_density=0.1)
    # 0.1 * 30 is 3.0000000000000004 in floats: keeping 3 units is density 0.1, allowed.
    assert pruner.step() == 27 * 2
    assert [zeros(m) for m in masks_of(model, ["0.weight", "1.weight"])] == [27, 27]


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    min_density=st.floats(0.0, 0.9),
    targets=st.lists(st.floats(0.0, 0.99), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_min_density_matches_the_greedy_oracle(
    sizes: list[int], min_density: float, targets: list[float], seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    values = (torch.randperm(sum(sizes), generator=generator) + 1.0) / sum(sizes)
    values *= torch.randint(0, 2, values.shape, generator=generator) * 2.0 - 1.0  # distinct |v|
    model = nn.ModuleList(nn.Linear(n, 1, bias=False) for n in sizes)
    with torch.no_grad():
        for layer, chunk in zip(model, values.split(sizes), strict=True):
            layer.weight.copy_(chunk.view(1, -1))
    names = [f"{i}.weight" for i in range(len(sizes))]
    targets = sorted(targets)
    schedule = CallableSchedule(lambda step: targets[min(step, len(targets) - 1)])
    pruner = Pruner(model, schedule, min_density=min_density)
    keep = [next(k for k in range(n + 1) if k / n >= min_density) for n in sizes]
    expected = masks_of(model, names)
    for step in range(len(targets)):
        done = [zeros(m) for m in expected]
        caps = [n - k - d for n, k, d in zip(sizes, keep, done, strict=True)]
        count = min(round(targets[step] * sum(sizes)) - sum(done), sum(caps))
        expected = greedy(values_of(model, names), expected, max(count, 0), caps)
        assert pruner.step() == max(count, 0)
        assert_masks_equal(masks_of(model, names), expected)
        for n, k, mask in zip(sizes, keep, masks_of(model, names), strict=True):
            assert n - zeros(mask) >= k


# -- reporting -------------------------------------------------------------------------------


def test_counts_sparsity_and_report() -> None:
    model = make_mlp()
    pruner = Pruner(model, OneShotSchedule(0.5, step=1))
    assert (pruner.pruned_count(), pruner.total_count(), pruner.sparsity()) == (0, TOTAL, 0.0)
    assert pruner.target_sparsity() == 0.0 and pruner.target_sparsity(1) == 0.5
    pruner.step()
    pruner.step()
    assert pruner.pruned_count() == 52 and pruner.sparsity() == 52 / TOTAL
    report = pruner.report()
    assert [row.name for row in report.rows] == TARGETS
    assert [row.pruned for row in report.rows] == [zeros(m) for m in masks_of(model)]
    assert (report.pruned, report.total, report.target) == (52, TOTAL, 0.5)


# -- state -----------------------------------------------------------------------------------


def test_state_dict_round_trip() -> None:
    schedule = CubicSchedule(0.8, end_step=12, frequency=3)
    first = Pruner(make_mlp(), schedule, min_density=0.1)
    for _ in range(8):
        first.step()
    second = Pruner(make_mlp(), schedule, min_density=0.1)
    assert second.state_dict() != first.state_dict()
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    second.load_state_dict(state)
    assert second.state_dict() == first.state_dict()
    assert state == {
        "version": 5,
        "step": 7,
        "last_pruned_step": 6,
        "targets": TARGETS,
        "schedule": schedule.to_dict(),
        "method": "l1_unstructured",
        "scope": "global",
        "min_density": 0.1,
        "rewind": "none",
        "rewind_step": 0,
        "seed": None,
        "history": [(3, schedule(3), 48), (6, schedule(6), 24)],
        "permanent": False,
        "snapshot": None,
        "masking": "reparametrize",
        "importance": "magnitude",
        "importance_state": {},
        "structure": "element",
        "multiple_of": 1,
    }


@pytest.mark.parametrize("stop_after", [6, 7], ids=["on-pruning-step", "between-pruning-steps"])
def test_resume_mid_schedule_equals_an_uninterrupted_run(stop_after: int) -> None:
    schedule = CubicSchedule(0.8, end_step=12, frequency=3)
    steps = 16

    model = make_mlp()
    pruner = Pruner(model, schedule)
    for step in range(steps):
        train_step(model, step)
        pruner.step()

    interrupted = make_mlp()
    interrupted_pruner = Pruner(interrupted, schedule)
    for step in range(stop_after + 1):
        train_step(interrupted, step)
        interrupted_pruner.step()
    buffer = io.BytesIO()
    torch.save(
        {"model": interrupted.state_dict(), "pruner": interrupted_pruner.state_dict()}, buffer
    )
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)

    resumed = make_mlp(seed=123)
    assert restore_pruning(resumed, checkpoint["model"]) == TARGETS
    resumed.load_state_dict(checkpoint["model"], strict=True)
    resumed_pruner = Pruner(resumed, schedule)
    assert resumed_pruner.state_dict() != checkpoint["pruner"]
    resumed_pruner.load_state_dict(checkpoint["pruner"])
    for step in range(stop_after + 1, steps):
        train_step(resumed, step)
        resumed_pruner.step()

    assert resumed_pruner.state_dict() == pruner.state_dict()
    final, expected = resumed.state_dict(), model.state_dict()
    assert list(final) == list(expected)
    for key in expected:
        assert torch.equal(final[key], expected[key]), key


def test_resumed_pruner_does_not_prune_the_last_pruned_step_again() -> None:
    schedule = CubicSchedule(0.8, end_step=12, frequency=3)
    model = make_mlp()
    pruner = Pruner(model, schedule)
    for _ in range(7):
        pruner.step()
    resumed = Pruner(model, schedule)
    resumed.load_state_dict(pruner.state_dict())
    masks = masks_of(model)
    assert resumed.step(6) == 0
    assert_masks_equal(masks_of(model), masks)
    assert resumed.step() == 0 and resumed.last_step == 7


def test_state_dict_of_an_unserialisable_schedule() -> None:
    pruner = Pruner(make_mlp(), CallableSchedule(lambda step: 0.5))
    assert pruner.state_dict()["schedule"] is None
    other = Pruner(make_mlp(), CallableSchedule(lambda step: 0.5))
    other.load_state_dict(pruner.state_dict())


def test_load_state_dict_warns_about_another_configuration() -> None:
    first = Pruner(make_mlp(), OneShotSchedule(0.5))
    second = Pruner(make_mlp(), OneShotSchedule(0.6), scope="layerwise")
    with pytest.warns(UserWarning, match=r"another configuration \(schedule: .*scope: 'global'"):
        second.load_state_dict(first.state_dict())
    assert second.schedule == OneShotSchedule(0.6) and second.scope == "layerwise"


def _state(**changes: object) -> dict[str, object]:
    first = Pruner(make_mlp(), OneShotSchedule(0.5))
    first.step()
    state = first.state_dict()
    state.update(changes)
    return state


@pytest.mark.parametrize(
    ("state", "error", "match"),
    [
        pytest.param(
            _state(version=6),
            ValueError,
            "Expected a pruner state of version 1, 2, 3, 4 or 5, but got version 6.",
            id="version",
        ),
        pytest.param(
            {k: v for k, v in _state().items() if k != "history"},
            ValueError,
            r"\['history'\] are missing and \[\] are unknown",
            id="missing-key",
        ),
        pytest.param(
            _state(extra=1), ValueError, r"\[\] are missing and \['extra'\] are unknown", id="extra"
        ),
        pytest.param(
            _state(targets=["0.weight"]),
            ValueError,
            r"Expected the state's targets to be the pruner's, \['0.weight', '2.weight', "
            r"'4.weight'\], but got \['0.weight'\].",
            id="targets",
        ),
        pytest.param(
            _state(step="3"),
            ValueError,
            "Expected `step` to be an int >= -1, but got '3'.",
            id="step",
        ),
        pytest.param(
            _state(last_pruned_step=-2),
            ValueError,
            "Expected `last_pruned_step` to be an int >= -1, but got -2.",
            id="last-pruned-step",
        ),
        pytest.param(
            _state(history=[(1, 0.5)]),
            ValueError,
            r"Expected `history` entries to be \(step, target, pruned\), but got \(1, 0.5\).",
            id="history",
        ),
        pytest.param(
            _state(permanent="no"),
            ValueError,
            "Expected `permanent` to be a bool, but got 'no'.",
            id="permanent",
        ),
        pytest.param([1], TypeError, "Expected `state` to be a mapping", id="not-a-mapping"),
        pytest.param(_state(seed=-1), ValueError, "Expected `seed` to be an int >= 0", id="seed"),
        pytest.param(
            _state(snapshot={"9.weight": torch.zeros(1)}),
            ValueError,
            r"Expected the keys of `snapshot` to be targets of the pruner, but got '9.weight'",
            id="snapshot-name",
        ),
        pytest.param(
            _state(snapshot={"0.weight": torch.zeros(2)}),
            ValueError,
            r"Expected `snapshot\['0.weight'\]` to be a tensor of shape \(8, 6\), but got \(2,\)",
            id="snapshot-shape",
        ),
    ],
)
def test_load_state_dict_errors_leave_the_pruner_alone(
    state: object, error: type[Exception], match: str
) -> None:
    pruner = Pruner(make_mlp(), OneShotSchedule(0.5))
    before, check = pruner.state_dict(), unchanged(pruner.model)
    with pytest.raises(error, match=match):
        pruner.load_state_dict(state)  # type: ignore[arg-type]
    assert pruner.state_dict() == before
    check()


# -- rewinding and making permanent ----------------------------------------------------------


def test_rewind_restores_values_and_keeps_masks() -> None:
    model = make_mlp()
    pruner = Pruner(model, CubicSchedule(0.7, end_step=4))
    initial = pruner.snapshot()
    assert list(initial) == TARGETS
    for step in range(6):
        train_step(model, step)
        pruner.step()
    masks = masks_of(model)
    assert not torch.equal(values_of(model)[0], initial["0.weight"])
    pruner.rewind(initial)
    assert_masks_equal(values_of(model), [initial[name] for name in TARGETS])
    assert_masks_equal(masks_of(model), masks)
    assert torch.equal(model[0].weight, initial["0.weight"] * masks[0])
    out = model(torch.ones(1, 6))
    assert torch.equal(model[0].weight, initial["0.weight"] * masks[0])
    assert out.shape == (1, 3)


def test_rewind_a_subset_and_snapshot_is_a_copy() -> None:
    model = make_mlp()
    pruner = Pruner(model, OneShotSchedule(0.5))
    pruner.step()
    snapshot = pruner.snapshot()
    with torch.no_grad():
        model[0].weight_orig.add_(1.0)
        model[2].weight_orig.add_(1.0)
    assert not torch.equal(snapshot["0.weight"], model[0].weight_orig)
    pruner.rewind({"2.weight": snapshot["2.weight"]})
    assert torch.equal(model[2].weight_orig, snapshot["2.weight"])
    assert torch.equal(model[0].weight_orig, snapshot["0.weight"] + 1.0)


@pytest.mark.parametrize(
    ("state", "match"),
    [
        pytest.param(
            {"0.bias": torch.zeros(8)},
            r"Expected the keys of `state` to be targets of the pruner, but got '0.bias'",
            id="not-a-target",
        ),
        pytest.param(
            {"2.weight": torch.zeros(5, 8), "0.weight": torch.zeros(6, 8)},
            r"Expected `state\['0.weight'\]` to be a tensor of shape \(8, 6\), but got \(6, 8\).",
            id="shape",
        ),
        pytest.param(
            {"0.weight": 1.0},
            r"Expected `state\['0.weight'\]` to be a tensor of shape \(8, 6\), but got 1.0.",
            id="not-a-tensor",
        ),
    ],
)
def test_rewind_errors_leave_the_model_alone(state: dict[str, Tensor], match: str) -> None:
    model = make_mlp()
    pruner = Pruner(model, OneShotSchedule(0.5))
    pruner.step()
    check = unchanged(model)
    with pytest.raises(ValueError, match=match):
        pruner.rewind(state)
    check()


def test_rewind_rejects_non_mapping() -> None:
    pruner = Pruner(make_mlp(), OneShotSchedule(0.5))
    check = unchanged(pruner.model)
    with pytest.raises(TypeError, match="Expected `state` to be a mapping of name to tensor"):
        pruner.rewind([1])  # type: ignore[arg-type]
    check()


def test_make_permanent() -> None:
    model = make_mlp()
    pruner = Pruner(model, CubicSchedule(0.7, end_step=4))
    for _ in range(5):
        pruner.step()
    masks = masks_of(model)
    inputs = torch.randn(4, 6)
    expected = model(inputs)
    counts = (pruner.pruned_count(), pruner.sparsity(), str(pruner.report()))
    assert counts[0] == sum(zeros(m) for m in masks) > 0
    pruner.make_permanent()
    assert pruner.permanent and pruner.state_dict()["permanent"] is True
    assert sorted(model.state_dict()) == sorted(nn.Sequential(*make_mlp()).state_dict())
    assert sum(len(m._forward_pre_hooks) for m in model.modules()) == 0
    assert torch.equal(model(inputs), expected)
    for fq_name, mask in zip(TARGETS, masks, strict=True):
        assert torch.equal(model.get_parameter(fq_name) == 0, mask == 0)
    # The zeros of the permanent tensors are counted: the same numbers as before.
    assert (pruner.pruned_count(), pruner.sparsity(), str(pruner.report())) == counts
    check = unchanged(model)
    with pytest.raises(RuntimeError, match=r"make_permanent\(\) was called"):
        pruner.step()
    with pytest.raises(RuntimeError, match="no `_orig` parameters left to rewind"):
        pruner.rewind({})
    check()


def test_make_permanent_skips_targets_never_pruned() -> None:
    model = make_mlp()
    pruner = Pruner(model, OneShotSchedule(0.5, step=10))
    pruner.make_permanent()
    assert pruner.permanent and list(model.state_dict()) == list(make_mlp().state_dict())


# -- validation ------------------------------------------------------------------------------


def tied_model() -> nn.Sequential:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight
    return model


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        pytest.param(
            {"schedule": 0.5},
            TypeError,
            "Expected `schedule` to be a Schedule, but got 0.5.",
            id="schedule",
        ),
        pytest.param(
            {"scope": "local"},
            ValueError,
            "Expected `scope` to be 'global', 'layerwise' or 'row', but got 'local'.",
            id="scope",
        ),
        pytest.param(
            {"min_density": 1.0},
            ValueError,
            r"Expected `min_density` to be a float in \[0, 1\), but got 1.0.",
            id="min-density-one",
        ),
        pytest.param(
            {"min_density": -0.1},
            ValueError,
            r"Expected `min_density` to be a float in \[0, 1\), but got -0.1.",
            id="min-density-negative",
        ),
        pytest.param(
            {"min_density": "0.1"},
            TypeError,
            "Expected `min_density` to be a float in",
            id="min-density-str",
        ),
        pytest.param(
            {"importance_fn": "abs"},
            TypeError,
            "Expected `importance_fn` to be callable or None, but got 'abs'.",
            id="importance-fn",
        ),
        pytest.param(
            {"method": "ln_structured"},
            ValueError,
            "Expected `method` to be an unstructured pruning method",
            id="structured-method",
        ),
        pytest.param(
            {"parameters": []},
            ValueError,
            "Expected `parameters` to name at least one tensor, but got an empty sequence.",
            id="empty-parameters",
        ),
        pytest.param(
            {"parameters": ["0.weight", "9.weight"]},
            ValueError,
            "Expected '9.weight' to name a parameter, but the model has no module '9'.",
            id="unknown-parameter",
        ),
    ],
)
def test_constructor_validation_leaves_the_model_alone(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    model = make_mlp()
    check = unchanged(model)
    arguments: dict[str, object] = {"schedule": OneShotSchedule(0.5), **kwargs}
    with pytest.raises(error, match=match):
        Pruner(model, **arguments)  # type: ignore[arg-type]
    check()


def test_empty_default_selection() -> None:
    model = nn.Sequential(nn.ReLU())
    check = unchanged(model)
    with pytest.raises(ValueError, match="Expected the selection to match at least one parameter"):
        Pruner(model, OneShotSchedule(0.5))
    check()


def test_names_of_one_tied_parameter_select_it_once() -> None:
    for names in (["0.weight", "1.weight"], ["1.weight"], ["1.weight", "0.weight"]):
        pruner = Pruner(tied_model(), OneShotSchedule(0.5), parameters=names)
        assert pruner.targets == ["0.weight"]
        assert pruner.aliases == {"0.weight": ("0.weight", "1.weight")}
    assert Pruner(tied_model(), OneShotSchedule(0.5)).targets == ["0.weight"]


def test_a_single_name_is_one_target() -> None:
    assert Pruner(make_mlp(), OneShotSchedule(0.5), parameters="2.weight").targets == ["2.weight"]


@pytest.mark.parametrize(
    ("step", "error", "match"),
    [
        pytest.param(-1, ValueError, "Expected `step` to be an int >= 0, but got -1.", id="neg"),
        pytest.param(1.0, TypeError, "Expected `step` to be an int, but got 1.0.", id="float"),
        pytest.param(True, TypeError, "Expected `step` to be an int, but got True.", id="bool"),
    ],
)
def test_step_validation(step: object, error: type[Exception], match: str) -> None:
    pruner = Pruner(make_mlp(), OneShotSchedule(0.5))
    check = unchanged(pruner.model)
    with pytest.raises(error, match=match):
        pruner.step(step)  # type: ignore[arg-type]
    assert pruner.last_step == -1
    check()


def test_min_density_steps_keep_one_mask_per_tensor_alive() -> None:
    model = small_last_layers()
    pruner = Pruner(model, LinearSchedule(0.9, end_step=4), min_density=0.3)
    for step in range(5):
        pruner.step(step)
    assert len(pruner.history) == 4  # pruned on four steps, and yet one hook per tensor:
    for module, name in pruner.pairs:
        buffer = getattr(module, name + "_mask")
        hook = next(iter(module._forward_pre_hooks.values()))
        assert type(hook) is CustomFromMask and hook.mask is buffer


def test_pruned_count_follows_every_change_of_the_masks() -> None:
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 4))
    pruner = Pruner(model, OneShotSchedule(0.5))
    pruner.step()
    assert pruner.pruned_count() == 25
    with torch.no_grad():
        model[0].weight_mask[0, 0] = 1 - model[0].weight_mask[0, 0]  # an in-place edit
    expected = int((model[0].weight_mask == 0).sum() + (model[1].weight_mask == 0).sum())
    assert pruner.pruned_count() == expected != 25
    model[1].weight_mask = torch.zeros_like(model[1].weight_mask)  # a new buffer
    assert pruner.pruned_count() == int((model[0].weight_mask == 0).sum()) + 20
    restored = pickle.loads(pickle.dumps(pruner))
    assert restored.pruned_count() == pruner.pruned_count()


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda mask: mask.data.fill_(1), id="data-fill"),
        pytest.param(lambda mask: mask.data.copy_(torch.ones_like(mask)), id="data-copy"),
        pytest.param(lambda mask: mask.detach().fill_(1), id="detach-fill"),
    ],
)
def test_counts_and_the_next_step_follow_edits_that_leave_no_version(
    edit: Callable[[Tensor], object],
) -> None:
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 4))
    pruner = Pruner(model, LinearSchedule(0.5, end_step=2))
    pruner.step(0)
    pruner.step(1)
    assert pruner.pruned_count() == 12  # round(0.25 * 50)
    edit(model[0].weight_mask)  # unpruned again, and the version counter does not move
    left = int((model[1].weight_mask == 0).sum())
    assert pruner.pruned_count() == left == pruner.report().pruned
    assert pruner.step(2) == 25 - left  # the schedule's target is reached from the real masks
    assert pruner.pruned_count() == 25


# -- policy: rewinding, seeding, optimizer reset, methods that count themselves ---------------

# Prunes at steps 2 and 4 (step 0's target is 0).
EVERY_OTHER = LinearSchedule(0.5, end_step=4, frequency=2)


def sgd_step(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    generator = torch.Generator().manual_seed(step)
    x, y = torch.randn(4, 6, generator=generator), torch.randn(4, 3, generator=generator)
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def run(pruner: Pruner, optimizer: torch.optim.Optimizer, steps: range) -> list[list[Tensor]]:
    """Train and step the pruner; the targets' values after each step."""
    values = []
    for step in steps:
        sgd_step(pruner.model, optimizer, step)
        pruner.step(step)
        values.append(values_of(pruner.model))
    return values


@pytest.mark.parametrize(("rewind", "rewind_step"), [("init", 0), ("step", 1)])
def test_rewind_restores_the_snapshot_after_each_pruning_event(rewind, rewind_step) -> None:
    model = make_mlp()
    initial = values_of(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    pruner = Pruner(model, EVERY_OTHER, rewind=rewind, rewind_step=rewind_step)

    values = run(pruner, optimizer, range(6))

    reference = initial if rewind == "init" else values[rewind_step]
    assert [(step, count) for step, _, count in pruner.history] == [(2, 26), (4, 26)]
    for step in (2, 4):  # pruning events: rewound
        assert_masks_equal(values[step], reference)
    for step in (3, 5):  # trained again after the rewind
        assert all(not torch.equal(a, b) for a, b in zip(values[step], reference, strict=True))
    assert not torch.equal(model[0].bias, make_mlp()[0].bias)  # not a target: never rewound


def test_without_rewind_the_pruning_event_keeps_the_trained_values() -> None:
    model = make_mlp()
    initial = values_of(model)
    pruner = Pruner(model, EVERY_OTHER)
    values = run(pruner, torch.optim.SGD(model.parameters(), lr=0.1), range(3))
    assert all(not torch.equal(a, b) for a, b in zip(values[2], initial, strict=True))


def test_take_snapshot_replaces_the_initial_values() -> None:
    model = make_mlp()
    pruner = Pruner(model, EVERY_OTHER, rewind="init")
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(0.5)  # pretrained weights loaded after the pruner was made
    pruner.take_snapshot()
    run(pruner, torch.optim.SGD(model.parameters(), lr=0.1), range(3))
    assert all(value.unique().tolist() == [0.5] for value in values_of(model))


def test_rewind_step_without_its_snapshot_fails_and_leaves_the_model() -> None:
    model = make_mlp()
    pruner = Pruner(model, EVERY_OTHER, rewind="step", rewind_step=1)
    check = unchanged(model)
    with pytest.raises(RuntimeError, match="rewind snapshot of step 1 to be taken or loaded"):
        pruner.step(2)
    check()
    assert pruner.last_step == -1


def test_a_refused_step_keeps_no_snapshot_it_took() -> None:
    """The snapshot due at a step whose scores the method refuses (a NaN weight) goes with the
    step: once the weight is mended, the step snapshots and rewinds to the mended values, as a
    run that never saw the NaN does."""
    clean, broken = make_mlp(), make_mlp()
    pruners = [Pruner(model, OneShotSchedule(0.5, step=1), rewind="step", rewind_step=1)
               for model in (clean, broken)]  # fmt: skip
    for pruner in pruners:
        pruner.step(0)
    value = broken[0].weight[0, 0].item()
    with torch.no_grad():
        broken[0].weight[0, 0] = float("nan")
    check = unchanged(broken)
    with pytest.raises(ValueError, match="finite"):
        pruners[1].step(1)
    check()
    assert pruners[1].state_dict()["snapshot"] is None
    with torch.no_grad():
        broken[0].weight[0, 0] = value
    for pruner in pruners:
        pruner.step(1)
    assert pruners[1].history == pruners[0].history
    for found, expected in zip(values_of(broken), values_of(clean), strict=True):
        assert torch.equal(found, expected)


def random_pruner(model: nn.Module, seed: int | None) -> Pruner:
    return Pruner(model, EVERY_OTHER, method="random_unstructured", seed=seed)


def test_seeded_random_masks_do_not_depend_on_or_disturb_the_global_rng() -> None:
    masks = []
    for global_seed in (1, 2):
        model = make_mlp()
        pruner = random_pruner(model, seed=7)
        torch.manual_seed(global_seed)
        rng = torch.get_rng_state()
        for step in range(5):
            pruner.step(step)
        assert torch.equal(torch.get_rng_state(), rng)
        masks.append(masks_of(model))
    assert_masks_equal(masks[0], masks[1])
    assert zeros(torch.cat([m.flatten() for m in masks[0]])) == round(0.5 * TOTAL)


def test_unseeded_random_masks_follow_the_global_rng() -> None:
    masks = []
    for global_seed in (1, 2):
        model = make_mlp()
        torch.manual_seed(global_seed)
        random_pruner(model, seed=None).step(2)
        masks.append(masks_of(model))
    assert any(not torch.equal(a, b) for a, b in zip(*masks, strict=True))


def test_seeded_random_pruning_resumes_with_the_saved_seed() -> None:
    model = make_mlp()
    pruner = random_pruner(model, seed=7)
    for step in range(5):
        pruner.step(step)

    interrupted = make_mlp()
    first = random_pruner(interrupted, seed=7)
    for step in range(3):
        first.step(step)
    state = first.state_dict()
    resumed = make_mlp()
    restore_pruning(resumed, interrupted.state_dict())
    resumed.load_state_dict(interrupted.state_dict())
    second = random_pruner(resumed, seed=99)  # the saved seed wins
    second.load_state_dict(state)
    for step in range(3, 5):
        second.step(step)

    assert second.seed == 7
    assert_masks_equal(masks_of(resumed), masks_of(model))


@pytest.mark.parametrize(("reset", "expected"), [(True, [6, 6, 0, 6, 0]), (False, [6] * 5)])
def test_optimizer_state_is_cleared_after_pruning_events(reset, expected) -> None:
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pruner = Pruner(model, EVERY_OTHER, optimizers=[optimizer] if reset else ())
    states = []
    for step in range(5):
        sgd_step(model, optimizer, step)
        pruner.step(step)
        states.append(len(optimizer.state))  # momentum buffers of the 6 parameters
    assert states == expected


class TwoOfFour(BasePruningMethod):
    """2:4 sparsity: in each group of 4 consecutive units of a row, the 2 smallest |scores|
    are pruned. It decides its own count: its constructor takes no `amount`."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        groups = t.detach().abs().reshape(-1, 4)
        smallest = groups.topk(2, dim=1, largest=False).indices
        mask = torch.ones_like(groups).scatter_(1, smallest, 0.0)
        return mask.reshape(t.shape) * default_mask


def test_a_method_without_amount_prunes_each_target_itself_on_pruning_steps() -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 4))
    pruner = Pruner(model, OneShotSchedule(0.9, step=1), method=TwoOfFour)

    assert [pruner.step(step) for step in range(3)] == [0, 24, 0]

    for module in (model[0], model[2]):
        groups = module.weight_mask.reshape(-1, 4)
        assert groups.sum(dim=1).tolist() == [2.0] * groups.shape[0]
        kept = module.weight_orig.abs().reshape(-1, 4) * groups
        pruned = module.weight_orig.abs().reshape(-1, 4) * (1 - groups)
        assert bool((pruned.max(dim=1).values <= kept.max(dim=1).values).all())
    assert pruner.pruned_count() == 24 and pruner.history == [(1, 0.9, 24)]


def test_a_method_without_amount_refuses_min_density() -> None:
    model = make_mlp()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"Expected `min_density` to be 0 with a method that"):
        Pruner(model, OneShotSchedule(0.5), method=TwoOfFour, min_density=0.1)
    check()


def test_shared_targets_names_the_tensors_two_pruners_select() -> None:
    model = tied_model()
    first = Pruner(model, OneShotSchedule(0.5), parameters=["0.weight"])
    second = Pruner(model, OneShotSchedule(0.5), parameters=["1.weight", "0.bias"])
    assert first.shared_targets(second) == ["0.weight = 1.weight"]
    assert first.shared_targets(Pruner(tied_model(), OneShotSchedule(0.5))) == []


def test_state_dict_carries_seed_rewinding_and_snapshot() -> None:
    model = make_mlp()
    first = Pruner(model, EVERY_OTHER, rewind="step", rewind_step=1, seed=3)
    run(first, torch.optim.SGD(model.parameters(), lr=0.1), range(3))
    second = Pruner(make_mlp(1), EVERY_OTHER, rewind="step", rewind_step=1, seed=4)
    assert second.state_dict() != first.state_dict()

    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    second.load_state_dict(torch.load(buffer, weights_only=True))

    state, expected = second.state_dict(), first.state_dict()
    assert sorted(state) == sorted(expected)
    assert state.pop("snapshot").keys() == expected["snapshot"].keys() == set(TARGETS)
    for name, value in expected.pop("snapshot").items():
        assert torch.equal(second.state_dict()["snapshot"][name], value), name
    assert state == expected and (state["seed"], state["rewind_step"]) == (3, 1)


def version_1_state() -> dict[str, object]:
    """What tensorplay 0.1's Pruner.state_dict() wrote after 7 steps of this schedule."""
    return {
        "version": 1,
        "step": 7,
        "last_pruned_step": 6,
        "targets": TARGETS,
        "schedule": {
            "type": "cubic",
            "final_sparsity": 0.8,
            "end_step": 12,
            "start_step": 0,
            "initial_sparsity": 0.0,
            "frequency": 3,
            "power": 3.0,
        },
        "method": "l1_unstructured",
        "scope": "global",
        "min_density": 0.0,
        "history": [(3, 0.1, 48), (6, 0.2, 24)],
        "permanent": False,
    }


def test_a_version_1_state_loads_without_warning(recwarn: pytest.WarningsRecorder) -> None:
    pruner = Pruner(make_mlp(), CubicSchedule(0.8, end_step=12, frequency=3), seed=5)
    pruner.load_state_dict(version_1_state())
    assert (pruner.last_step, pruner.last_pruned_step, pruner.seed) == (7, 6, 5)
    assert pruner.history == [(3, 0.1, 48), (6, 0.2, 24)]
    assert pruner.state_dict()["version"] == 5 and len(recwarn) == 0


def test_a_version_2_state_loads_as_reparametrized(recwarn: pytest.WarningsRecorder) -> None:
    schedule = CubicSchedule(0.8, end_step=12, frequency=3)
    first = Pruner(make_mlp(), schedule, seed=5)
    for _ in range(8):
        first.step()
    dropped = ("masking", "importance", "importance_state", "structure", "multiple_of")
    state = {k: v for k, v in first.state_dict().items() if k not in dropped}
    state["version"] = 2
    second = Pruner(make_mlp(), schedule)
    second.load_state_dict(state)
    assert second.state_dict() == first.state_dict() and len(recwarn) == 0
    lean = Pruner(make_mlp(), schedule, masking="inplace")
    with pytest.warns(UserWarning, match="masking: 'reparametrize' -> 'inplace'"):
        lean.load_state_dict(state)


def test_a_version_4_state_loads_as_single_weights(recwarn: pytest.WarningsRecorder) -> None:
    schedule = CubicSchedule(0.8, end_step=12, frequency=3)
    first = Pruner(make_mlp(), schedule, seed=5)
    for _ in range(8):
        first.step()
    state = {k: v for k, v in first.state_dict().items() if k not in ("structure", "multiple_of")}
    state["version"] = 4
    second = Pruner(make_mlp(), schedule)
    second.load_state_dict(state)
    assert second.state_dict() == first.state_dict() and len(recwarn) == 0


def test_a_rewinding_pruner_loading_a_version_1_state_needs_its_snapshot() -> None:
    pruner = Pruner(make_mlp(), CubicSchedule(0.8, end_step=12, frequency=3), rewind="init")
    pruner.load_state_dict(version_1_state())
    check = unchanged(pruner.model)
    with pytest.raises(RuntimeError, match="rewind snapshot of the initial values"):
        pruner.step()
    check()


def test_make_permanent_leaves_positive_zeros_that_export_compactly(tmp_path: Path) -> None:
    from tensorplay.ao.pruning import save_sparse

    torch.manual_seed(0)
    model = nn.Linear(64, 64, bias=False)
    pruner = Pruner(model, OneShotSchedule(0.9))
    pruner.step()
    negative_zeros = (model.weight_orig < 0) & (model.weight_mask == 0)
    assert int(negative_zeros.sum()) > 0  # remove alone would leave -0.0 there
    pruner.make_permanent()
    weight = model.weight.detach()
    assert not bool(torch.signbit(weight[weight == 0]).any())
    path = save_sparse(model, tmp_path / "w.safetensors")
    # bitmask (1/32 of fp32) + the 10% kept values, plus a small header
    assert path.stat().st_size < 0.16 * weight.numel() * 4 + 1024


def test_a_pruned_step_is_finished_once_and_before_another_step() -> None:
    model = make_mlp()
    pruner = Pruner(model, EVERY_OTHER)
    pruned = pruner.prune_step(2)
    masks = [module.weight_mask.clone() for module in model if hasattr(module, "weight_mask")]
    with pytest.raises(RuntimeError, match="step 2 that prune_step\\(\\) pruned to be finished"):
        pruner.step(3)
    with pytest.raises(RuntimeError, match="to be finished"):
        pruner.prune_step(3)
    assert pruner.last_step == -1 and pruner.history == []
    assert pruned.finish() == pruned.units > 0
    with pytest.raises(RuntimeError, match="finished already"):
        pruned.finish()
    assert pruner.history == [(2, pruned.target, pruned.units)] and pruner.last_step == 2
    found = [module.weight_mask for module in model if hasattr(module, "weight_mask")]
    assert all(torch.equal(a, b) for a, b in zip(found, masks, strict=True))
    assert pruner.step(3) == 0 and pruner.last_step == 3


def test_a_step_pruned_inside_a_refused_transaction_is_not_pending() -> None:
    model = make_mlp()
    pruner = Pruner(model, EVERY_OTHER)
    check = unchanged(model)
    with pytest.raises(KeyError), changes.transaction():
        pruner.prune_step(2)
        raise KeyError("a later pruner refused")
    check()
    assert pruner.step(2) > 0 and pruner.history[0][0] == 2
