"""The reconstruction benchmark runs end to end at a tiny size and writes its tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script

pytest.importorskip("transformers")


@pytest.mark.slow
def test_reconstruction_benchmark_prunes_every_cell_without_and_with_reconstruction(
    tmp_path: Path,
) -> None:
    out = run_script(
        "bench_reconstruction.py", "--tiny", "--out", str(tmp_path), "--cache", str(tmp_path)
    )
    results = json.loads((tmp_path / "reconstruction.json").read_text())
    rows = results["rows"]
    cells = [(row["kind"], row["sparsity"], row["importance"]) for row in rows]
    assert cells == [
        (kind, 0.5, importance)
        for kind in ("channel", "head")
        for importance in ("magnitude", "wanda", "taylor")
    ]
    dense = results["dense"]
    for row in rows:
        assert math.isclose(row["ratio"], row["reconstructed"] / row["plain"])
        # Re-solved to match the dense outputs: closer to the dense model, better or worse.
        assert abs(row["reconstructed"] - dense) < abs(row["plain"] - dense), row
    sweep = [(cell["kind"], cell["damping"]) for cell in results["damping_sweep"]]
    assert sweep == [(kind, d) for kind in ("channel", "head") for d in (0.0, 0.01)]
    table = (tmp_path / "reconstruction.md").read_text()
    assert table in out and "| FFN channels | 50% | wanda |" in table
