"""The export-size benchmark runs end to end at a tiny size and writes its table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
def test_export_size_benchmark_measures_every_file(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    out = run_script("bench_export_size.py", "--tiny", "--out", str(tmp_path))
    results = json.loads((tmp_path / "export_size.json").read_text())
    sizes = results["sizes"]
    assert list(sizes) == [
        "dense (torch.save)",
        "pruned checkpoint (_orig + _mask, torch.save)",
        "permanent_state_dict (torch.save)",
        "permanent_state_dict (safetensors)",
        "save_sparse (bitmask + non-zeros)",
    ]
    assert (
        sizes["pruned checkpoint (_orig + _mask, torch.save)"] > 1.5 * sizes["dense (torch.save)"]
    )
    assert sizes["save_sparse (bitmask + non-zeros)"] < sizes["permanent_state_dict (safetensors)"]
    assert results["zero_fraction"] > 0.85
    table = (tmp_path / "export_size.md").read_text()
    assert table in out and "| save_sparse (bitmask + non-zeros) |" in table
