"""``bench_large_model.py``: a tiny bf16 model built on the meta device, pruned by each way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import load_script, run_script


@pytest.mark.slow
def test_a_tiny_model_is_pruned_exactly_by_each_way_beside_torch(tmp_path: Path) -> None:
    out = run_script(
        "bench_large_model.py",
        *("--sizes", "200K,400K", "--width", "128", "--torch-params", "200K"),
        *("--reparametrize-max", "200K", "--out", str(tmp_path)),
    )
    results = json.loads((tmp_path / "large_model.json").read_text())
    assert results["dtype"] == "bfloat16"
    reference = results["torch_reference"]
    assert reference["pruned"] == reference["expected_pruned"] == reference["params"] // 2
    assert [row["size"] for row in results["rows"]] == ["197K", "393K"]
    first, second = results["rows"]
    assert set(first) == {"size", "lean", "reparametrize", "torch"}
    assert set(second) == {"size", "lean"}  # past --reparametrize-max, torch measured once
    for result in (first["lean"], first["reparametrize"], second["lean"]):
        assert result["pruned"] == result["expected_pruned"] == result["params"] // 2
        assert result["seconds"] > 0
        assert result["weights_bytes"] == 2 * result["params"]  # bf16
    assert "held_bytes_per_param" in first["lean"]  # at this size, pages of heap: no bound
    table = (tmp_path / "large_model.md").read_text()
    assert table in out
    assert "| lean |" in table and "x |" in table and "torch measured at 197K" in table


def test_a_size_that_does_not_fit_is_skipped_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    script = load_script("bench_large_model")
    monkeypatch.setattr(script, "_available_bytes", lambda: 1 << 30)
    result = script.measure("lean", 3 * 10**9, 8192, "bfloat16")
    assert result == {"skipped": "needs ~11.2 GiB, 1.0 GiB available"}


@pytest.mark.parametrize("kernel", [True, False], ids=["VmHWM", "sampling"])
def test_peak_memory_sees_a_block_allocated_and_freed_inside(kernel: bool) -> None:
    script = load_script("bench_large_model")
    if kernel and not script.PeakMemory.CLEAR_REFS.exists():
        pytest.skip("needs Linux /proc/self/clear_refs")
    if not kernel:
        pytest.importorskip("psutil")
    memory = script.PeakMemory()
    memory._kernel = kernel
    with memory:
        block = bytearray(64 << 20)  # touched: bytearray zero-fills
        if not kernel:  # give the sampling thread time to see it
            import time

            time.sleep(0.05)
        del block
    assert memory.peak - memory.before >= 60 << 20
    assert memory.after - memory.before < 32 << 20  # freed again
