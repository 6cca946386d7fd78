"""CI (``.ci/run``) runs the README's test command as written, then the slow tier."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (command,) = [line for line in readme.splitlines() if "pytest" in line and "-m" in line]
    return command


def _slow_tier() -> str:
    (line,) = [line for line in RUN.splitlines() if re.search(r"pytest .*-m slow", line)]
    return line


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    command = _readme_test_command()
    assert '-m "not slow"' in command
    assert command in RUN.splitlines()


def test_ci_runs_the_slow_tier_after_the_quick_one_on_two_workers() -> None:
    lines = RUN.splitlines()
    assert lines.index(_slow_tier()) > lines.index(_readme_test_command())
    assert "-n 2" in _slow_tier()


def test_an_empty_slow_tier_passes_and_a_failing_one_fails() -> None:
    """pytest's exit code 5 (no test collected) is not a failure; any other is."""
    tolerated = _slow_tier().split(" || ", 1)[1]
    for code, passes in [(0, True), (5, True), (1, False), (2, False)]:
        script = f"set -euo pipefail; (exit {code}) || {tolerated}; echo reached"
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
        assert (done.returncode == 0 and done.stdout == "reached\n") == passes, code
