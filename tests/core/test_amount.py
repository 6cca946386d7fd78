"""``amount``: validated and counted as torch does (its private helpers are the oracle)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
import torch.nn.utils.prune as torch_prune
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorplay.ao.pruning as tp_prune
from tensorplay.ao.pruning import amount as amount_module
from tensorplay.ao.pruning.parity.amount import (
    compute_nparams_to_prune,
    validate_pruning_amount,
    validate_pruning_amount_init,
)

AMOUNTS = st.one_of(
    st.integers(-5, 60),
    st.floats(-0.5, 1.5, allow_nan=False),
    st.sampled_from([0, 0.0, 1, 1.0, True, False, math.inf, -math.inf, Fraction(1, 3)]),
)


def _raised(function: Any, *args: Any) -> type[Exception] | None:
    try:
        function(*args)
    except Exception as error:  # the type is what is compared
        return type(error)
    return None


@settings(max_examples=200, deadline=None)
@given(amount=AMOUNTS)
def test_init_validation_matches_torch(amount: Any) -> None:
    expected = _raised(torch_prune._validate_pruning_amount_init, amount)
    assert _raised(validate_pruning_amount_init, amount) is expected


@settings(max_examples=200, deadline=None)
@given(amount=AMOUNTS, size=st.integers(0, 60))
def test_count_and_size_check_match_torch(amount: Any, size: int) -> None:
    if _raised(torch_prune._validate_pruning_amount_init, amount) is not None:
        return  # never reaches the count
    count = compute_nparams_to_prune(amount, size)
    assert count == torch_prune._compute_nparams_toprune(amount, size)
    assert type(count) is int
    expected = _raised(torch_prune._validate_pruning_amount, count, size)
    assert _raised(validate_pruning_amount, count, size) is expected
    assert (expected is None) == (count <= size)


@pytest.mark.parametrize(
    "amount",
    [
        pytest.param("I'm a string", id="str"),
        pytest.param(None, id="none"),
        pytest.param([0.5], id="list"),
        pytest.param(1j, id="complex"),
    ],
)
def test_non_numbers_are_type_errors(amount: Any) -> None:
    with pytest.raises(TypeError, match="Expected `amount` to be an int or a float, but got"):
        validate_pruning_amount_init(amount)


@pytest.mark.parametrize(
    "amount",
    [
        pytest.param(1.1, id="float-above-one"),
        pytest.param(20.0, id="float-twenty"),
        pytest.param(-10, id="negative-int"),
        pytest.param(-1e-9, id="tiny-negative-float"),
        pytest.param(math.nan, id="nan"),
    ],
)
def test_out_of_range_amounts_are_value_errors(amount: Any) -> None:
    with pytest.raises(ValueError, match=r"Expected `amount` to be a float in \[0, 1\] or a non-"):
        validate_pruning_amount_init(amount)


def test_nan_is_refused_at_construction() -> None:
    """A documented difference: torch accepts NaN and fails only when a mask is computed."""
    torch_prune._validate_pruning_amount_init(math.nan)
    with pytest.raises(ValueError, match="but got nan"):
        tp_prune.L1Unstructured(amount=math.nan)


@pytest.mark.parametrize("amount", [0.34, 1500, 0, 0.0, 1, 1.0, True])
def test_valid_amounts_pass(amount: Any) -> None:
    validate_pruning_amount_init(amount)


@pytest.mark.parametrize(
    ("amount", "size", "count"),
    [
        pytest.param(0, 15, 0, id="zero"),
        pytest.param(10, 15, 10, id="int-is-a-count"),
        pytest.param(1, 15, 1, id="int-one-is-one-unit"),
        pytest.param(1.0, 15, 15, id="float-one-is-everything"),
        pytest.param(0.4, 17, 7, id="float-rounds-to-nearest"),
        pytest.param(0.5, 5, 2, id="half-rounds-to-even-down"),
        pytest.param(0.5, 3, 2, id="half-rounds-to-even-up"),
        pytest.param(0.3, 0, 0, id="empty"),
    ],
)
def test_counts(amount: float, size: int, count: int) -> None:
    assert compute_nparams_to_prune(amount, size) == count
    assert torch_prune._compute_nparams_toprune(amount, size) == count


def test_size_check() -> None:
    with pytest.raises(ValueError, match=r"not yet pruned \(19\), but got 20\."):
        validate_pruning_amount(20, 19)
    for amount, size in ((0.3, 0), (19, 20), (0, 0), (1, 1)):
        validate_pruning_amount(amount, size)


def test_torch_private_names_are_the_public_functions() -> None:
    for module in (tp_prune, amount_module):
        assert module._validate_pruning_amount_init is validate_pruning_amount_init
        assert module._validate_pruning_amount is validate_pruning_amount
        assert module._compute_nparams_toprune is compute_nparams_to_prune
    # torch's keyword names work too
    tp_prune._validate_pruning_amount_init(amount=0.5)
    tp_prune._validate_pruning_amount(amount=3, tensor_size=5)
    assert tp_prune._compute_nparams_toprune(amount=0.4, tensor_size=17) == 7
