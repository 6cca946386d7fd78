"""``--skip-torch`` leaves out the torch runs (the same code on both sides of an A/B)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "options", "result", "ours"),
    [
        ("bench_lean_selection.py", (), "lean_selection.json", {"lean", "reparametrize"}),
        (
            "bench_global_unstructured.py",
            ("--repeats", "1", "--no-billion", "--no-layouts"),
            "global_unstructured.json",
            {"tensorplay"},
        ),
    ],
)
def test_skip_torch_runs_tensorplay_alone(
    tmp_path: Path, script: str, options: tuple[str, ...], result: str, ours: set[str]
) -> None:
    run_script(script, "--sizes", "1M", *options, "--skip-torch", "--out", str(tmp_path))
    rows = json.loads((tmp_path / result).read_text())["rows"]
    assert [row["call"] for row in rows] == ["first", "second"]
    for row in rows:
        assert "torch" not in row
        assert all(row[mode]["seconds"] > 0 for mode in ours), row
