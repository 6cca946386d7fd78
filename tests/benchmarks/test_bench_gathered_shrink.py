"""The gathered-shrink benchmark runs at a tiny size: 2 ranks against 1 process, equal folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script

pytest.importorskip("transformers")


@pytest.mark.slow
@pytest.mark.distributed
def test_gathered_shrink_benchmark_measures_both_runs_and_equal_folders(tmp_path: Path) -> None:
    out = run_script("bench_gathered_shrink.py", "--tiny", "--out", str(tmp_path))
    results = json.loads((tmp_path / "gathered_shrink.json").read_text())
    assert results["same_folder"] is True
    assert len(results["one_process"]) == 1 and len(results["two_processes"]) == 2
    for row in [*results["one_process"], *results["two_processes"]]:
        assert row["params"] == results["params"] > 0 and row["seconds"] >= 0
        assert row["peak_bytes"] >= 0
    table = (tmp_path / "gathered_shrink.md").read_text()
    assert table in out and "rank 0: gather on rank 0" in table
