"""Keys: ``|score|`` in the key dtype, and uniform keys drawn per chunk from their own seed."""

from __future__ import annotations

import pytest
import torch

from tensorplay.ao.pruning.selection import AbsKeys, UniformKeys


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_abs_keys_are_exact_in_the_key_dtype(dtype: torch.dtype) -> None:
    scores = torch.tensor([-1.0009765625, 2.0, -0.0, 3.5]).to(dtype)
    key_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    keys = AbsKeys(key_dtype)
    out = torch.empty(4, dtype=key_dtype)
    assert torch.equal(keys.chunk_keys(0, 0, scores, out), scores.to(key_dtype).abs())
    index = torch.tensor([3, 0])
    assert torch.equal(keys.sample_keys(scores, index), scores.to(key_dtype).abs()[index])


def test_uniform_keys_depend_on_seed_source_and_start_only() -> None:
    keys = UniformKeys(seed=11)
    state = torch.get_rng_state()

    def draw(seed: int, source: int, start: int) -> torch.Tensor:
        return UniformKeys(seed).chunk_keys(source, start, torch.zeros(64), torch.empty(64))

    first = draw(11, 0, 0)
    assert torch.equal(first, keys.chunk_keys(0, 0, torch.ones(64), torch.empty(64)))
    assert torch.equal(torch.get_rng_state(), state)
    assert ((first >= 0) & (first < 1)).all()
    for other in [draw(12, 0, 0), draw(11, 1, 0), draw(11, 0, 64)]:
        assert not torch.equal(first, other)
