"""The expert-pruning benchmark runs end to end at a tiny size and writes its tables."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.scripts import load_script, run_script

pytest.importorskip("transformers")


@pytest.mark.slow
def test_experts_benchmark_scores_every_method_and_ratio_and_shrinks(tmp_path: Path) -> None:
    out = run_script("bench_experts.py", "--tiny", "--out", str(tmp_path))
    results = json.loads((tmp_path / "experts.json").read_text())
    cells = [(row["ratio"], row["method"]) for row in results["rows"]]
    assert cells == [
        (ratio, method)
        for ratio in (0.25, 0.5)
        for method in ("reap", "frequency", "magnitude", "random")
    ]
    for row in results["rows"]:
        for label in ("oneshot", "recovered"):
            assert math.isclose(row[f"{label}_vs_dense"], row[label] / results["dense"])
    speed = {row["model"]: row for row in results["size_speed"]["rows"]}
    assert [speed[name]["experts"] for name in ("dense", "25%", "50%")] == [8, 6, 4]
    assert speed["dense"]["params"] > speed["25%"]["params"] > speed["50%"]["params"]
    assert speed["50%"]["folder_bytes"] < speed["dense"]["folder_bytes"]
    table = (tmp_path / "experts.md").read_text()
    assert table in out and "| 50% | reap |" in table


def _rows(reap: dict[str, list[float]], frequency: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Rows of the accuracy table for REAP and frequency at 50%, as the script writes them."""
    rows = []
    for method, cells in (("reap", reap), ("frequency", frequency)):
        row: dict[str, Any] = {"method": method, "ratio": 0.5}
        for label, values in cells.items():
            row[label] = sum(values) / len(values)
            row[f"{label}_min"], row[f"{label}_max"] = min(values), max(values)
            row[f"{label}_seeds"] = values
            row[f"{label}_vs_dense"] = row[label] / 8.0
        rows.append(row)
    return rows


def test_experts_table_shows_the_seed_range_of_each_cell_and_reap_against_frequency() -> None:
    bench = load_script("bench_experts")
    rows = _rows(
        {"oneshot": [9.0, 10.0, 11.0], "recovered": [7.0, 7.5, 8.0]},
        {"oneshot": [9.5, 9.5, 10.5], "recovered": [7.25, 7.25, 7.25]},
    )
    counts = bench.reap_ahead(rows)
    assert counts == [{"ratio": 0.5, "seeds": 3, "oneshot": 1, "recovered": 1}]
    result = {
        "dense": 8.0, "dense_seeds": [7.9, 8.0, 8.1], "rows": rows, "reap_ahead": counts,
        "setup": {"pretrain_steps": 600, "recovery_steps": 150, "seeds": 3},
        "size_speed": {"rows": [], "prefill_tokens": [4, 128], "decode_tokens": 32},
    }  # fmt: skip
    table = bench.tables(result)
    assert "| 50% | reap | 10.000 (9.000-11.000) | 1.25 | 7.500 (7.000-8.000) | 0.94 |" in table
    assert "| 50% | frequency | 9.833 (9.500-10.500) | 1.23 | 7.250 | 0.91 |" in table
    assert "dense per seed: 7.900, 8.000, 8.100" in table
    assert "at 50%, 1 of 3 one-shot and 1 of 3 recovered." in table


def test_experts_seed_counts_refuse_unequal_seed_lists() -> None:
    with pytest.raises(ValueError, match="as many seeds in both, but got 2 and 1"):
        load_script("bench_experts").seeds_ahead([8.0, 9.0], [8.5])
