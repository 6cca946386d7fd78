"""Float helpers: neighbours and bit patterns, for both key dtypes."""

from __future__ import annotations

import pytest
import torch

from tensorplay.ao.pruning.selection.floats import from_bits, largest, next_down, next_up, to_bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("value", [0.0, 1e-30, 0.75, 3.0e38])
def test_neighbours_and_bits(dtype: torch.dtype, value: float) -> None:
    value = float(torch.tensor(value, dtype=dtype))
    up, down = next_up(value, dtype), next_down(value, dtype)
    assert down < value < up
    assert to_bits(up, dtype) == to_bits(value, dtype) + 1
    if value > 0:
        assert to_bits(down, dtype) == to_bits(value, dtype) - 1
    assert from_bits(to_bits(value, dtype), dtype) == value
    assert largest(dtype) == torch.finfo(dtype).max
