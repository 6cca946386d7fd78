"""The width benchmark over seeds runs end to end at a tiny size, and its summary is the runs'
arithmetic."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script

pytest.importorskip("transformers")


@pytest.mark.slow
def test_width_over_seeds_summarises_every_run(tmp_path: Path) -> None:
    out = run_script(
        "bench_width_seeds.py", "--tiny", "--seeds", "0", "1",
        "--out", str(tmp_path), "--cache", str(tmp_path),
    )  # fmt: skip
    results = json.loads((tmp_path / "width_seeds.json").read_text())
    assert [run["seed"] for run in results["runs"]] == [0, 1]
    assert results["runs"][0]["dense"] != results["runs"][1]["dense"]  # two dense models
    for line in results["summary"]:
        rows = [
            row for run in results["runs"] for row in run["rows"]
            if (row["kind"], row["kept"]) == (line["kind"], line["kept"])
        ]  # fmt: skip
        met = [row for row in rows if "refused" not in row]
        assert (line["met"], line["seeds"]) == (len(met), 2)
        if met:
            values = [row["oneshot"] for row in met]
            assert line["oneshot"]["mean"] == pytest.approx(statistics.fmean(values))
            assert (line["oneshot"]["min"], line["oneshot"]["max"]) == (min(values), max(values))
    for won in results["mix_wins"].values():
        assert 0 <= won["oneshot"] <= won["seeds"] <= 2
    table = (tmp_path / "width_seeds.md").read_text()
    assert table in out
    assert "| searched mix | 25% | 2 of 2 |" in table
