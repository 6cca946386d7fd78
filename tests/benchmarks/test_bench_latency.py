"""The latency benchmark runs end to end at a tiny size and writes what its table says."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script

pytest.importorskip("transformers")


@pytest.mark.slow
def test_latency_benchmark_estimates_and_measures_every_structure(tmp_path: Path) -> None:
    out = run_script("bench_latency.py", "--tiny", "--out", str(tmp_path))
    results = json.loads((tmp_path / "latency.json").read_text())
    assert results["setup"]["budgets"] == [0.95]
    rows = results["rows"]
    assert [row["structure"] for row in rows] == [
        "FFN channels", "heads", "channels + heads", "layers", "hidden size",
    ]  # fmt: skip
    for row in rows:
        if not row["reachable"]:  # refused before anything changed, naming the least
            assert row["least"] is None or row["budget"] < row["least"] <= 1
            continue
        assert row["units"] > 0
        assert 0 < row["estimated"] <= row["budget"] + 1e-9  # the budget met, as estimated
        assert math.isfinite(row["measured"]) and row["measured"] > 0
        assert row["ratio"] == pytest.approx(row["measured"] / row["estimated"])
    assert any(row["reachable"] for row in rows)
    table = (tmp_path / "latency.md").read_text()
    assert table in out
    assert "| layers | 95% |" in table
