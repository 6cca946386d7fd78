"""Chunk planning: the chunks cover every unit once, in the tie-rule order."""

from __future__ import annotations

import pytest
import torch

from tensorplay.ao.pruning.selection import AbsKeys, tuning
from tensorplay.ao.pruning.selection.plan import Chunk, Selection, chunk_length, chunk_size
from tests.core.selection.reference import small_constants


def chunks_of(sizes: list[int]) -> list[Chunk]:
    scores = [torch.randn(size) for size in sizes]
    return Selection(scores, [None] * len(sizes), AbsKeys(), [torch.bool] * len(sizes)).chunks()


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        pytest.param(
            [10, 20, 100, 5, 0, 5, 60],
            [
                [(0, 0, 10), (1, 0, 20)],
                [(2, 0, 64)],
                [(2, 64, 100)],
                [(3, 0, 5), (5, 0, 5)],
                [(6, 0, 60)],
            ],
            id="small-sources-share-chunks",
        ),
        pytest.param([128, 1], [[(0, 0, 64)], [(0, 64, 128)], [(1, 0, 1)]], id="large-source-cut"),
        pytest.param([0, 0], [], id="all-empty"),
        pytest.param([40, 24, 1], [[(0, 0, 40), (1, 0, 24)], [(2, 0, 1)]], id="pack-fills-exactly"),
    ],
)
def test_chunks_in_order(sizes: list[int], expected: list[Chunk]) -> None:
    with small_constants(chunk=64):
        chunks = chunks_of(sizes)
    assert chunks == expected
    assert sum(chunk_length(chunk) for chunk in chunks) == sum(sizes)


def test_chunk_size_per_device() -> None:
    assert chunk_size(torch.device("cpu")) == tuning.CPU_CHUNK
    assert chunk_size(torch.device("meta")) == tuning.DEVICE_CHUNK
