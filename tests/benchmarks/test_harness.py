"""``benchmarks/harness.py``: what the benchmark scripts share, its examples and its errors."""

from __future__ import annotations

import doctest
import sys

import pytest

from tests.benchmarks.scripts import load_script


def test_the_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    harness = load_script("harness")
    # doctest takes a name's examples where sys.modules says the name was defined.
    monkeypatch.setitem(sys.modules, "harness", harness)
    results = doctest.testmod(harness, optionflags=doctest.ELLIPSIS)
    assert results.attempted >= 10 and results.failed == 0


def test_a_failed_worker_raises_with_its_last_line() -> None:
    harness = load_script("harness")
    with pytest.raises(harness.WorkerError, match="ValueError: no such size") as caught:
        harness.worker_json("-c", "print('started'); raise ValueError('no such size')")
    assert caught.value.last_lines == ["ValueError: no such size"]


def test_an_unknown_machine_field_is_named() -> None:
    with pytest.raises(ValueError, match=r"but got \['gpus'\]"):
        load_script("harness").machine("cpus", "gpus")
