"""Threads: the selection changes no thread setting and may run in several threads at once."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from unittest import mock

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import L1Unstructured, global_unstructured
from tensorplay.ao.pruning.selection import cut, threads
from tests.core.selection.reference import assert_masks_equal, fast, reference, small_constants


@pytest.fixture
def two_torch_threads() -> Iterator[None]:
    """Two intra-op threads (the core tests run on one), restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def make_model(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64), nn.Linear(64, 80))


def prune_repeatedly(model: nn.Sequential, calls: int = 3) -> list[Tensor]:
    """``calls`` global L1 prunings of every weight; the final masks."""
    pairs = [(layer, "weight") for layer in model if isinstance(layer, nn.Linear)]
    for _ in range(calls):
        global_unstructured(pairs, L1Unstructured, amount=0.3)
    return [module.get_buffer("weight_mask") for module, _ in pairs]


@pytest.mark.parametrize("chunk", [256, 1 << 19], ids=["many-chunks", "default-chunks"])
@pytest.mark.usefixtures("two_torch_threads")
def test_a_call_changes_no_thread_setting(chunk: int) -> None:
    before = torch.get_num_threads(), torch.get_num_interop_threads()
    refuse = AssertionError("the selection must not change the process's threads")
    with (
        small_constants(chunk=chunk),
        mock.patch.object(torch, "set_num_threads", side_effect=refuse),
        mock.patch.object(torch, "set_num_interop_threads", side_effect=refuse),
    ):
        masks = prune_repeatedly(make_model(0))
    assert (torch.get_num_threads(), torch.get_num_interop_threads()) == before
    assert sum(int((m == 0).sum()) for m in masks) > 0


@pytest.mark.usefixtures("two_torch_threads")
def test_two_threads_at_once_give_the_sequential_masks() -> None:
    models = [make_model(seed) for seed in (1, 2)]
    with small_constants(chunk=256):
        expected = [prune_repeatedly(copy.deepcopy(model)) for model in models]
        results: dict[int, list[Tensor]] = {}
        errors: list[BaseException] = []
        start = threading.Barrier(len(models))

        def run(index: int) -> None:
            try:
                start.wait()
                results[index] = prune_repeatedly(models[index])
            except BaseException as error:  # reported below, in the test's thread
                errors.append(error)

        workers = [threading.Thread(target=run, args=(i,)) for i in range(len(models))]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    assert errors == []
    assert torch.get_num_threads() == 2
    assert sorted(results) == list(range(len(models)))
    for index, sequential in enumerate(expected):
        assert_masks_equal(results[index], sequential)


@pytest.mark.parametrize("threads", [1, 2])
def test_results_do_not_depend_on_the_thread_count(threads: int) -> None:
    g = torch.Generator().manual_seed(2)
    scores = [torch.randn(3000, generator=g).round() for _ in range(3)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with small_constants(chunk=128, band=32):
            got = fast(scores, [None] * 3, 4000)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    assert_masks_equal(got, reference(scores, [None] * 3, 4000))


@pytest.mark.usefixtures("two_torch_threads")
def test_a_refined_band_held_by_one_thread_is_gathered_whole() -> None:
    # The k-th key lies in the first source, held by 6 units: the band the counting passes
    # narrow down to (6 candidates, within the cap of 8) is all in the first thread's share,
    # over that thread's own cap (8 // 2).
    scores = [torch.arange(2000.0).div(6).floor(), torch.arange(2000.0) + 10_000]
    with (
        small_constants(chunk=64, band=8),
        mock.patch.object(cut, "guess_band", return_value=(0.0, 1e-6)),
        mock.patch.object(
            threads, "run_in_own_threads", wraps=threads.run_in_own_threads
        ) as spread,
    ):
        got = fast(scores, [None, None], 1000)
    assert spread.called
    assert_masks_equal(got, reference(scores, [None, None], 1000))


@pytest.mark.usefixtures("two_torch_threads")
def test_without_a_per_thread_count_the_calling_thread_runs_the_pass() -> None:
    g = torch.Generator().manual_seed(3)
    scores = [torch.randn(3000, generator=g) for _ in range(2)]
    with (
        small_constants(chunk=128, band=32),
        mock.patch.object(threads, "_omp_set_num_threads", return_value=None),
        mock.patch.object(threads, "run_in_own_threads", side_effect=AssertionError) as spread,
    ):
        assert threads.own_threads(6000) == 0
        got = fast(scores, [None] * 2, 2500)
    assert not spread.called
    assert_masks_equal(got, reference(scores, [None] * 2, 2500))
