"""The ``n``-th lowest key among pieces (``ranks.py``) against ``kthvalue`` of the joined keys."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from tensorplay.ao.pruning.selection import tuning
from tensorplay.ao.pruning.selection.ranks import lowest_key, nth_equal


@st.composite
def pieces(draw: st.DrawFn) -> tuple[list[Tensor], torch.dtype]:
    """Non-negative keys in pieces (some empty), heavily tied or not, ``-0.0`` among them."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    levels = draw(st.sampled_from([0, 1, 3, 50]))  # 0: continuous keys
    found = []
    for size in draw(st.lists(st.sampled_from([0, 1, 2, 7, 40, 300]), min_size=1, max_size=8)):
        if levels:
            keys = torch.randint(0, levels + 1, (size,), generator=generator).to(dtype) / 7
        else:
            keys = torch.randn(size, generator=generator, dtype=dtype).abs() * 1e3
        if draw(st.booleans()):
            keys[keys == 0] = -0.0  # equal to 0.0, but another bit pattern
        found.append(keys)
    return found, dtype


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=pieces(), fraction=st.floats(0.0, 1.0), block=st.sampled_from([1, 5, 64, 1 << 20]))
def test_lowest_key_and_its_ties_equal_kthvalue(
    problem: tuple[list[Tensor], torch.dtype], fraction: float, block: int
) -> None:
    keys, dtype = problem
    joined = torch.cat(keys)
    if not joined.numel():
        return
    wanted = 1 + round(fraction * (joined.numel() - 1))
    with mock.patch.object(tuning, "RANK_BLOCK", block):
        value, nth = lowest_key(keys, wanted, dtype)
        piece, index = nth_equal(keys, value, nth)
    expected = float(torch.kthvalue(joined, wanted).values)
    assert value == expected
    assert nth == wanted - int((joined < expected).sum())
    # The nth unit of that key along the pieces, in order.
    at = int(torch.nonzero(joined == expected).view(-1)[nth - 1])
    assert sum(k.numel() for k in keys[:piece]) + index == at


def test_lowest_key_reads_zero_and_negative_zero_as_one_key() -> None:
    keys = [torch.tensor([-0.0, 0.5]), torch.tensor([0.0, -0.0])]
    assert lowest_key(keys, 3, torch.float32) == (0.0, 3)
    assert nth_equal(keys, 0.0, 3) == (1, 1)


def test_lowest_key_of_extreme_keys() -> None:
    largest = torch.finfo(torch.float32).max
    keys = [torch.tensor([largest, 0.0, 1e-45, 1e-45])]
    assert lowest_key(keys, 4, torch.float32) == (largest, 1)
    assert lowest_key(keys, 2, torch.float32) == (float(torch.tensor(1e-45)), 1)


def test_a_tied_key_past_its_count_is_reported() -> None:
    with pytest.raises(RuntimeError, match="Lost the tied key"):
        nth_equal([torch.tensor([0.5, 0.5])], 0.5, 3)
