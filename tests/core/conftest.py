"""Shared set-up for the core tests; the torch-parity harness lives in ``parity.py`` next to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """Run on one intra-op thread: the tensors here are tiny, and on a busy 2-core CI runner
    OpenMP threads spinning against each other make a small conv ~50x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
