"""``capped_keep_masks`` against the greedy oracle: lowest key first (ties: source, then flat
index), skipping the units of a source that has reached its cap."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from tensorplay.ao.pruning.selection import (
    AbsKeys,
    SubsetKeys,
    UniformKeys,
    capped_keep_masks,
    keep_masks,
)
from tests.core.selection.reference import small_constants

Problem = tuple[list[Tensor], list[Tensor | None], int, list[int]]


def greedy(
    scores: list[Tensor], eligible: list[Tensor | None], k: int, caps: list[int]
) -> list[Tensor]:
    """The oracle, one unit at a time."""
    units = sorted(
        (abs(float(s.reshape(-1)[j])), i, j)
        for i, s in enumerate(scores)
        for j in range(s.numel())
        if eligible[i] is None or float(eligible[i].reshape(-1)[j]) == 1  # type: ignore[union-attr]
    )
    keeps = [torch.ones(s.numel(), dtype=torch.uint8) for s in scores]
    given = [0] * len(scores)
    for _, i, j in units:
        if k == 0:
            break
        if given[i] < caps[i]:
            keeps[i][j] = 0
            given[i] += 1
            k -= 1
    return [keep.reshape(s.shape) for keep, s in zip(keeps, scores, strict=True)]


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    """Small sources with many ties, some pruned before, caps from none to all."""
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scores: list[Tensor] = []
    eligible: list[Tensor | None] = []
    caps: list[int] = []
    for _ in range(draw(st.integers(1, 5))):
        size = draw(st.sampled_from([0, 1, 3, 8, 30, 90]))
        levels = draw(st.sampled_from([1, 2, 4]))  # few values: ties at every threshold
        values = torch.randint(-levels, levels + 1, (size,), generator=generator).float()
        scores.append(values.view(-1, 1) if size % 2 else values)
        mask = (
            (torch.rand(size, generator=generator) < 0.7).float() if draw(st.booleans()) else None
        )
        eligible.append(mask)
        available = size if mask is None else int(mask.sum())
        caps.append(draw(st.integers(0, available)))
    k = draw(st.integers(0, sum(caps)))
    return scores, eligible, k, caps


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_capped_selection_equals_the_greedy_oracle(problem: Problem) -> None:
    scores, eligible, k, caps = problem
    with small_constants():
        got = capped_keep_masks(scores, eligible, k, caps, AbsKeys())
    expected = greedy(scores, eligible, k, caps)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == torch.uint8 and a.shape == b.shape and torch.equal(a, b)


def test_subset_keys_are_the_whole_selections() -> None:
    keys = UniformKeys(seed=7)
    scores = [torch.zeros(5), torch.zeros(6), torch.zeros(7)]
    whole = keep_masks(scores, [None] * 3, 4, keys, [torch.uint8] * 3)
    part = keep_masks(
        scores[2:], [None], int((whole[2] == 0).sum()), SubsetKeys(keys, [2]), [torch.uint8]
    )
    assert torch.equal(part[0], whole[2])


@pytest.mark.parametrize(("k", "caps"), [(-1, [2]), (3, [2])], ids=["negative", "over-caps"])
def test_k_outside_the_caps_is_an_error(k: int, caps: list[int]) -> None:
    with pytest.raises(ValueError, match=rf"between 0 and the sum of the caps, 2, but got {k}"):
        capped_keep_masks([torch.ones(4)], [None], k, caps, AbsKeys())
