"""The cost benchmark of reconstruction runs end to end on a tiny Llama, one process a cell."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.benchmarks.scripts import load_script, run_script

pytest.importorskip("transformers")


@pytest.mark.slow
def test_cost_benchmark_times_each_size_without_and_with_reconstruction(tmp_path: Path) -> None:
    out = run_script("bench_reconstruction_cost.py", "--tiny", "--out", str(tmp_path))
    results = json.loads((tmp_path / "reconstruction_cost.json").read_text())
    rows = results["rows"]
    assert [(row["importance"], row["sequences"]) for row in rows] == [
        ("magnitude", 1),
        ("magnitude", 2),
    ]
    keys = {"seconds", "cpu_seconds", "peak_bytes", "peak_bytes_per_param", "params"}
    for row in rows:
        for label in ("plain", "reconstructed"):
            run = row[label]
            assert keys <= set(run) and run["threads"] == 1
            assert run["tokens"] == 256 * row["sequences"]
            # Shrunk afterwards: a fifth of the parameters gone, at most one unit's worth more.
            assert run["params_after"] <= round(0.8 * run["params"])
        assert math.isclose(
            row["seconds_ratio"], row["reconstructed"]["seconds"] / row["plain"]["seconds"]
        )
    table = (tmp_path / "reconstruction_cost.md").read_text()
    assert table in out and "| magnitude | 2 x 256 |" in table
    assert "Extrapolated, not measured" in table


def test_resume_keeps_the_rows_already_measured_and_measures_nothing_again(
    tmp_path: Path,
) -> None:
    cost = load_script("bench_reconstruction_cost")
    run = {"seconds": 2.0, "cpu_seconds": 1.0, "peak_bytes": 8, "params": 4, "threads": 1}
    row = {
        "importance": "magnitude",
        "sequences": 4,
        "plain": {**run, "tokens": 1024},
        "reconstructed": {**run, "seconds": 6.0, "cpu_seconds": 3.0, "tokens": 1024},
        "seconds_ratio": 3.0,
        "cpu_seconds_ratio": 3.0,
        "peak_bytes_ratio": 1.0,
    }
    (tmp_path / "reconstruction_cost.json").write_text(json.dumps({"rows": [row]}))
    # A row to measure would start a worker on the 100M model: none is started here.
    result = cost.main(["--runs", "magnitude:4", "--resume", "--out", str(tmp_path)])
    assert result is not None and result["rows"] == [row]
    assert (
        "| magnitude | 4 x 256 | 2.0 | 6.0 | 1.0 | 3.0 | 3.0 |"
        in (tmp_path / "reconstruction_cost.md").read_text()
    )
