"""The tracing benchmark runs end to end at a tiny size and writes its table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
def test_tracing_benchmark_times_the_analysis_against_a_forward(tmp_path: Path) -> None:
    out = run_script(
        "bench_structure_tracing.py", "--tiny", "--repeats", "1", "--out", str(tmp_path)
    )
    results = json.loads((tmp_path / "structure_tracing.json").read_text())
    assert list(results["seconds"]) == [
        "analysis",
        "analysis, no example",
        "torch.fx trace",
        "forward",
    ]
    assert all(value > 0 for value in results["seconds"].values())
    assert list(results["first_call"]) == [
        "import torch",
        "import torch._refs, torch._dynamo",
        "first analysis",
    ]
    # Each block's first conv is a group; so is the residual stream of each of the 4 stages
    # (the stem's joined with the first stage's); the classifier's outputs are left out.
    assert results["groups"] == 12 and results["unprunable"] == {
        "fc": "they reach the model's output"
    }
    table = (tmp_path / "structure_tracing.md").read_text()
    assert table in out and "| forward |" in table
