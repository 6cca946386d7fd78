"""The export-size benchmark runs end to end at a tiny size and writes its table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_export_size.py"


@pytest.mark.slow
def test_export_size_benchmark_measures_every_file(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
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
    assert table in done.stdout and "| save_sparse (bitmask + non-zeros) |" in table
