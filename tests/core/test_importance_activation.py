"""``importance="activation"`` against its oracle: the Minitron statistic computed by hand.

The oracle runs a copy of the model with forward hooks of its own on the layers that read the
units (the down and output projections), and aggregates as the docs state: per sample, the L2
norm of the unit's activation over the positions (and a head's entries), then the mean over the
samples of every batch. The score must equal it, and a one-shot step must prune exactly the
units it ranks lowest (masks compared whole). Refusals leave the model as it was.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import OneShotSchedule, Pruner, prune_one_shot
from tensorplay.ao.pruning.calibration.finite import NonFiniteCalibrationError
from tensorplay.ao.pruning.importance.activation import Activation
from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.pruner.one_shot import calibrate
from tensorplay.ao.pruning.targets.tied import Target
from tests.core.gloo import spawn_gloo
from tests.hf_models import VOCAB, tiny_bert, tiny_gpt2, tiny_llama
from tests.model_state import unchanged, unchanged_hooks
from tests.moe_models import tiny_mixtral

RTOL = 1e-5  # the score sums squares in float32, the oracle in float64


def _tokens() -> list[Tensor]:
    generator = torch.Generator().manual_seed(5)
    # Batches of different sizes and lengths: the mean is over every sample of every batch.
    return [torch.randint(0, VOCAB, shape, generator=generator) for shape in ((3, 10), (5, 7))]


@dataclass(frozen=True)
class Family:
    """A tiny model and, per kind, the layer reading each group's units and a unit's width."""

    build: Callable[[], nn.Module]
    layers: int
    channel: tuple[str, str, int]  # (group, consumer, width), with {i} the layer
    head: tuple[str, str, int]
    transposed: bool = False  # Conv1D: the consumer's weight is (in, out)


FAMILIES = {
    # 4 query heads of 8 share 2 key/value heads: a unit is 2 query heads, 16 columns of o_proj.
    "llama-gqa": Family(
        tiny_llama,
        3,
        ("model.layers.{i}.mlp", "model.layers.{i}.mlp.down_proj", 1),
        ("model.layers.{i}.self_attn", "model.layers.{i}.self_attn.o_proj", 16),
    ),
    "gpt2": Family(
        tiny_gpt2,
        2,
        ("transformer.h.{i}.mlp", "transformer.h.{i}.mlp.c_proj", 1),
        ("transformer.h.{i}.attn", "transformer.h.{i}.attn.c_proj", 16),
        transposed=True,
    ),
    "bert": Family(
        tiny_bert,
        2,
        ("bert.encoder.layer.{i}.intermediate", "bert.encoder.layer.{i}.output.dense", 1),
        (
            "bert.encoder.layer.{i}.attention",
            "bert.encoder.layer.{i}.attention.output.dense",
            16,
        ),
    ),
}


def _consumers(family: Family, kind: str) -> dict[str, tuple[str, int]]:
    group, consumer, width = getattr(family, kind)
    return {group.format(i=i): (consumer.format(i=i), width) for i in range(family.layers)}


def by_hand(
    model: nn.Module,
    consumers: dict[str, tuple[str, int]],
    batches: Sequence[object],
    channels_first: bool = False,
) -> dict[str, Tensor]:
    """Per group, ``mean_n sqrt(sum_{p, i in u} a[n, p, i]^2)`` over the inputs each consumer
    receives in eval-mode forwards of a copy of ``model`` (float64)."""
    model = copy.deepcopy(model).eval()
    sums: dict[str, Tensor] = {}
    samples: dict[str, int] = {}
    handles = []
    for group, (name, width) in consumers.items():

        def record(
            module: nn.Module, args: tuple[Tensor, ...], output: Tensor, group=group, width=width
        ) -> None:
            x = args[0].detach().double()
            if channels_first:  # (N, C, *spatial): the unit's channels, every pixel
                per_unit = x.reshape(len(x), -1, width, x[0, 0].numel())
                norms = per_unit.square().sum(dim=(2, 3)).sqrt()
            else:  # (N, [positions,] features): the unit's `width` columns at every position
                x = x.reshape(len(x), -1, x.shape[-1])
                norms = x.reshape(len(x), x.shape[1], -1, width).square().sum(dim=(1, 3)).sqrt()
            sums[group] = sums.get(group, 0) + norms.sum(dim=0)
            samples[group] = samples.get(group, 0) + len(x)

        handles.append(model.get_submodule(name).register_forward_hook(record))
    with torch.no_grad():
        for batch in batches:
            model(*batch) if isinstance(batch, tuple) else model(batch)
    for handle in handles:
        handle.remove()
    return {group: sums[group] / samples[group] for group in consumers}


def pruned_units(module: nn.Module, width: int, transposed: bool) -> Tensor:
    """Per unit, whether every input column of ``module`` it spans is masked."""
    mask = module.get_buffer("weight_mask")
    mask = mask.T if transposed else mask.flatten(2) if mask.dim() > 2 else mask
    kept = mask.reshape(mask.shape[0], mask.shape[1], -1).ne(0).any(dim=(0, 2))
    return ~kept.view(-1, width).any(dim=1)


def lowest(scores: Sequence[Tensor], count: int) -> list[Tensor]:
    """The ``count`` lowest of all ``scores`` as one bool per unit, checked to be no tie."""
    flat = torch.cat(list(scores))
    order = flat.sort().values
    assert order[count] - order[count - 1] > 1e-4 * order[count]  # a clear threshold
    pruned = flat < (order[count - 1] + order[count]) / 2
    return list(torch.split(pruned, [len(s) for s in scores]))


# -- the score is the statistic ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["channel", "head"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_unit_scores_are_the_hand_computed_statistic(family: str, kind: str) -> None:
    spec = FAMILIES[family]
    model = spec.build()
    expected = by_hand(model, _consumers(spec, kind), _tokens())
    pruner = Pruner(model, OneShotSchedule(0.5), structure=kind, importance="activation")
    assert calibrate(pruner, _tokens()) == 2
    groups = pruner.structure.groups
    assert [group.name for group in groups] == list(expected)
    for group in groups:
        score = pruner.importance.unit_scores(group)
        assert score is not None and score.dtype == torch.float64
        torch.testing.assert_close(score, expected[group.name], rtol=RTOL, atol=0)


@pytest.mark.parametrize(
    ("kind", "scope"), [("channel", "global"), ("head", "layerwise")], ids=["channel", "head"]
)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_shot_prunes_exactly_the_units_the_statistic_ranks_lowest(
    family: str, kind: str, scope: str
) -> None:
    spec = FAMILIES[family]
    model = spec.build()
    consumers = _consumers(spec, kind)
    expected = by_hand(model, consumers, _tokens())
    pruner = prune_one_shot(
        model, _tokens(), 0.5, structure=kind, scope=scope, importance="activation",
        make_permanent=False,
    )  # fmt: skip
    scores = list(expected.values())
    if scope == "global":
        wanted = lowest(scores, round(0.5 * sum(len(s) for s in scores)))
        assert all(not bool(units.all()) for units in wanted)  # no group at its floor
    else:
        wanted = [lowest([s], len(s) // 2)[0] for s in scores]
    for (name, width), units in zip(consumers.values(), wanted, strict=True):
        got = pruned_units(model.get_submodule(name), width, spec.transposed)
        assert torch.equal(got, units), name
    assert pruner.history == [(0, 0.5, sum(int(units.sum()) for units in wanted))]


def test_a_parameter_budget_over_channels_and_heads_ranks_by_the_statistic() -> None:
    model = tiny_llama()
    expected = {}
    for kind in ("channel", "head"):
        expected.update(by_hand(model, _consumers(FAMILIES["llama-gqa"], kind), _tokens()))
    pruner = Pruner(
        model, OneShotSchedule(None), structure=("channel", "head"), importance="activation",
        target_params=0.9,
    )  # fmt: skip
    calibrate(pruner, _tokens())
    space = pruner.structure.space(
        pruner.mode, pruner.method, lambda targets: [], pruner.importance.unit_scores
    )
    assert [ranked.name for ranked in space.ranked] == list(expected)
    for index, ranked in enumerate(space.ranked):
        torch.testing.assert_close(space.units(index)[1], expected[ranked.name], rtol=RTOL, atol=0)
    assert pruner.step() > 0


# -- plain models: chains, feature maps, a unit read twice --------------------------------------


class Fork(nn.Module):
    """``fc1``'s channels are read by ``fc2`` and ``fc3``, whose channels a sum joins."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(4, 6), nn.Linear(6, 5), nn.Linear(6, 5)
        self.fc4 = nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.fc1(x))
        return self.fc4(torch.relu(self.fc2(h)) + torch.relu(self.fc3(h)))


def _chain() -> nn.Module:
    torch.manual_seed(0)  # fc 2 is the producer of one group and the consumer of another
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 2))


def _cnn() -> nn.Module:
    torch.manual_seed(0)  # a conv reads the first channels, a Linear the flattened maps
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 6, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(6 * 5 * 5, 4),
    )  # fmt: skip


def _plain_batches(shape: tuple[int, ...]) -> list[Tensor]:
    generator = torch.Generator().manual_seed(2)
    return [torch.randn(n, *shape, generator=generator) for n in (6, 10)]


@pytest.mark.parametrize(
    ("build", "shape", "reads"),
    [
        pytest.param(_chain, (4,), {"0": [("2", 1, False)], "2": [("4", 1, False)]}, id="chain"),
        pytest.param(
            _cnn, (3, 5, 5), {"0": [("2", 1, True)], "2": [("5", 25, False)]}, id="cnn-flatten"
        ),
        pytest.param(
            Fork,
            (4,),
            {"fc1": [("fc2", 1, False), ("fc3", 1, False)], "fc2": [("fc4", 1, False)]},
            id="read-twice",
        ),
    ],
)
def test_plain_models_score_and_prune_by_the_statistic(
    build: Callable[[], nn.Module], shape: tuple[int, ...], reads: dict[str, list]
) -> None:
    model = build()
    batches = _plain_batches(shape)
    expected = {}
    for group, found in reads.items():  # a unit read by several layers: the sum of their F
        parts = [
            by_hand(model, {group: (name, width)}, batches, channels_first)[group]
            for name, width, channels_first in found
        ]
        expected[group] = torch.stack(parts).sum(dim=0)
    pruner = prune_one_shot(
        model, batches, 0.5, structure="channel", importance="activation",
        example_inputs=batches[0][:2], make_permanent=False,
    )  # fmt: skip
    assert [group.name for group in pruner.structure.groups] == list(expected)
    wanted = lowest(list(expected.values()), round(0.5 * sum(len(s) for s in expected.values())))
    for (group, found), units in zip(reads.items(), wanted, strict=True):
        for name, width, _ in found:
            got = pruned_units(model.get_submodule(name), width, transposed=False)
            assert torch.equal(got, units), (group, name)


# -- refusals: before anything changes ----------------------------------------------------------


@pytest.mark.parametrize("structure", ["element", "layer"])
def test_other_structures_are_refused_naming_them_and_the_model_is_unchanged(
    structure: str,
) -> None:
    model = tiny_llama()
    check = unchanged(model)
    with pytest.raises(
        ValueError,
        match=rf"'channel' or 'head' or 'hidden' with importance='activation', but got "
        rf"'{structure}': it "
        "scores those units only",
    ):
        Pruner(model, OneShotSchedule(0.5), structure=structure, importance="activation")
    check()


def test_experts_are_refused_naming_the_structure_and_the_model_is_unchanged() -> None:
    model = tiny_mixtral()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"structure='expert', but got 'activation'"):
        Pruner(model, OneShotSchedule(0.5), structure="expert", importance="activation")
    check()


def test_one_shot_single_weights_are_refused_and_the_model_is_unchanged() -> None:
    model = _chain()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"with importance='activation', but got 'element'"):
        prune_one_shot(model, _plain_batches((4,)), 0.5, importance="activation")
    check()


def test_a_tuple_of_kinds_holds_only_those_the_importance_ranks() -> None:
    config = PrunerConfig(
        OneShotSchedule(None),
        importance="activation",
        structure=["channel", "head"],
        target_params=0.8,
    )  # fmt: skip  (a YAML list, as LightningCLI passes it)
    assert (config.importance, config.structure) == ("activation", ("channel", "head"))
    with pytest.raises(
        ValueError,
        match=r"hold only 'expert' with importance='reap', but got \('channel', 'head'\)",
    ):
        PrunerConfig(
            OneShotSchedule(None), importance="reap", structure=("channel", "head"),
            target_params=0.8,
        )  # fmt: skip


def test_bind_without_units_is_refused() -> None:
    layer = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"got single weights: it scores units"):
        Activation().bind([Target(("weight",), ((layer, "weight"),))])
    assert not layer._forward_hooks


def _slice(parameter: str, dim: int, width: int = 1) -> SimpleNamespace:
    return SimpleNamespace(parameter=parameter, dim=dim, offset=0, width=width)


def test_a_grouped_convolution_reading_units_is_refused_naming_it() -> None:
    conv = nn.Conv2d(4, 4, 3, groups=2)
    targets = [Target(("conv.weight",), ((conv, "weight"),))]
    group = SimpleNamespace(name="g", kind="channel", size=2, slices=(_slice("conv.weight", 1),))
    with pytest.raises(ValueError, match=r"'conv' \(Conv2d\) has groups=2: which of its input"):
        Activation().bind(targets, [group])
    assert not conv._forward_hooks


def test_a_group_no_layer_reads_is_refused_naming_it() -> None:
    layer = nn.Linear(2, 3)
    targets = [Target(("fc.weight",), ((layer, "weight"),))]
    group = SimpleNamespace(name="fc", kind="channel", size=3, slices=(_slice("fc.weight", 0),))
    with pytest.raises(ValueError, match=r"group 'fc' \(channel\) is read by none"):
        Activation().bind(targets, [group])
    layer_group = SimpleNamespace(name="h", kind="layer", size=1, slices=())
    with pytest.raises(ValueError, match=r"got structure='layer' \(group 'h'\)"):
        Activation().bind(targets, [layer_group])
    assert not layer._forward_hooks


def test_a_step_before_any_batch_is_refused_unchanged() -> None:
    pruner = Pruner(_chain(), OneShotSchedule(0.5), structure="channel",
                    importance="activation", example_inputs=torch.randn(2, 4))  # fmt: skip
    check = unchanged(pruner.model)  # as the build left it: its observers, no mask
    with pytest.raises(RuntimeError, match=r"\['2', '4'\] saw none: run a calibration pass"):
        pruner.step()
    check()


# -- calibration data is checked ----------------------------------------------------------------


def test_a_nan_calibration_batch_is_refused_naming_it_and_nothing_changes() -> None:
    model = _chain()
    batches = _plain_batches((4,))
    batches[1][3, 2] = float("nan")
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"batch 1 .*non-finite value \(nan\)"):
        prune_one_shot(model, batches, 0.5, structure="channel", importance="activation",
                       example_inputs=batches[0][:2])  # fmt: skip
    check()


def test_the_score_refuses_a_nan_it_reads_before_adding_it() -> None:
    model = _chain()
    pruner = Pruner(model, OneShotSchedule(0.5), structure="channel",
                    importance="activation", example_inputs=torch.randn(2, 4))  # fmt: skip
    with torch.no_grad():
        model[2].weight[0, 0] = float("inf")  # the input of '4' holds inf and NaN
        with pytest.raises(NonFiniteCalibrationError, match=r"\(nan\) in the input of '4'"):
            model(torch.ones(3, 4))
    state = pruner.importance.state_dict()
    assert state["samples"]["channel:2"].tolist() == [0.0]  # '4' counted nothing
    assert state["samples"]["channel:0"].tolist() == [3.0]  # '2' read finite values


# -- state, reset and clean-up ------------------------------------------------------------------


def test_the_sums_resume_with_the_pruner_state_and_reset_after_a_step() -> None:
    batches = _tokens()
    first = Pruner(tiny_llama(), OneShotSchedule(0.5), structure="head", importance="activation")
    second = Pruner(tiny_llama(), OneShotSchedule(0.5), structure="head", importance="activation")
    calibrate(first, batches[:1])
    group = first.structure.groups[1]
    assert not torch.equal(
        first.importance.unit_scores(group), second.importance.unit_scores(group)
    )
    second.load_state_dict(first.state_dict())
    calibrate(first, batches[1:])
    calibrate(second, batches[1:])
    for found in first.structure.groups:
        assert torch.equal(
            first.importance.unit_scores(found), second.importance.unit_scores(found)
        )
    assert first.step() == second.step() == 3
    for name in ("model.layers.0.self_attn.o_proj", "model.layers.2.self_attn.o_proj"):
        masks = [p.model.get_submodule(name).weight_mask for p in (first, second)]
        assert torch.equal(*masks)
    after = first.importance.state_dict()
    assert all(not bool(value.any()) for value in after["sums"].values())  # reset


def test_a_state_of_other_groups_is_refused() -> None:
    pruner = Pruner(_chain(), OneShotSchedule(0.5), structure="channel",
                    importance="activation", example_inputs=torch.randn(2, 4))  # fmt: skip
    state = pruner.importance.state_dict()
    with pytest.raises(ValueError, match=r"keys \['samples', 'sums'\] of the unit groups"):
        pruner.importance.load_state_dict({"sums": state["sums"]}, [])
    wrong = {"samples": state["samples"], "sums": {**state["sums"], "channel:0": torch.zeros(1, 3)}}
    with pytest.raises(ValueError, match=r"sums of 'channel:0' to have shape \(1, 8\)"):
        pruner.importance.load_state_dict(wrong, [])


def test_making_the_pruning_permanent_removes_every_hook() -> None:
    model = tiny_gpt2()
    check = unchanged_hooks(model)
    pruner = prune_one_shot(model, _tokens(), 0.5, structure="channel", importance="activation")
    check()
    assert pruner.permanent


# -- DDP: ranks that see different data prune the same units ------------------------------------


def _ddp_batches(rank: int) -> list[Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    return [torch.randn(4 + rank, 4, generator=generator) * (1 + 3 * rank) for _ in range(3)]


def _one_shot_chain(batches: list[Tensor]) -> Tensor:
    model = _chain()
    pruner = Pruner(model, OneShotSchedule(0.5), structure="channel", importance="activation",
                    example_inputs=batches[0][:2])  # fmt: skip
    with torch.no_grad():
        for x in batches:
            model(x)
    pruner.step()
    return torch.cat([model[2].weight_mask.any(dim=0), model[4].weight_mask.any(dim=0)])


def _ddp_worker(rank: int, out: Path) -> None:
    torch.save(_one_shot_chain(_ddp_batches(rank)), out / f"rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_ranks_that_see_different_data_keep_the_channels_one_process_keeps_on_all(tmp_path):
    spawn_gloo(_ddp_worker, 2, tmp_path)
    kept = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    assert torch.equal(kept[0], kept[1])
    everything = _one_shot_chain(_ddp_batches(0) + _ddp_batches(1))
    assert torch.equal(kept[0], everything)
    assert not torch.equal(_one_shot_chain(_ddp_batches(0)), everything)  # rank 0 alone differs
