"""The expert-pruning benchmark runs end to end at a tiny size and writes its tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script

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
