"""The dependency-graph timing benchmark analyses every family at a tiny size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script

pytest.importorskip("transformers")

FAMILIES = [
    "Llama", "Qwen3", "Gemma 2", "Gemma 3", "Phi-3", "OLMo 2", "GPT-NeoX", "GPT-2", "BERT",
    "ViT", "Qwen3-MoE", "Mixtral",
]  # fmt: skip


@pytest.mark.slow
def test_family_analysis_benchmark_times_every_family_on_meta(tmp_path: Path) -> None:
    out = run_script("bench_family_analysis.py", "--tiny", "--out", str(tmp_path))
    results = json.loads((tmp_path / "family_analysis.json").read_text())
    assert list(results["families"]) == FAMILIES
    for row in results["families"].values():
        assert row["device"] == "meta" and row["params"] > 0 and row["seconds"] >= 0
    table = (tmp_path / "family_analysis.md").read_text()
    assert table in out and "| Mixtral |" in table
