"""The unit layout: expanding keep flags to element masks, reading them back, scoring."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import custom_from_mask
from tensorplay.ao.pruning.structured.dependency.unit_groups import (
    Slice,
    UnitGroup,
    check_groups,
    expand_keep,
    pruned_units,
    shapes_of,
    unit_scores,
)


def _heads() -> tuple[nn.Module, UnitGroup]:
    """Two key/value groups of width 2 (fused q rows of width 4, o columns of width 4)."""
    model = nn.ModuleDict({"q": nn.Linear(6, 8), "k": nn.Linear(6, 4), "o": nn.Linear(8, 6)})
    slices = (
        Slice("q.weight", 0, width=4),
        Slice("q.bias", 0, width=4, scored=False),
        Slice("k.weight", 0, width=2),
        Slice("k.bias", 0, width=2, scored=False),
        Slice("o.weight", 1, width=4),
    )
    return model, UnitGroup("attn", "head", 2, slices)


def test_expanded_masks_read_back_as_the_same_units() -> None:
    model, group = _heads()
    keep = torch.tensor([False, True])
    masks = expand_keep(group, keep, shapes_of(model))
    assert sorted(masks) == ["k.bias", "k.weight", "o.weight", "q.bias", "q.weight"]
    assert masks["q.weight"][:4].sum() == 0 and masks["q.weight"][4:].all()
    assert masks["o.weight"][:, :4].sum() == 0 and masks["o.weight"][:, 4:].all()
    assert masks["k.bias"].tolist() == [False, False, True, True]
    assert pruned_units(group, masks).tolist() == [True, False]


def test_a_unit_masked_in_some_slices_only_is_refused() -> None:
    model, group = _heads()
    masks = expand_keep(group, torch.tensor([True, True]), shapes_of(model))
    masks["o.weight"][:, :4] = False
    with pytest.raises(ValueError, match=r"unit 0 of group 'attn'.*pruned in 'o.weight'"):
        pruned_units(group, masks)


def test_offsets_place_sections_of_a_fused_projection() -> None:
    fused = nn.Linear(3, 12)  # q, k, v sections of 4 rows, two heads of width 2 each
    slices = tuple(Slice("weight", 0, offset=offset, width=2) for offset in (0, 4, 8))
    group = UnitGroup("qkv", "head", 2, slices)
    keep = expand_keep(group, torch.tensor([True, False]), shapes_of(fused))["weight"]
    assert keep[:, 0].tolist() == [True, True, False, False] * 3


def test_whole_tensor_slices_make_one_unit() -> None:
    block = nn.Linear(2, 2)
    group = UnitGroup("block", "layer", 1, (Slice("weight", None), Slice("bias", None, False)))
    masks = expand_keep(group, torch.tensor([False]), shapes_of(block))
    assert not masks["weight"].any() and not masks["bias"].any()
    assert pruned_units(group, masks).tolist() == [True]


def test_scores_are_the_root_mean_square_over_scored_slices() -> None:
    model, group = _heads()
    scores = {name: torch.rand(shape) for name, shape in shapes_of(model).items()}
    expected = []
    for unit in range(2):
        parts = [
            scores["q.weight"][4 * unit : 4 * unit + 4].flatten(),
            scores["k.weight"][2 * unit : 2 * unit + 2].flatten(),
            scores["o.weight"][:, 4 * unit : 4 * unit + 4].flatten(),
        ]
        values = torch.cat(parts).double()
        expected.append(values.square().mean().sqrt())
    torch.testing.assert_close(unit_scores(group, scores), torch.stack(expected))


@pytest.mark.parametrize(
    ("group", "match"),
    [
        pytest.param(
            UnitGroup("g", "channel", 2, (Slice("nope", 0),)), "'nope' is not one", id="unknown"
        ),
        pytest.param(
            UnitGroup("g", "channel", 2, (Slice("weight", 2),)), "dim 2 of 'weight'", id="dim"
        ),
        pytest.param(
            UnitGroup("g", "channel", 3, (Slice("weight", 0, width=2),)),
            "span indices 0 to 5",
            id="range",
        ),
        pytest.param(
            UnitGroup("g", "channel", 2, (Slice("weight", 0, scored=False),)),
            "scored slice",
            id="unscored",
        ),
        pytest.param(
            UnitGroup("g", "layer", 2, (Slice("weight", None),)), "group of one", id="whole"
        ),
    ],
)
def test_groups_that_do_not_fit_the_model_are_refused(group: UnitGroup, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_groups([group], shapes_of(nn.Linear(3, 4)))


def test_a_unit_masked_in_some_slices_only_is_kept_when_asked() -> None:
    model, group = _heads()
    masks = expand_keep(group, torch.tensor([False, True]), shapes_of(model))
    masks["o.weight"][:, 4:] = False  # unit 1: only its output columns are masked
    masks["q.bias"][:4] = True  # unit 0: its query bias is not masked
    assert pruned_units(group, masks, partial="keep").tolist() == [False, False]
    masks["q.bias"][:4] = False
    assert pruned_units(group, masks, partial="keep").tolist() == [True, False]
    with pytest.raises(ValueError, match=r"Expected `partial` to be 'refuse' or 'keep'.*'drop'"):
        pruned_units(group, masks, partial="drop")  # type: ignore[arg-type]


def test_shapes_of_a_masked_model_name_its_tensors() -> None:
    layer = custom_from_mask(nn.Linear(3, 2), "weight", torch.ones(2, 3))
    assert shapes_of(layer) == {"bias": torch.Size([2]), "weight": torch.Size([2, 3])}
