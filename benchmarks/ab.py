"""A/B of two commits: one benchmark script, alternated between them in fresh processes.

Run::

    python benchmarks/ab.py --old REV --new REV --rounds N [--out FILE.md] -- SCRIPT [ARGS...]

Both revisions are checked out into temporary worktrees (``git worktree add --detach``, removed
at the end). Each round runs SCRIPT, always the copy in the current checkout so both sides are
measured by the same code, once with ``PYTHONPATH`` set to each tree, the side that goes first
alternating from round to round; each run is a fresh process with its own ``--out`` folder,
started from outside any checkout, and it checks that ``tensorplay`` was imported from its
tree before the script runs. The script's JSON result is read back: every dict holding
``seconds`` in a list of rows is a measurement, keyed by the row's identifying fields (its
strings and numbers: size, layout, call) and the dict's name (the mode or library). Printed, and
written to ``--out``: per measurement, the median of the rounds on each side, new/old, and each
side's spread (min-max); where the measurements also hold ``cpu_seconds`` (the process CPU
time of the call, which other processes on a shared machine do not inflate as they do the wall
time) and ``peak_bytes_per_param`` (or ``extra_bytes_per_param``), a table of each; the machine
(CPUs, load average at start and end, torch version).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine

REPO = Path(__file__).resolve().parents[1]
SIDES = ("old", "new")
EXPECTED = "AB_TENSORPLAY_TREE"
# Runs SCRIPT as ``python SCRIPT`` would (its folder first on sys.path), once tensorplay is
# known to come from the tree under test: PYTHONPATH must win over the editable install.
CHILD = f"""
import os, runpy, sys
from pathlib import Path
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
import tensorplay
found = Path(tensorplay.__file__).resolve().parent.parent
expected = Path(os.environ["{EXPECTED}"]).resolve()
if found != expected:
    sys.exit(f"tensorplay imported from {{found}}, not from {{expected}}")
runpy.run_path(script, run_name="__main__")
"""

Key = tuple[str, ...]


def git(repo: Path, *args: str) -> str:
    """Run ``git -C repo args``; its stripped stdout."""
    done = subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


@contextmanager
def worktrees(repo: Path, revisions: dict[str, str], folder: Path) -> Iterator[dict[str, Path]]:
    """Detached worktrees of ``revisions`` (side: revision) under ``folder``, removed after."""
    trees: dict[str, Path] = {}
    try:
        for side, revision in revisions.items():
            trees[side] = folder / side
            git(repo, "worktree", "add", "--detach", "-q", str(trees[side]), revision)
            # callbacks/ installs as tensorplay.callbacks: importing the tree from PYTHONPATH
            # finds it there through a link, as the installed package has it.
            adapters = trees[side] / "tensorplay" / "callbacks"
            if (trees[side] / "callbacks").is_dir() and not adapters.exists():
                adapters.symlink_to(Path("..") / "callbacks", target_is_directory=True)
        yield trees
    finally:
        for tree in trees.values():
            if tree.exists():
                git(repo, "worktree", "remove", "--force", str(tree))
        git(repo, "worktree", "prune")


def run_once(tree: Path, script: Path, args: list[str], out: Path) -> dict[str, Any]:
    """Run ``script args --out out`` against ``tree`` in a fresh process; its JSON results.

    Returns:
        The parsed JSON files the script wrote into ``out``, by file stem.

    Raises:
        RuntimeError: The run failed (or imported tensorplay from elsewhere), or wrote no JSON.
    """
    out.mkdir(parents=True)
    env = {**os.environ, EXPECTED: str(tree)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-c", CHILD, str(script), *args, "--out", str(out)]
    done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} on {tree.name} failed:\n{done.stderr[-3000:]}")
    results = {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}
    if not results:
        raise RuntimeError(f"{script.name} on {tree.name} wrote no JSON into {out}")
    return results


# The fields of a measurement read as its peak memory, first found first.
MEMORY_FIELDS = ("peak_bytes_per_param", "extra_bytes_per_param")


def measurements(results: dict[str, Any], field: str = "seconds") -> dict[Key, float | None]:
    """Every timed measurement of a script's results: key to seconds (``None``: an error).

    A measurement is a dict with ``seconds`` (or ``error``) inside a row of a list of rows, or
    an entry of a row's ``seconds`` dict (way: seconds); its key is the file stem, the list's
    name unless it is ``rows``, the row's strings and ints in order, and the dict's (or the
    way's) name. With another ``field`` (``"cpu_seconds"``, or ``"memory"``: its peak bytes per
    parameter, :data:`MEMORY_FIELDS`), the value is that field's, and measurements without it
    are left out.
    """
    found: dict[Key, float | None] = {}
    for stem, result in results.items():
        for table, rows in result.items():
            if not isinstance(rows, list):
                continue
            prefix = (stem,) if table == "rows" else (stem, table)
            for row in rows:
                # What names the row (a size, a layout, a batch), not what it measured: strings
                # and ints; a float or a flag differs from run to run.
                fields = tuple(
                    str(v)
                    for v in row.values()
                    if isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))
                )
                for name, value in row.items():
                    if isinstance(value, dict) and ("seconds" in value or "error" in value):
                        key = (*prefix, *fields, name)
                        if field == "seconds":
                            found[key] = value.get("seconds")
                            continue
                        names = MEMORY_FIELDS if field == "memory" else (field,)
                        held = [value[name] for name in names if name in value]
                        if held or "error" in value:
                            found[key] = held[0] if held else None
                    elif name == "seconds" and isinstance(value, dict) and field == "seconds":
                        for way, seconds in value.items():  # {way: seconds}
                            found[(*prefix, *fields, way)] = float(seconds)
    return found


def alternate(rounds: int) -> Iterator[tuple[int, str]]:
    """``(round, side)`` in run order: old first in even rounds, new first in odd ones."""
    for index in range(rounds):
        for side in SIDES if index % 2 == 0 else SIDES[::-1]:
            yield index, side


def _spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def table(samples: dict[Key, dict[str, list[float | None]]], unit: str = "s") -> list[str]:
    """Markdown rows: per key, medians, new/old and spreads (``error`` where a run failed)."""
    lines = [
        f"| measurement | old median ({unit}) | new median ({unit}) | new/old | old min-max "
        "| new min-max |",
        "|---|---|---|---|---|---|",
    ]
    one_file = len({key[0] for key in samples}) == 1
    for key, sides in samples.items():
        label = " / ".join(key[1:] if one_file else key)
        old, new = sides["old"], sides["new"]
        if not old or not new or None in old or None in new:
            lines.append(f"| {label} | error | error | | | |")
            continue
        old_times, new_times = [float(v or 0) for v in old], [float(v or 0) for v in new]
        old_median, new_median = statistics.median(old_times), statistics.median(new_times)
        lines.append(
            f"| {label} | {old_median:.3f} | {new_median:.3f} | {new_median / old_median:.3f} "
            f"| {_spread(old_times)} | {_spread(new_times)} |"
        )
    return lines


def report(
    samples: dict[Key, dict[str, list[float | None]]],
    header: dict[str, str],
    loads: tuple[tuple[float, ...], tuple[float, ...]],
    memory: dict[Key, dict[str, list[float | None]]] | None = None,
    cpu: dict[Key, dict[str, list[float | None]]] | None = None,
) -> str:
    """The markdown report: what was compared, the tables (times; CPU times and memory where
    measured), the machine."""
    start, end = (" ".join(f"{x:.2f}" for x in load) for load in loads)
    lines = [f"- {name}: {value}" for name, value in header.items()]
    lines += ["", *table(samples), ""]
    if cpu:
        lines += ["CPU time of the call (every thread of its process, user and system):", ""]
        lines += [*table(cpu, unit="CPU s"), ""]
    if memory:
        lines += ["Peak memory during the call, above what was resident before it:", ""]
        lines += [*table(memory, unit="B/param"), ""]
    record = machine("cpus", "torch", "python")
    lines.append(
        f"Machine: {record['cpus']} CPUs ({len(os.sched_getaffinity(0))} usable), load average "
        f"(1, 5, 15 min) {start} at start and {end} at end, torch {record['torch']}, Python "
        f"{record['python']}."
    )
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> tuple[argparse.Namespace, Path, list[str]]:
    """The options before ``--``; the script and its arguments after it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, help="the baseline revision")
    parser.add_argument("--new", required=True, help="the revision under test")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("give the benchmark after --: ... -- SCRIPT [ARGS...]")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    script = Path(argv[split + 1]).resolve()
    if not script.is_file():
        parser.error(f"no script {script}")
    return args, script, argv[split + 2 :]


def main(argv: list[str] | None = None) -> int:
    """Run the A/B; print the report (and write it to ``--out``).

    Returns:
        The exit status: 1 if a measurement failed on either side, else 0.
    """
    args, script, script_args = parse(sys.argv[1:] if argv is None else argv)
    revisions = {
        side: git(REPO, "rev-parse", "--verify", f"{getattr(args, side)}^{{commit}}")
        for side in SIDES
    }
    loads_start = os.getloadavg()
    samples: dict[Key, dict[str, list[float | None]]] = defaultdict(lambda: {"old": [], "new": []})
    memory: dict[Key, dict[str, list[float | None]]] = defaultdict(lambda: {"old": [], "new": []})
    cpu: dict[Key, dict[str, list[float | None]]] = defaultdict(lambda: {"old": [], "new": []})
    folder = Path(tempfile.mkdtemp(prefix="ab-"))
    try:
        with worktrees(REPO, revisions, folder / "trees") as trees:
            for index, side in alternate(args.rounds):
                out = folder / "runs" / f"{index}-{side}"
                results = run_once(trees[side], script, script_args, out)
                found = measurements(results)
                for key, seconds in found.items():
                    samples[key][side].append(seconds)
                for key, peak in measurements(results, "memory").items():
                    memory[key][side].append(peak)
                for key, spent in measurements(results, "cpu_seconds").items():
                    cpu[key][side].append(spent)
                print(
                    f"round {index + 1}/{args.rounds} {side}: {len(found)} measurements", flush=True
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    shown = script.relative_to(REPO) if script.is_relative_to(REPO) else script
    header = {
        "script": " ".join([str(shown), *script_args]),
        "old": f"{revisions['old'][:10]} ({args.old})",
        "new": f"{revisions['new'][:10]} ({args.new})",
        "rounds": f"{args.rounds}, alternating which side runs first",
    }
    text = report(samples, header, (loads_start, os.getloadavg()), memory, cpu)
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    failed = any(None in values or not values for s in samples.values() for values in s.values())
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
