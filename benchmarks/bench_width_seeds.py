"""Width against depth over several seeds: is the searched mix's lead larger than seed noise?

Run (about 8 minutes per new seed on one thread: 5 to train its dense model, 3 for its rows)::

    python benchmarks/bench_width_seeds.py                 # seeds 0, 1 and 2
    python benchmarks/bench_width_seeds.py --tiny          # seconds: what the slow test runs

Each seed repeats ``bench_width.py``'s first table from scratch: its own dense model (the same
2-block byte-level GPT-2 trained 2,000 steps from that seed, cached beside seed 0's), pruned one
kind at a time and as the searched mix to keep 75% and 50% of its parameters, shrunk, scored
one-shot and after 150 steps of recovery with distillation (seeded alike). The table gives, per
kind and budget, the mean perplexity per byte over the seeds with its range, and per budget in
how many seeds the searched mix beat every single kind that met the budget.

Results go to ``benchmarks/results/width_seeds.json`` and ``.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.append(str(Path(__file__).resolve().parent))

import bench_width
from bench_width import KEPT, KINDS
from harness import machine, write_results

SEEDS = (0, 1, 2)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """``bench_width``'s first table once per seed (its hidden-score table left out)."""
    runs = []
    bench_width.HIDDEN_SCORES = ("activation",)  # its second table: the first's rows again
    for seed in args.seeds:
        bench_width.SEED = seed  # the dense model, the pruning draws and the recovery
        print(f"seed {seed}", flush=True)
        result = bench_width.measure(args)
        runs.append({"seed": seed, "dense": result["dense"], "params": result["params"],
                     "rows": result["rows"]})  # fmt: skip
    setup = {"seeds": list(args.seeds), "pretrain_steps": args.steps,
             "recovery_steps": args.recovery_steps, "calibration_windows": args.calibration,
             "val_windows": args.val_windows, "threads": torch.get_num_threads()}  # fmt: skip
    return {"runs": runs, "setup": setup, "machine": machine("cpus", "threads", "load", "torch")}


def summary(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per kind and budget: the seeds that met it, and the mean, least and most perplexity of
    each column over them."""
    rows = []
    for kept in KEPT:
        for kind in KINDS:
            found = [
                row for run in result["runs"] for row in run["rows"]
                if (row["kind"], row["kept"]) == (kind, kept)
            ]  # fmt: skip
            met = [row for row in found if "refused" not in row]
            line: dict[str, Any] = {"kind": kind, "kept": kept, "met": len(met),
                                    "seeds": len(found)}  # fmt: skip
            for key in ("oneshot", "recovered"):
                values = [row[key] for row in met if key in row]
                if values:
                    line[key] = {"mean": statistics.fmean(values), "min": min(values),
                                 "max": max(values)}  # fmt: skip
            rows.append(line)
    return rows


def mix_wins(result: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per budget (``"25%"`` removed) and column: in how many seeds the searched mix's
    perplexity is below every single kind's that met the budget."""
    wins: dict[str, dict[str, int]] = {}
    for kept in KEPT:
        label = f"{1 - kept:.0%}"
        wins[label] = {"oneshot": 0, "recovered": 0, "seeds": 0}
        for run in result["runs"]:
            rows = [row for row in run["rows"] if row["kept"] == kept and "refused" not in row]
            mix = [row for row in rows if row["kind"] == "mix"]
            singles = [row for row in rows if row["kind"] != "mix"]
            if not mix or not singles:
                continue
            wins[label]["seeds"] += 1
            for key in ("oneshot", "recovered"):
                if key in mix[0] and all(mix[0][key] < row[key] for row in singles):
                    wins[label][key] += 1
    return wins


def _cell(line: dict[str, Any], key: str) -> str:
    if key not in line:
        return "refused"
    found = line[key]
    return f"{found['mean']:.3f} ({found['min']:.3f}-{found['max']:.3f})"


def tables(result: dict[str, Any]) -> str:
    """The Markdown table and its caption."""
    seeds = result["setup"]["seeds"]
    lines = [
        "| pruned | removed (asked) | seeds that met it | one-shot: mean (range) "
        "| recovered: mean (range) |",
        "|---|---:|---:|---:|---:|",
    ]
    for line in summary(result):
        lines.append(
            f"| {KINDS[line['kind']][0]} | {1 - line['kept']:.0%} | {line['met']} of "
            f"{line['seeds']} | {_cell(line, 'oneshot')} | {_cell(line, 'recovered')} |"
        )
    dense = [run["dense"] for run in result["runs"]]
    verdicts = "; ".join(
        f"at {label} removed it beat every single kind one-shot in {won['oneshot']} of "
        f"{won['seeds']} seeds and recovered in {won['recovered']} of {won['seeds']}"
        for label, won in mix_wins(result).items()
    )
    lines += [
        "",
        f"Perplexity per byte over seeds {', '.join(map(str, seeds))} (each its own dense model: "
        f"{statistics.fmean(dense):.3f} on average, {min(dense):.3f}-{max(dense):.3f}), each kind "
        "pruned alone or as the searched mix to a parameter budget, shrunk, one-shot and "
        f"recovered by {result['setup']['recovery_steps']} steps of training with distillation. "
        f"The searched mix: {verdicts}. Measured by `benchmarks/bench_width_seeds.py` on the CPU.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps and windows: seconds")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--steps", type=int, default=bench_width.PRETRAIN_STEPS)
    parser.add_argument("--calibration", type=int, default=bench_width.CALIBRATION_WINDOWS)
    parser.add_argument("--val-windows", type=int, default=bench_width.VAL_WINDOWS)
    parser.add_argument("--recovery-steps", type=int, default=bench_width.RECOVERY_STEPS)
    parser.add_argument("--cache", type=Path, default=bench_width.CACHE)
    parser.add_argument("--out", type=Path, default=bench_width.ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    args.kept = KEPT
    if args.tiny:
        args.steps, args.calibration, args.val_windows, args.recovery_steps = 8, 16, 16, 2
    torch.set_num_threads(1)  # one thread: the machine is shared, and the times comparable
    result = measure(args)
    result["summary"], result["mix_wins"] = summary(result), mix_wins(result)
    table = tables(result)
    print(table)
    write_results(args.out, "width_seeds", result, table)
    return result


if __name__ == "__main__":
    main()
