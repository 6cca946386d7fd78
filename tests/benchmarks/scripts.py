"""Running a benchmark script end to end, as a user would, in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_script(script: str, *args: str) -> str:
    """Run ``benchmarks/<script>`` with ``args``; fail the test with its stderr unless it exits 0.

    Returns:
        What the script printed.
    """
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
