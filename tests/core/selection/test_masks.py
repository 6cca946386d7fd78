"""``keep_masks`` against the concatenate-and-sort oracle, on every path of the algorithm."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from tensorplay.ao.pruning.selection import (
    AbsKeys,
    UniformKeys,
    count_eligible,
    cut,
    keep_masks,
)
from tests.core.selection.reference import (
    assert_masks_equal,
    fast,
    keep_masks_reference,
    reference,
    small_constants,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@st.composite
def problems(draw: st.DrawFn) -> tuple[list[Tensor], list[Tensor | None], int]:
    """Sources of mixed sizes and dtypes, heavy ties or none, with and without earlier masks."""
    n_sources = draw(st.integers(1, 6))
    tie_levels = draw(st.sampled_from([0, 1, 2, 5]))  # 0: continuous scores
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    scores, eligible = [], []
    for _ in range(n_sources):
        size = draw(st.sampled_from([0, 1, 3, 17, 64, 65, 200, 700]))
        dtype = draw(st.sampled_from(DTYPES[:3]))
        if tie_levels:
            values = torch.randint(-tie_levels, tie_levels + 1, (size,), generator=generator)
        else:
            values = torch.randn(size, generator=generator)
        scores.append(values.to(dtype).view(-1, 1) if size % 2 else values.to(dtype))
        if draw(st.booleans()):
            eligible.append((torch.rand(scores[-1].shape, generator=generator) < 0.6).float())
        else:
            eligible.append(None)
    available = count_eligible(eligible, [s.numel() for s in scores])
    k = draw(st.sampled_from([0, available, available // 2, max(available - 1, 0)]))
    k = draw(st.one_of(st.just(k), st.integers(0, available)))
    return scores, eligible, k


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_streaming_equals_reference(problem: tuple[list[Tensor], list[Tensor | None], int]) -> None:
    scores, eligible, k = problem
    with small_constants():
        assert_masks_equal(fast(scores, eligible, k), reference(scores, eligible, k))


@settings(max_examples=40, deadline=None)
@given(problems())
def test_default_constants_equal_reference(
    problem: tuple[list[Tensor], list[Tensor | None], int],
) -> None:
    scores, eligible, k = problem
    assert_masks_equal(fast(scores, eligible, k), reference(scores, eligible, k))


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda g: torch.zeros(3000), id="all-zeros"),
        pytest.param(lambda g: torch.full((3000,), -2.5), id="all-equal"),
        pytest.param(
            lambda g: torch.where(torch.rand(3000, generator=g) < 0.7, 0.0, 1.0), id="mostly-zeros"
        ),
        pytest.param(lambda g: torch.randn(3000, generator=g), id="continuous"),
        pytest.param(lambda g: torch.arange(3000.0).flip(0), id="sorted-descending"),
    ],
)
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.5, 0.7, 0.93, 1.0])
def test_heavy_ties_and_extremes(make, fraction: float) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    flat = make(g)
    scores = list(flat.split([1000, 7, 993, 1000]))
    k = round(fraction * flat.numel())
    with small_constants(chunk=128, sample=64, band=16):
        assert_masks_equal(fast(scores, [None] * 4, k), reference(scores, [None] * 4, k))


def test_ties_go_to_the_earlier_source_then_the_lower_index() -> None:
    scores = [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([[1.0, 1.0], [0.0, 1.0]])]
    got = fast(scores, [None, None], 4)
    assert got[0].tolist() == [False, False, False]
    assert got[1].tolist() == [[True, True], [False, True]]


@pytest.mark.parametrize("guess", [(0.0, 1e-6), (3.0, 4.0), (0.1, 2.0)])
def test_bad_band_guess_falls_back_exactly(guess: tuple[float, float]) -> None:
    g = torch.Generator().manual_seed(1)
    scores = [torch.randn(5000, generator=g), torch.randn(3000, generator=g)]
    with (
        small_constants(chunk=256, band=64),
        mock.patch.object(cut, "guess_band", return_value=guess),
    ):
        got = fast(scores, [None, None], 4000)
    assert_masks_equal(got, reference(scores, [None, None], 4000))


def test_tie_pass_resolves_by_position() -> None:
    scores = [torch.zeros(4000), torch.ones(1000), torch.zeros(2000)]
    with (
        small_constants(chunk=256, band=16),
        mock.patch.object(cut, "tie_cut", wraps=cut.tie_cut) as tied,
    ):
        got = fast(scores, [None] * 3, 5000)
    assert tied.called
    assert got[0].sum() == 0 and got[1].all() and got[2].sum() == 1000
    assert got[2][:1000].sum() == 0  # the earlier zeros go first


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k", [50, 100, 150, 250])
def test_half_precision_scores_compare_exactly(dtype: torch.dtype, k: int) -> None:
    # Neighbouring half values that float32 tells apart, mixed with float32 scores.
    half = torch.tensor([1.0, 1.0009765625, 1.001953125] * 100, dtype=torch.float16).to(dtype)
    full = torch.tensor([1.0004882812] * 50)
    assert_masks_equal(
        fast([half, full], [None, None], k), reference([half, full], [None, None], k)
    )


def test_uniform_keys_prune_the_count_reproducibly_and_leave_the_global_rng() -> None:
    shapes = [(300, 7), (0,), (1000,)]
    scores = [torch.zeros(shape) for shape in shapes]
    eligible: list[Tensor | None] = [
        torch.ones(shapes[0]),
        None,
        (torch.arange(1000) % 3 != 0).float(),
    ]
    eligible[0][::2] = 0  # type: ignore[index]
    available = count_eligible(eligible, [s.numel() for s in scores])
    state = torch.get_rng_state()
    with small_constants(chunk=256):
        first = keep_masks(scores, eligible, 500, UniformKeys(7), [torch.bool] * 3)
        again = keep_masks(scores, eligible, 500, UniformKeys(7), [torch.bool] * 3)
        other = keep_masks(scores, eligible, 500, UniformKeys(8), [torch.bool] * 3)
    assert torch.equal(torch.get_rng_state(), state)
    assert available > 500
    assert sum(int((~m).sum()) for m in first) == 500
    for mask, e in zip(first, eligible, strict=True):
        if e is not None:
            assert bool(mask[e == 0].all())  # units not eligible are never selected
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_uniform_keys_match_the_reference_on_the_same_keys() -> None:
    keys = UniformKeys(3)
    scores = [torch.zeros(700), torch.zeros(300)]
    drawn = [
        torch.cat(
            [
                keys.chunk_keys(
                    i, start, s[start : start + 128], torch.empty(s[start : start + 128].numel())
                )
                for start in range(0, s.numel(), 128)
            ]
        )
        for i, s in enumerate(scores)
    ]
    with small_constants(chunk=128, band=16):
        got = keep_masks(scores, [None, None], 400, keys, [torch.bool] * 2)
    assert_masks_equal(got, keep_masks_reference(drawn, [None, None], 400))


@pytest.mark.parametrize("k", [-1, 3])
def test_k_out_of_range_raises(k: int) -> None:
    with pytest.raises(
        ValueError, match=f"Expected `k` to be between 0 and the 2 eligible units, but got {k}"
    ):
        keep_masks([torch.ones(2)], [None], k, AbsKeys(), [torch.bool])


def test_counts_stay_exact_past_float32_integers() -> None:
    # More units than float32 counts exactly (2**24): running totals must not round.
    g = torch.Generator().manual_seed(4)
    scores = [torch.randn(1 << 23, generator=g) for _ in range(3)]
    k = (3 << 22) + 1
    out = keep_masks(scores, [None] * 3, k, AbsKeys(), [torch.float32] * 3)
    assert sum(int((m == 0).sum()) for m in out) == k
    threshold = torch.cat([s.abs() for s in scores]).kthvalue(k).values
    assert all(bool((s.abs()[m == 0] <= threshold).all()) for s, m in zip(scores, out, strict=True))


@pytest.mark.parametrize("ties", [0, 2])
def test_many_tiny_sources_with_earlier_masks_equal_reference(ties: int) -> None:
    g = torch.Generator().manual_seed(ties)
    sizes = torch.randint(1, 40, (300,), generator=g).tolist()
    if ties:
        scores = [torch.randint(-ties, ties + 1, (n,), generator=g).float() for n in sizes]
    else:
        scores = [torch.randn(n, generator=g) for n in sizes]
    eligible: list[Tensor | None] = [
        (torch.rand(n, generator=g) < 0.7).float() if i % 3 else None for i, n in enumerate(sizes)
    ]
    available = count_eligible(eligible, sizes)
    for k in (0, available // 3, available - 1, available):
        with small_constants(chunk=256, band=16):
            assert_masks_equal(fast(scores, eligible, k), reference(scores, eligible, k))


@pytest.mark.slow
def test_more_units_than_int32_indexes() -> None:
    # 2**31 + 100 units in one source (scores that take no memory: uniform keys never read
    # them but for the finite check), pruned past index 2**31: positions and counts are int64.
    n = (1 << 31) + 100
    scores = torch.zeros(1).expand(n)
    k = n // 2 + 7
    (mask,) = keep_masks([scores], [None], k, UniformKeys(seed=5), [torch.bool])
    assert mask.shape == (n,)
    assert n - int(torch.count_nonzero(mask)) == k  # (``sum`` would widen to int64 first)
    tail = mask[1 << 31 :]
    assert 0 < int(torch.count_nonzero(tail)) < tail.numel()  # past 2**31: selected and kept
