"""The width-against-depth benchmark runs end to end at a tiny size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script

pytest.importorskip("transformers")


@pytest.mark.slow
def test_width_benchmark_prunes_each_kind_to_its_budget_or_records_the_refusal(
    tmp_path: Path,
) -> None:
    out = run_script("bench_width.py", "--tiny", "--out", str(tmp_path), "--cache", str(tmp_path))
    results = json.loads((tmp_path / "width.json").read_text())
    kinds = list(results["setup"]["kinds"])
    assert {"channel", "head", "layer"} <= set(kinds)
    rows = results["rows"]
    assert [(row["kept"], row["kind"]) for row in rows] == [
        (kept, kind) for kept in (0.75, 0.5) for kind in kinds
    ]
    total = results["params"]
    for row in rows:
        if "refused" in row:
            # Only a budget below what the kind can reach is refused, and the library says so.
            assert "smallest size reachable" in row["refused"]  # the library says so
            continue
        assert row["params"] <= row["kept"] * total  # at most the budget
        assert row["oneshot"] > 1 and row["recovered"] > 1
        assert row["prefill_vs_dense"] > 0
    # FFN channels reach both budgets on this model; heads alone never reach a quarter.
    assert all("refused" not in row for row in rows if row["kind"] == "channel")
    assert all("refused" in row for row in rows if row["kind"] == "head")
    if "hidden" in kinds:
        scores = [(row["kept"], row["importance"]) for row in results["hidden_scores"]]
        assert scores == [
            (kept, score)
            for kept in (0.75, 0.5)
            for score in ("activation", "magnitude", "taylor", "random")
        ]
    table = (tmp_path / "width.md").read_text()
    assert table in out
    assert "| FFN channels | 25% | activation |" in table
