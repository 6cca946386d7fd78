"""``bench_cuda_bf16.py`` runs where CI has no GPU: its CPU dry run checks and times the same
code, and without a GPU the default run says so and exits cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
def test_the_cpu_dry_run_checks_masks_and_times_every_way(tmp_path: Path) -> None:
    out = run_script(
        "bench_cuda_bf16.py",
        *("--device", "cpu", "--check-params", "600K", "--sizes", "300K"),
        *("--width", "128", "--repeats", "1", "--out", str(tmp_path)),
    )
    checks = [line for line in out.splitlines() if line.startswith("check at ")]
    assert checks, out  # printed when checked and again above the table
    for line in checks:
        assert line.count("masks equal the CPU's: True") == 2 and "False" not in line, line
    results = json.loads((tmp_path / "cuda_bf16.json").read_text())
    for way in ("lean", "global_unstructured"):
        check = results["check"][way]
        assert check["equal"] and check["exact"]
        assert check["pruned"] == check["params"] // 2 > 0
    (row,) = results["rows"]
    assert all(row[way]["seconds"] > 0 for way in ("lean", "global_unstructured", "torch"))
    table = (tmp_path / "cuda_bf16.md").read_text()
    assert table in out and "| lean |" in table and "x |" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_without_a_gpu_the_default_run_says_so(tmp_path: Path) -> None:
    out = run_script("bench_cuda_bf16.py", "--out", str(tmp_path))
    assert out.strip() == "No CUDA device: nothing to measure (run this on a machine with a GPU)."
    assert list(tmp_path.iterdir()) == []
