"""Running a benchmark script end to end, as a user would, in a fresh process; or loading it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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
        timeout=900,  # a guard against a hang, loose enough for a loaded 2-core machine
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def load_script(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module (its functions, without running it), and
    registered in ``sys.modules`` under ``name``, where dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
