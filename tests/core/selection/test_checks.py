"""What the inputs hold: eligible counts and finite scores, on both of the selection's paths."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import AbsKeys, check_finite_scores, count_eligible, keep_masks
from tests.core.selection.reference import fast, small_constants


@pytest.mark.parametrize("chunk", [4, 1 << 19])
def test_count_eligible_counts_ones_and_whole_sources(chunk: int) -> None:
    eligible: list[Tensor | None] = [torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5]), None, torch.zeros(3)]
    with small_constants(chunk=chunk):
        assert count_eligible(eligible, [5, 7, 3]) == 10


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", ["selection", "check"])
def test_non_finite_eligible_scores_raise(bad: float, where: str) -> None:
    scores = [torch.ones(10), torch.ones(20)]
    scores[1][13] = bad
    with pytest.raises(
        ValueError, match=r"Expected finite importance scores, but b has .* index 13"
    ):
        if where == "selection":
            keep_masks(scores, [None, None], 5, AbsKeys(), [torch.bool] * 2, labels=["a", "b"])
        else:
            check_finite_scores(scores, [None, None], ["a", "b"])


def test_non_finite_scores_of_pruned_units_are_ignored() -> None:
    scores = torch.tensor([1.0, float("nan"), 3.0, 0.5])
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0])
    check_finite_scores([scores], [mask], ["w"])
    assert fast([scores], [mask], 1)[0].tolist() == [True, True, True, False]


def test_overflowing_sum_is_not_mistaken_for_inf() -> None:
    scores = [torch.full((100,), 3e38)]
    scores[0][5] = 1.0
    assert fast(scores, [None], 1)[0].nonzero().numel() == 99
