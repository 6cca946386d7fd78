"""``clear_lowest`` and ``clear_lowest_capped`` against ``keep_masks`` / ``capped_keep_masks``
on the same inputs: the bits they clear in the bool masks are exactly the units those select."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from tensorplay.ao.pruning.selection import (
    AbsKeys,
    KeySpec,
    ShardLayout,
    UniformKeys,
    capped_keep_masks,
    clear_lowest,
    clear_lowest_capped,
    keep_masks,
)
from tests.core.selection.reference import small_constants

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
Problem = tuple[list[Tensor], list[Tensor], int, list[int]]


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    """Sources of mixed shapes and dtypes, heavy ties or none, bool masks, ``k`` and caps."""
    n_sources = draw(st.integers(1, 5))
    tie_levels = draw(st.sampled_from([0, 1, 2, 5]))  # 0: continuous scores
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scores, keep = [], []
    for _ in range(n_sources):
        size = draw(st.sampled_from([0, 1, 3, 17, 64, 65, 200, 700]))
        dtype = draw(st.sampled_from(DTYPES))
        if tie_levels:
            values = torch.randint(-tie_levels, tie_levels + 1, (size,), generator=generator)
        else:
            values = torch.randn(size, generator=generator)
        scores.append(values.to(dtype).view(-1, 1) if size % 2 else values.to(dtype))
        density = draw(st.sampled_from([1.0, 0.6, 0.1]))
        keep.append(torch.rand(scores[-1].shape, generator=generator) < density)
    available = sum(int(m.sum()) for m in keep)
    k = draw(st.sampled_from([0, available, available // 2, max(available - 1, 0)]))
    k = draw(st.one_of(st.just(k), st.integers(0, available)))
    caps = [draw(st.integers(0, int(m.sum()))) for m in keep]
    return scores, keep, k, caps


def expected(scores: list[Tensor], keep: list[Tensor], k: int, keys: KeySpec) -> list[Tensor]:
    """What ``clear_lowest`` must leave: the old masks and ``keep_masks``' keep factors."""
    factors = keep_masks(scores, keep, k, keys, [torch.bool] * len(scores))
    return [m & f for m, f in zip(keep, factors, strict=True)]


def cleared(scores: list[Tensor], keep: list[Tensor], k: int, keys: KeySpec) -> list[Tensor]:
    masks = [m.clone() for m in keep]
    clear_lowest(scores, masks, k, keys)
    return masks


def assert_same(got: list[Tensor], want: list[Tensor]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype == torch.bool
        assert a.shape == b.shape
        assert torch.equal(a, b)


@pytest.mark.parametrize("keys", [AbsKeys(), UniformKeys(seed=5)], ids=["l1", "random"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_clear_lowest_equals_keep_masks(keys: KeySpec, problem: Problem) -> None:
    scores, keep, k, _ = problem
    with small_constants():
        assert_same(cleared(scores, keep, k, keys), expected(scores, keep, k, keys))


@settings(max_examples=30, deadline=None)
@given(problem=problems())
def test_default_constants_equal_keep_masks(problem: Problem) -> None:
    scores, keep, k, _ = problem
    assert_same(cleared(scores, keep, k, AbsKeys()), expected(scores, keep, k, AbsKeys()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_capped_equals_capped_keep_masks(problem: Problem) -> None:
    scores, keep, _, caps = problem
    k = sum(caps) // 2
    with small_constants():
        factors = capped_keep_masks(scores, keep, k, caps, AbsKeys())
        masks = [m.clone() for m in keep]
        clear_lowest_capped(scores, masks, k, AbsKeys(), caps)
    assert_same(masks, [m & f.bool() for m, f in zip(keep, factors, strict=True)])


def as_float_masks(keep: list[Tensor], dtype: torch.dtype, seed: int) -> list[Tensor]:
    """torch-style masks: ``1`` where eligible; elsewhere ``0``, or a value that is not ``1``
    (0.5, -0.0, NaN) and must come back unchanged."""
    generator = torch.Generator().manual_seed(seed)
    masks = []
    for mask in keep:
        odd = torch.tensor([0.0, 0.5, -0.0, math.nan])[
            torch.randint(0, 4, mask.shape, generator=generator)
        ]
        masks.append(torch.where(mask, torch.ones(mask.shape), odd).to(dtype))
    return masks


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems(), capped=st.booleans(), seed=st.integers(0, 2**16))
def test_float_masks_clear_what_bool_masks_clear_and_keep_the_rest(
    dtype: torch.dtype, problem: Problem, capped: bool, seed: int
) -> None:
    scores, keep, k, caps = problem
    floats = as_float_masks(keep, dtype, seed)
    before = [m.clone() for m in floats]
    bools = [m.clone() for m in keep]
    with small_constants():
        if capped:
            k = sum(caps) // 2
            clear_lowest_capped(scores, bools, k, AbsKeys(), caps)
            clear_lowest_capped(scores, floats, k, AbsKeys(), caps)
        else:
            clear_lowest(scores, bools, k, AbsKeys())
            clear_lowest(scores, floats, k, AbsKeys())
    for got, old, eligible, want in zip(floats, before, keep, bools, strict=True):
        assert got.dtype == dtype
        assert torch.equal(got[eligible], want[eligible].to(dtype))  # 1 kept, 0 pruned
        # Not eligible: as before, NaN still NaN and the same bits otherwise (-0.0 too).
        rest, was = got[~eligible], old[~eligible]
        assert torch.equal(rest.isnan(), was.isnan())
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        assert torch.equal(rest[~was.isnan()].view(bits), was[~was.isnan()].view(bits))


def test_heavy_ties_past_the_band_resolve_by_position() -> None:
    scores = [torch.zeros(300), torch.ones(100), torch.zeros(50, 4)]
    keep = [torch.ones(300, dtype=torch.bool), torch.ones(100, dtype=torch.bool)]
    keep.append(torch.rand(50, 4, generator=torch.Generator().manual_seed(0)) < 0.5)
    for k in [1, 299, 301, 350]:
        with small_constants():
            assert_same(cleared(scores, keep, k, AbsKeys()), expected(scores, keep, k, AbsKeys()))


def test_cost_counts_passes_and_no_collectives() -> None:
    scores = [torch.randn(1000, generator=torch.Generator().manual_seed(1))]
    keep = [torch.ones(1000, dtype=torch.bool)]
    cost = clear_lowest(scores, keep, 300, AbsKeys())
    assert (cost.collectives, cost.bytes_communicated) == (0, 0)
    assert cost.passes == 3  # eligible count, fused counting pass, write
    assert int((~keep[0]).sum()) == 300


def test_a_piece_of_a_source_equals_its_part_of_the_whole_random_keys() -> None:
    # Keys follow the global flat index: a piece with its layout sees the whole's keys.
    keys = UniformKeys(seed=9)
    whole = keys.chunk_keys(0, 0, torch.zeros(200_000), torch.empty(200_000))
    part = keys.chunk_keys(0, 70_001, torch.zeros(99_999), torch.empty(99_999))
    assert torch.equal(whole[70_001:170_000], part)


@pytest.mark.parametrize(
    ("keep", "match"),
    [
        pytest.param(
            [torch.ones(3, dtype=torch.int64)], "contiguous bool or floating tensor", id="int-mask"
        ),
        pytest.param([torch.ones(4, dtype=torch.bool)], "of shape \\(3,\\)", id="shape"),
        pytest.param(
            [torch.ones(6, dtype=torch.bool)[::2]], "contiguous: False", id="not-contiguous"
        ),
        pytest.param([], "as many keep masks", id="count"),
    ],
)
def test_bad_masks_raise_and_change_nothing(keep: list[Tensor], match: str) -> None:
    before = [m.clone() for m in keep]
    with pytest.raises(ValueError, match=match):
        clear_lowest([torch.tensor([1.0, 2.0, 3.0])], keep, 1, AbsKeys())
    assert all(torch.equal(a, b) for a, b in zip(keep, before, strict=True))


def test_k_out_of_range_and_nan_raise_and_change_nothing() -> None:
    keep = [torch.tensor([True, False, True])]
    with pytest.raises(ValueError, match="between 0 and the 2 eligible units, but got 3"):
        clear_lowest([torch.tensor([1.0, 2.0, 3.0])], keep, 3, AbsKeys())
    with pytest.raises(ValueError, match="w has nan at flat index 2"):
        clear_lowest([torch.tensor([1.0, 2.0, float("nan")])], keep, 1, AbsKeys(), labels=["w"])
    assert keep[0].tolist() == [True, False, True]


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32], ids=["bool", "float"])
@pytest.mark.parametrize("eligible", ["all", "some"])
def test_nan_is_refused_before_any_change_when_every_eligible_unit_goes(
    mask_dtype: torch.dtype, eligible: str
) -> None:
    """``k`` equal to the eligible units: no cut to find, a pass that only checks the scores,
    then every eligible bit cleared. A NaN score refuses it with the masks and the weights to
    zero as they were (all eligible: the masks are not read; some: they are)."""
    flags = [True, True, True, True] if eligible == "all" else [True, False, True, True]
    keep = [torch.tensor(flags).to(mask_dtype), torch.ones(2, 2).to(mask_dtype)]
    scores = [torch.tensor([1.0, 2.0, float("nan"), 4.0]), torch.tensor([[1.0, 2.0], [3.0, 4.0]])]
    weights = [torch.arange(1.0, 5.0), torch.arange(5.0, 9.0).view(2, 2)]
    before = [t.clone() for t in [*keep, *weights]]
    n_eligible = sum(int(mask.sum()) for mask in keep)
    with pytest.raises(ValueError, match="w has nan at flat index 2"):
        clear_lowest(scores, keep, n_eligible, AbsKeys(), labels=["w", "v"], zero=weights)
    after = [*keep, *weights]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    scores[0][2] = 3.0  # finite: the same call clears every eligible unit and zeroes it
    clear_lowest(scores, keep, n_eligible, AbsKeys(), labels=["w", "v"], zero=weights)
    assert not any(bool(mask.any()) for mask in keep)
    assert not any(bool(weight.any()) for weight in weights)


def test_piece_outside_its_layout_raises() -> None:
    keep = [torch.ones(3, dtype=torch.bool)]
    with pytest.raises(ValueError, match="to lie inside its full source"):
        clear_lowest([torch.ones(3)], keep, 1, AbsKeys(), shards=[ShardLayout(4, 2)])
    assert bool(keep[0].all())


def test_caps_must_match_the_sources() -> None:
    keep = [torch.ones(3, dtype=torch.bool)]
    with pytest.raises(ValueError, match="one cap per source \\(1\\), but got 2 caps"):
        clear_lowest_capped([torch.ones(3)], keep, 1, AbsKeys(), [1, 1])
    assert bool(keep[0].all())
