"""Shrinking removes exactly what a structured pruner masked, read from the groups it recorded on
the model, or refuses before changing anything. The oracle: the masked model's outputs (train and
eval mode) and exact parameter counts."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tensorplay.ao.pruning import Pruner, custom_from_mask, shrink
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.ao.pruning.structured.dependency.recorded import (
    RECORD_ATTRIBUTE,
    record_groups,
    recorded_groups,
)
from tensorplay.ao.pruning.structured.dependency.tracing import traced_groups
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup
from tests.core.structure.masking import mask_units
from tests.model_state import unchanged

POOL = 2  # the pooled map is 2 x 2: each channel is 4 of the Linear's columns once flattened
CHANNELS, CLASSES = 8, 5


class _Residual(nn.Module):
    """A stem (conv, BN), one block (conv-BN-ReLU-conv-BN) added to the stem's output, ReLU,
    adaptive pooling, flattening and a Linear: the residual channels are one unit across the
    stem conv, the block's second conv, both BNs and every consumer's input columns."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.stem_bn = nn.Conv2d(3, CHANNELS, 3, padding=1), nn.BatchNorm2d(CHANNELS)
        self.conv1, self.bn1 = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1), nn.BatchNorm2d(CHANNELS)
        self.conv2 = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(CHANNELS)
        self.fc = nn.Linear(CHANNELS * POOL * POOL, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem_bn(self.stem(x))
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        x = F.relu(x + y)
        out: Tensor = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, POOL), 1))
        return out


def _parameters(residual: int, inner: int) -> int:
    """The residual model's parameters with ``residual`` and ``inner`` channels kept."""
    convs = (3 * residual + residual * inner + inner * residual) * 9 + residual + inner + residual
    norms = 2 * (residual + inner + residual)
    return convs + norms + residual * POOL * POOL * CLASSES + CLASSES


def _example() -> Tensor:
    return torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(0)).double()


def _pruned(masking: str = "reparametrize") -> tuple[_Residual, Pruner]:
    """The residual model with half of its 16 channels pruned, scored layerwise (4 residual
    channels and 4 of the block's inner ones go)."""
    torch.manual_seed(0)
    model = _Residual().double()
    pruner = Pruner(
        model, OneShotSchedule(0.5), structure="channel", scope="layerwise",
        masking=masking, example_inputs=_example(),  # type: ignore[arg-type]
    )  # fmt: skip
    pruner.step()
    return model, pruner


def _outputs(model: nn.Module, x: Tensor, training: bool) -> Tensor:
    model.train(training)
    out: Tensor = model(x)
    return out


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_residual_channels_go_with_every_slice_and_consumer_column(masking: str) -> None:
    model, _ = _pruned(masking)
    masked = copy.deepcopy(model)
    x = _example()
    report = shrink(model)
    assert [(g.name, g.before, g.after) for g in report.groups] == [
        ("stem", 8, 4),
        ("conv1", 8, 4),
    ]
    assert report.parameters_before == _parameters(8, 8) == 1_605
    kept = _parameters(4, 4)
    assert report.parameters_after == kept == sum(p.numel() for p in model.parameters())
    assert (model.stem.out_channels, model.conv1.in_channels, model.conv2.out_channels) == (4, 4, 4)
    assert (model.stem_bn.num_features, model.bn2.num_features) == (4, 4)
    assert model.fc.in_features == 4 * POOL * POOL
    for training in (True, False):  # train: BN on batch statistics, moving the running ones
        torch.testing.assert_close(
            _outputs(model, x, training), _outputs(masked, x, training), atol=1e-10, rtol=0
        )


def test_a_structured_pruner_records_its_groups_on_the_model_and_copies_keep_them() -> None:
    model, _ = _pruned()
    expected = tuple(traced_groups(model, _example())["channel"])
    assert [group.name for group in expected] == ["stem", "conv1"]
    assert recorded_groups(model) == expected
    assert recorded_groups(copy.deepcopy(model)) == expected
    assert RECORD_ATTRIBUTE not in "".join(model.state_dict())
    wrapper = nn.ModuleDict({"net": model})
    assert [group.name for group in recorded_groups(wrapper)] == ["net.stem", "net.conv1"]


def test_shrinking_a_wrapper_reads_the_record_of_the_model_inside() -> None:
    model, _ = _pruned()
    wrapper = nn.ModuleDict({"net": model})
    report = shrink(wrapper)
    assert [(g.name, g.after) for g in report.groups] == [("net.stem", 4), ("net.conv1", 4)]
    assert recorded_groups(model) == ()


def test_shrinking_forgets_the_groups_it_changed() -> None:
    model, _ = _pruned()
    assert len(recorded_groups(model)) == 2
    shrink(model)
    assert recorded_groups(model) == ()
    assert shrink(model).removed == 0  # nothing masked is left, nothing stale is read


def test_given_groups_that_leave_a_recorded_masked_unit_are_refused_before_any_change() -> None:
    model, _ = _pruned()
    inner = next(group for group in recorded_groups(model) if group.name == "conv1")
    check = unchanged(model)
    with pytest.raises(
        ValueError,
        match=r"^Expected the groups to shrink to remove every structured unit masked whole, but "
        r"unit \d of channel group 'stem' would stay in 'stem.weight': a structured pruner "
        r"recorded that group; include it in `groups=` \(or omit `groups=`",
    ):
        shrink(model, groups=[inner])
    check()


def _masked_by_hand(mode: str) -> nn.Module:
    """The residual model with residual channels 1 and 5 masked (the groups traced with the
    example inputs), and no record: masks made outside a structured pruner."""
    torch.manual_seed(0)
    model = _Residual().double()
    stem = traced_groups(model, _example())["channel"][0]
    keep = torch.ones(stem.size, dtype=torch.bool)
    keep[[1, 5]] = False
    mask_units(model, [(stem, keep)], mode)  # type: ignore[arg-type]
    return model


@pytest.mark.parametrize("mode", ["reparametrize", "inplace"])
def test_masked_channels_tracing_needs_shapes_for_are_refused_without_example_inputs(
    mode: str,
) -> None:
    model = _masked_by_hand(mode)
    check = unchanged(model)
    with pytest.raises(
        ValueError,
        match=r"^Expected `example_inputs` to shrink _Residual, a plain model traced without "
        r"them, but output channel 1 of 'stem' is masked whole in 'stem.weight' and tracing "
        r"without shapes left its channels out \(they reach torch.flatten, which reshapes them "
        r"\(needs the shapes that example_inputs give\)\): they would stay. Pass "
        r"`example_inputs=`",
    ):
        shrink(model)
    check()
    report = shrink(model, example_inputs=_example())
    assert report.parameters_after == _parameters(6, 8)


def test_zeros_without_masks_and_element_masks_are_never_refused() -> None:
    model = _masked_by_hand("zeros")  # no mask: without example_inputs these zeros stay
    assert shrink(model).removed == 0
    model = _Residual()
    row = torch.ones_like(model.stem.weight)
    row[2] = 0  # a whole row masked by element pruning: its bias is not
    custom_from_mask(model.stem, "weight", row)
    assert shrink(model).removed == 0


class _UnknownFamily(_Residual):
    """Holds a Hugging Face config of no family the analysis knows: it is traced only with
    example inputs."""

    def __init__(self) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers")
        self.config = transformers.PretrainedConfig()


def test_a_model_the_graph_cannot_read_without_inputs_shrinks_by_its_record() -> None:
    torch.manual_seed(0)
    model = _UnknownFamily().double()
    Pruner(
        model, OneShotSchedule(0.5), structure="channel", scope="layerwise",
        example_inputs=_example(),
    ).step()  # fmt: skip
    masked = copy.deepcopy(model).eval()
    report = shrink(model)
    assert report.parameters_after == _parameters(4, 4)
    torch.testing.assert_close(model.eval()(_example()), masked(_example()), atol=1e-10, rtol=0)
    unknown = _UnknownFamily()
    check = unchanged(unknown)
    with pytest.raises(ValueError, match=r"^Expected a model whose units shrink can find, but "):
        shrink(unknown)  # no record: the graph's refusal
    check()


def test_a_record_that_no_longer_fits_is_refused_naming_it() -> None:
    model, _ = _pruned()
    model.stem = nn.Conv2d(3, 2, 3, padding=1).double()  # the model changed under its record
    check = unchanged(model)
    with pytest.raises(
        ValueError,
        match=r"^Expected the unit groups a pruner recorded on _Residual to fit it, but they do "
        r"not \(Expected the 8 units of group 'stem' to fit dim 0 of 'stem.weight' \(size 2\)",
    ):
        shrink(model)
    check()


def _overlapped() -> tuple[nn.Sequential, UnitGroup]:
    """An MLP whose hidden channels a pruner recorded as a group of its first 3 (another
    layout than the graph's one group of 6), with channels 1 and 4 masked."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)).double()
    [found] = traced_groups(model, None)["channel"]
    record_groups(model, [dataclasses.replace(found, name="0[0:3]", size=3)])
    keep = torch.tensor([True, False, True, True, False, True])
    mask_units(model, [(found, keep)], "reparametrize")
    return model, found


def test_a_graph_group_overlapping_a_recorded_one_gives_way_to_it() -> None:
    model, found = _overlapped()
    check = unchanged(model)
    with pytest.raises(
        ValueError,
        match=r"^Expected the groups to shrink to remove every structured unit masked whole, but "
        r"unit 4 of channel group '0' would stay in '0.weight': the dependency graph finds that "
        r"group, but it overlaps a group a structured pruner recorded, which shrink removes "
        r"instead; pass `groups=` that hold both units.$",
    ):
        shrink(model)
    check()
    masked = copy.deepcopy(model)
    report = shrink(model, groups=[found])
    assert [(g.name, g.before, g.after) for g in report.groups] == [("0", 6, 4)]
    x = torch.randn(3, 4, dtype=torch.double)
    torch.testing.assert_close(model(x), masked(x), atol=1e-12, rtol=0)


def test_where_the_recorded_group_holds_every_masked_unit_it_shrinks_alone() -> None:
    model, _ = _overlapped()
    with torch.no_grad():  # unmask channel 4: only channel 1, in the recorded group, is masked
        model.get_buffer("0.weight_mask")[4] = 1
        model.get_buffer("0.bias_mask")[4] = 1
        model.get_buffer("2.weight_mask")[:, 4] = 1
    masked = copy.deepcopy(model)
    report = shrink(model)
    assert [(g.name, g.before, g.after) for g in report.groups] == [("0[0:3]", 3, 2)]
    assert model[0].out_features == 5
    x = torch.randn(3, 4, dtype=torch.double)
    torch.testing.assert_close(model(x), masked(x), atol=1e-12, rtol=0)
