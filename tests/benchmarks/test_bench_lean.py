"""The benchmarks of the lean mode and of sharded selection run end to end at a tiny size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
def test_lean_selection_benchmark_compares_three_modes(tmp_path: Path) -> None:
    out = run_script("bench_lean_selection.py", "--sizes", "1M", "--out", str(tmp_path))
    results = json.loads((tmp_path / "lean_selection.json").read_text())
    assert [(row["size"], row["call"]) for row in results["rows"]] == [
        ("1M", "first"),
        ("1M", "second"),
    ]
    for row in results["rows"]:
        for mode in ("lean", "reparametrize", "torch"):
            assert row[mode]["seconds"] > 0, row  # an error (a wrong count too) has no time
    table = (tmp_path / "lean_selection.md").read_text()
    assert table in out
    assert "| 1M | first | lean |" in table and "| 1M | second | torch |" in table
    assert "x faster |" in table


@pytest.mark.slow
def test_sharded_selection_benchmark_matches_one_process(tmp_path: Path) -> None:
    run_script(
        "bench_sharded_selection.py",
        *("--size", "50K", "--sources", "3", "--processes", "1,2", "--out", str(tmp_path)),
    )
    results = json.loads((tmp_path / "sharded_selection.json").read_text())
    assert [row["processes"] for row in results["rows"]] == [1, 2]
    single, sharded = results["rows"]
    assert [row["identical"] for row in results["rows"]] == [True, True]
    assert [call["call"] for call in sharded["calls"]] == ["first", "second"]
    assert all(call["collectives"] == 0 for call in single["calls"])
    assert all(call["collectives"] > 0 for call in sharded["calls"])
    assert all(0 < call["bytes_communicated"] < 4 * sharded["params"] for call in sharded["calls"])
    # The first call clears half of the units, exactly.
    assert sum(count for count, _ in single["calls"][0]["signature"]) == round(
        0.5 * single["params"]
    )
    assert "| 2 | first |" in (tmp_path / "sharded_selection.md").read_text()


@pytest.mark.slow
def test_training_overhead_benchmark_measures_every_way(tmp_path: Path) -> None:
    run_script(
        "bench_training_overhead.py",
        *("--width", "32", "--batches", "4,8", "--rounds", "2", "--steps", "1"),
        *("--warmup", "1", "--threads", "1", "--out", str(tmp_path)),
    )
    results = json.loads((tmp_path / "training_overhead.json").read_text())
    assert [row["batch"] for row in results["rows"]] == [4, 8]
    for row in results["rows"]:
        assert set(row["seconds"]) == {"dense", "floor", "lean", "reparametrize"}
        assert all(len(times) == 2 for times in row["seconds_all"].values())
        assert row["sparsity"]["dense"] == 0
        # 4 x 32 x 32 weights pruned to 90%: exactly round(0.9 * 4096) zeros.
        assert row["sparsity"]["lean"] == round(0.9 * 4096) / 4096
        assert row["sparsity"]["reparametrize"] == round(0.9 * 4096) / 4096
        assert row["lean_zeros_kept"] is True
    assert "| 8 |" in (tmp_path / "training_overhead.md").read_text()
