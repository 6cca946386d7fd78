"""The A/B harness: two revisions alternated in fresh processes, each checked for its tree."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.benchmarks.scripts import BENCHMARKS, load_script, run_script


def test_measurements_are_keyed_by_the_rows_fields_and_the_mode() -> None:
    results = {
        "global_unstructured": {
            "machine": {"cpus": 2},
            "rows": [
                {
                    "size": "1M",
                    "layout": "transformer",
                    "call": "first",
                    "tensorplay": {"seconds": 0.5, "params": 10},
                },
                {
                    "size": "1M",
                    "layout": "transformer",
                    "call": "second",
                    "torch": {"error": ["boom"]},
                },
            ],
            "layouts": [{"size": "5M", "layout": "tensors64", "tensorplay": {"seconds": 2.0}}],
        }
    }
    assert load_script("ab").measurements(results) == {
        ("global_unstructured", "1M", "transformer", "first", "tensorplay"): 0.5,
        ("global_unstructured", "1M", "transformer", "second", "torch"): None,
        ("global_unstructured", "layouts", "5M", "tensors64", "tensorplay"): 2.0,
    }


def test_a_rows_seconds_by_way_are_measurements_too() -> None:
    results = {
        "training_overhead": {
            "width": 256,
            "rows": [
                {
                    "batch": 64,
                    "seconds": {"dense": 0.1, "lean": 0.12},
                    "lean_over_floor": 1.43,  # measured, differs per run: not part of the key
                    "lean_zeros_kept": True,
                }
            ],
        }
    }
    assert load_script("ab").measurements(results) == {
        ("training_overhead", "64", "dense"): 0.1,
        ("training_overhead", "64", "lean"): 0.12,
    }


def test_memory_and_cpu_time_are_keyed_like_the_times_where_a_measurement_has_them() -> None:
    results = {
        "lean_selection": {
            "rows": [
                {
                    "size": "1M",
                    "call": "first",
                    "lean": {"seconds": 0.5, "peak_bytes_per_param": 1.25},
                    "torch": {"seconds": 2.0},  # no memory: left out
                    "reparametrize": {"error": ["boom"]},
                },
                {"size": "1M", "call": "second", "tensorplay": {"extra_bytes_per_param": 8.0}},
            ],
        }
    }
    assert load_script("ab").measurements(results, "memory") == {
        ("lean_selection", "1M", "first", "lean"): 1.25,
        ("lean_selection", "1M", "first", "reparametrize"): None,
    }
    assert load_script("ab").measurements(results, "cpu_seconds") == {
        ("lean_selection", "1M", "first", "reparametrize"): None
    }
    samples = {("lean_selection", "1M", "first", "lean"): {"old": [3.0, 3.5], "new": [1.0, 1.5]}}
    text = load_script("ab").report({}, {"script": "x"}, ((1.0,), (1.0,)), samples, samples)
    assert "| measurement | old median (B/param) | new median (B/param) |" in text
    assert "| measurement | old median (CPU s) | new median (CPU s) |" in text
    assert "| 1M / first / lean | 3.250 | 1.250 | 0.385 | 3.000-3.500 | 1.000-1.500 |" in text


def test_rounds_alternate_which_side_goes_first() -> None:
    assert list(load_script("ab").alternate(3)) == [
        (0, "old"),
        (0, "new"),
        (1, "new"),
        (1, "old"),
        (2, "old"),
        (2, "new"),
    ]


@pytest.mark.slow
def test_a_run_refuses_tensorplay_from_another_tree(tmp_path: Path) -> None:
    elsewhere = tmp_path / "tree"
    elsewhere.mkdir()  # no tensorplay here: the import falls through to the installed one
    script = BENCHMARKS / "bench_global_unstructured.py"
    with pytest.raises(RuntimeError, match="not from"):
        load_script("ab").run_once(elsewhere, script, ["--sizes", "1M"], tmp_path / "out")


@pytest.mark.slow
def test_ab_compares_two_revisions_end_to_end(tmp_path: Path) -> None:
    has_parent = subprocess.run(
        ["git", "-C", str(BENCHMARKS), "rev-parse", "--verify", "-q", "HEAD~1"],
        capture_output=True,
        check=False,
    )
    if has_parent.returncode != 0:
        pytest.skip("needs a git checkout with HEAD~1")
    before = _ab_trees()
    report = tmp_path / "ab.md"
    out = run_script(
        "ab.py",
        *("--old", "HEAD~1", "--new", "HEAD", "--rounds", "2", "--out", str(report), "--"),
        str(BENCHMARKS / "bench_global_unstructured.py"),
        *("--sizes", "1M", "--repeats", "1", "--no-billion", "--no-layouts", "--skip-torch"),
    )
    text = report.read_text()
    assert text in out
    assert out.index("round 1/2 old") < out.index("round 1/2 new")
    assert out.index("round 2/2 new") < out.index("round 2/2 old")
    for call in ("first", "second"):
        row = next(line for line in text.splitlines() if f"| 1M / transformer / {call} /" in line)
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[0].endswith("tensorplay") and "error" not in row, row
        assert _ratio_fits(float(cells[1]), float(cells[2]), float(cells[3])), row
    assert "torch 2." in text and "load average" in text
    assert _ab_trees() <= before  # its own trees removed at the end (others may be running)


def _ratio_fits(old: float, new: float, ratio: float, places: int = 3) -> bool:
    """Whether ``ratio`` (printed to ``places`` decimals, from the unrounded medians) can be
    new/old for some medians that print as ``old`` and ``new``: at a few milliseconds the
    rounding alone moves the quotient of the printed medians by several percent.

    Example:
        >>> _ratio_fits(0.011, 0.005, 0.48), _ratio_fits(0.011, 0.005, 0.6)
        (True, False)
    """
    half = 0.5 * 10.0**-places
    low = max(new - half, 0.0) / (old + half)
    high = (new + half) / max(old - half, 10.0**-9)
    return low - half <= ratio <= high + half


def _ab_trees() -> set[str]:
    """The worktrees of this checkout that ab.py made (in the temporary folder)."""
    listing = subprocess.run(
        ["git", "-C", str(BENCHMARKS), "worktree", "list", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    prefix = f"worktree {Path(tempfile.gettempdir()) / 'ab-'}"
    return {line for line in listing.splitlines() if line.startswith(prefix)}
