"""The budget-and-recovery benchmark of reconstruction runs end to end at a tiny size."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script

pytest.importorskip("transformers")

IMPORTANCES = ("magnitude", "wanda", "taylor")


@pytest.mark.slow
def test_budget_benchmark_measures_every_cell_on_every_seed_and_recovers(
    tmp_path: Path,
) -> None:
    out = run_script(
        "bench_budget_reconstruction.py", "--tiny", "--out", str(tmp_path), "--cache", str(tmp_path)
    )
    results = json.loads((tmp_path / "budget_reconstruction.json").read_text())
    assert results["setup"]["structure"] == ["channel", "head"]
    assert results["setup"]["calibration_seeds"] == [0, 1]
    rows = results["rows"]
    assert [(row["kept"], row["importance"]) for row in rows] == [
        (0.5, importance) for importance in IMPORTANCES
    ]
    measured = {"perplexity", "seconds", "units_pruned", "finetuned", "distilled"}
    for row in rows:
        assert sorted(row["seeds"]) == ["0", "1"]  # JSON keys
        for seed in row["seeds"].values():
            assert sorted(seed) == ["plain", "reconstructed"]
            for cell in seed.values():
                assert measured | {"params", "heads", "channels"} == set(cell)
                # At most the budget: half of the model's parameters (one unit's worth below).
                assert cell["params"] <= results["params"] // 2
            # Reconstruction re-solves weights; it never changes which units go.
            plain, solved = seed["plain"], seed["reconstructed"]
            assert (plain["params"], plain["units_pruned"]) == (
                solved["params"],
                solved["units_pruned"],
            )
        for key in ("perplexity", "finetuned", "distilled"):
            spread = row[f"ratio_{key}"]
            assert spread["min"] <= spread["mean"] <= spread["max"]
            ratios = [s["reconstructed"][key] / s["plain"][key] for s in row["seeds"].values()]
            assert math.isclose(spread["mean"], sum(ratios) / len(ratios))
    # The recovery rows' reference: the dense model trained as long, on the seeds recovered.
    assert results["setup"]["recovery_seeds"] == [0, 1]
    assert sorted(results["dense_recovered"]) == ["distilled", "finetuned"]
    table = (tmp_path / "budget_reconstruction.md").read_text()
    assert table in out
    assert "| 50% | wanda |" in table and "calibration seeds 0, 1" in table
    assert "The dense model trained the same steps scores" in table
