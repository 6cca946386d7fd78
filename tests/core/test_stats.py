"""Sparsity statistics: counts from masks or zeros, the report's table and plain data."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning.masking.stats import (
    SparsityReport,
    TensorSparsity,
    sparsity_report,
    tensor_sparsity,
)
from tensorplay.ao.pruning.parity.methods import custom_from_mask, remove


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([1.0, 2.0], 0.0, id="dense"),
        pytest.param([0.0, 2.0, 0.0, 0.0], 0.75, id="three-quarters"),
        pytest.param([0.0, -0.0], 1.0, id="all-zero"),
        pytest.param([], 0.0, id="empty"),
    ],
)
def test_tensor_sparsity(values: list[float], expected: float) -> None:
    assert tensor_sparsity(torch.tensor(values)) == expected


def test_report_reads_masks_not_values() -> None:
    model = make_model()
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 0]])
    custom_from_mask(model[0], "weight", mask)
    with torch.no_grad():
        model[0].weight_orig.fill_(1.0)  # pruned units keep a nonzero _orig
        model[2].weight[0, :2] = 0.0  # an unpruned tensor counts its zeros
    report = sparsity_report(model, names=["0.weight", "2.weight"], target=0.5)
    assert report.rows == (
        TensorSparsity("0.weight", (3, 4), 12, 4),
        TensorSparsity("2.weight", (2, 3), 6, 2),
    )
    assert (report.total, report.pruned, report.target) == (18, 6, 0.5)
    assert report.sparsity == 6 / 18
    assert report.rows[0].sparsity == 4 / 12


def test_report_defaults_to_pruned_tensors() -> None:
    model = make_model()
    custom_from_mask(model[2], "bias", torch.tensor([0, 1]))
    custom_from_mask(model[0], "weight", torch.ones(3, 4))
    report = sparsity_report(model)
    assert [row.name for row in report.rows] == ["0.weight", "2.bias"]
    assert [row.pruned for row in report.rows] == [0, 1]


def test_report_defaults_to_selection_when_nothing_is_pruned() -> None:
    report = sparsity_report(make_model())
    assert [row.name for row in report.rows] == ["0.weight", "2.weight"]
    assert report.pruned == 0 and report.target is None


def test_report_is_unchanged_by_making_pruning_permanent() -> None:
    model = make_model()
    custom_from_mask(model[0], "weight", torch.tensor([[0, 1, 1, 1]] * 3))
    before = sparsity_report(model, names=["0.weight"])
    remove(model[0], "weight")
    after = sparsity_report(model, names=["0.weight"])
    assert before == after
    assert after.pruned == 3


def test_report_table() -> None:
    model = make_model()
    custom_from_mask(model[0], "weight", torch.tensor([[0, 1, 1, 1]] * 3))
    report = sparsity_report(model, names=["0.weight", "2.weight", "2.bias"], target=0.25)
    assert str(report).splitlines() == [
        "tensor    shape   numel  pruned  sparsity",
        "0.weight  (3, 4)     12       3    25.00%",
        "2.weight  (2, 3)      6       0     0.00%",
        "2.bias    (2,)        2       0     0.00%",
        "total                20       3    15.00%  (target 25.00%)",
    ]


def test_report_to_dict() -> None:
    report = SparsityReport((TensorSparsity("a", (2, 2), 4, 1), TensorSparsity("b", (4,), 4, 3)))
    assert report.to_dict() == {
        "row_label": "tensor",
        "rows": [
            {"name": "a", "shape": [2, 2], "numel": 4, "pruned": 1, "sparsity": 0.25},
            {"name": "b", "shape": [4], "numel": 4, "pruned": 3, "sparsity": 0.75},
        ],
        "total": 8,
        "pruned": 4,
        "sparsity": 0.5,
        "target": None,
        "notes": [],
    }


def test_empty_report_has_zero_sparsity() -> None:
    report = SparsityReport(())
    assert (report.total, report.pruned, report.sparsity) == (0, 0, 0.0)
    assert TensorSparsity("empty", (0,), 0, 0).sparsity == 0.0


def test_report_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"Expected '5\.weight' to name a parameter"):
        sparsity_report(make_model(), names=["5.weight"])
