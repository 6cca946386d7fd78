"""The suite's rerun of a multi-process test whose port was taken (``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text(encoding="utf-8")
FLAKY = """
import pytest
from pathlib import Path

@pytest.mark.distributed
def test_ranks(tmp_path_factory):
    runs = Path(__file__).with_name("runs.txt")
    count = int(runs.read_text()) + 1 if runs.exists() else 1
    runs.write_text(str(count))
    if count <= {taken}:
        raise RuntimeError("code: -98, name: EADDRINUSE, message: address already in use")
    {then}
"""


def run(pytester: pytest.Pytester, taken: int, then: str = "pass") -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_flaky=FLAKY.format(taken=taken, then=then))
    pytester.makeini("[pytest]\nmarkers =\n    distributed: several processes\n")
    return pytester.runpytest("-p", "no:cacheprovider", "-p", "no:xdist")


def runs(pytester: pytest.Pytester) -> int:
    return int((pytester.path / "runs.txt").read_text())


def test_a_port_taken_once_is_run_again_and_passes(pytester: pytest.Pytester) -> None:
    run(pytester, taken=1).assert_outcomes(passed=1)
    assert runs(pytester) == 2


def test_a_port_taken_every_time_fails_after_the_retries(pytester: pytest.Pytester) -> None:
    run(pytester, taken=9).assert_outcomes(failed=1)
    assert runs(pytester) == 3


def test_another_failure_after_a_taken_port_is_not_retried(pytester: pytest.Pytester) -> None:
    result = run(pytester, taken=1, then="raise ValueError('a real bug')")
    result.assert_outcomes(failed=1)
    assert runs(pytester) == 2 and "a real bug" in result.stdout.str()
