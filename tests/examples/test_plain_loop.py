"""``examples/plain_loop.py`` runs from the command line: lottery tickets with the Pruner alone."""

from __future__ import annotations

import runpy
import sys

import pytest

from tests.examples.conftest import EXAMPLES

# --hidden 16: 64*16 + 16*16 + 16*10 = 1,440 weights; five rounds of 40% leave
# round(0.6**5 * 1440) of them: 1,328 pruned.
TINY = ["--steps", "60", "--hidden", "16"]
TOTAL_LINE = "total                1440    1328    92.22%  (target 92.22%)"


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    monkeypatch.setattr(sys, "argv", ["plain_loop.py", *TINY, *args])
    runpy.run_path(str(EXAMPLES / "plain_loop.py"), run_name="__main__")
    return capsys.readouterr().out


@pytest.mark.parametrize("rewind", ["none", "init", "step"])
def test_plain_loop_prunes_in_five_rounds(monkeypatch, capsys, rewind) -> None:
    lines = run(monkeypatch, capsys, "--rewind", rewind).splitlines()

    rounds = [line.split(":")[0] for line in lines if line.startswith("step ")]
    assert rounds == ["step 10", "step 20", "step 30", "step 40", "step 50"]
    assert lines[5].startswith("test accuracy ") and lines[5].endswith(" at sparsity 92.2%")
    assert lines[-1] == TOTAL_LINE


def test_seeded_random_pruning_gives_the_same_run_twice(monkeypatch, capsys) -> None:
    args = ("--method", "random_unstructured", "--seed", "3")
    first, second = run(monkeypatch, capsys, *args), run(monkeypatch, capsys, *args)
    assert first == second and first.splitlines()[-1] == TOTAL_LINE
    assert run(monkeypatch, capsys, "--method", "random_unstructured", "--seed", "4") != first
