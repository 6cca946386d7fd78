"""Accuracy at equal sparsity: pruning methods x sparsities x seeds, plus the dense baseline.

The sweep in the docs (48 runs; it took 5 minutes on 2 CPU cores with ``--jobs 2``)::

    python examples/sweep.py --jobs 2

A two-minute smoke version, and the plot alone redrawn from the runs of ``sweep.csv``::

    python examples/sweep.py --sparsities 0.9 --seeds 1 --epochs 20 --out /tmp/sweep
    python examples/sweep.py --plot                   # docs/results/sweep.png, nothing trained

Each method is one of the configs in ``examples/configs/`` with only its sparsity, seed and length
changed, so a row of the table can be reproduced with ``examples/train.py`` and that config:

* ``gradual`` (gradual, global): cubic schedule, all weights ranked together;
* ``layerwise`` (gradual, layer-wise): the same schedule, each tensor on its own;
* ``oneshot`` (one-shot + fine-tune): prune once half-way, fine-tune for the rest.

Runs are scored on the final weights on the 360 test images. Written to ``--out`` (default
``docs/results``): ``sweep.md`` (the table), ``sweep.rst`` (the same table for the docs),
``sweep.csv`` (one line per run) and ``sweep.png`` (accuracy against sparsity).
"""

from __future__ import annotations

import argparse
import csv
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plots import plot_accuracy_vs_sparsity
from train import TRAINER_DEFAULTS, main

from tensorplay.ao.pruning.masking.stats import sparsity_report

__all__ = ["METHODS", "Run", "plot_summary", "read_rows", "run", "scaled_config"]

CONFIGS = Path(__file__).resolve().parent / "configs"

# config in configs/ -> its name in the table
METHODS: dict[str, str] = {
    "gradual": "gradual, global",
    "layerwise": "gradual, layer-wise",
    "oneshot": "one-shot + fine-tune",
}
DENSE = "dense"
# Schedule fields counted in optimizer steps: scaled with --epochs so a shorter run keeps the
# same shape (dense warm-up, pruning window, fine-tuning) and the same number of pruning events.
STEP_FIELDS = ("start_step", "end_step", "step")
INTERVAL_FIELDS = ("frequency", "every")


@dataclass(frozen=True)
class Run:
    """One training run of the sweep."""

    method: str
    sparsity: float
    seed: int
    epochs: int


def scaled_config(
    name: str, *, epochs: int, seed: int, sparsity: float | None = None
) -> dict[str, Any]:
    """``configs/<name>.yaml`` shortened or lengthened to ``epochs``, with ``seed``, quiet.

    The schedule's step counts scale with ``epochs``; ``sparsity``, if given, replaces its
    final sparsity (``final_sparsity`` or ``sparsity``, whichever the schedule has).
    """
    config: dict[str, Any] = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    config["seed_everything"] = seed
    trainer = config.setdefault("trainer", {})
    # Only the test accuracy is kept: no logs, checkpoints or progress output per run.
    trainer.update(
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    for callback in trainer.get("callbacks", []):
        schedule = callback["init_args"]["schedule"]["init_args"]
        factor = epochs / TRAINER_DEFAULTS["max_epochs"]
        for field in STEP_FIELDS:
            if field in schedule:
                schedule[field] = round(schedule[field] * factor)
        for field in INTERVAL_FIELDS:
            if field in schedule:
                schedule[field] = max(1, round(schedule[field] * factor))
        if sparsity is not None:
            field = "final_sparsity" if "final_sparsity" in schedule else "sparsity"
            schedule[field] = sparsity
    return config


def run(spec: Run) -> dict[str, Any]:
    """Train and test one run; returns its spec, measured sparsity and test accuracy."""
    start = time.perf_counter()
    # A worker inherits the sweep's flags in sys.argv, which LightningCLI warns about when it is
    # also given `args`; and forty-odd runs need no banner each: only warnings are shown.
    warnings.filterwarnings("ignore", "LightningCLI's args parameter")
    logging.getLogger("lightning").setLevel(logging.WARNING)
    config = scaled_config(spec.method, epochs=spec.epochs, seed=spec.seed, sparsity=spec.sparsity)
    cli = main(config, run=False, save_config_callback=None)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    [result] = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    return {
        "method": spec.method,
        "target": spec.sparsity,
        "seed": spec.seed,
        "epochs": spec.epochs,
        "sparsity": sparsity_report(cli.model).sparsity,
        "test_acc": result["test/acc"],
        "seconds": time.perf_counter() - start,
    }


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[float, tuple[float, float]]]:
    """``{method: {sparsity: (mean, std)}}`` of the test accuracy in percent."""
    groups: dict[str, dict[float, list[float]]] = {}
    for row in rows:
        groups.setdefault(row["method"], {}).setdefault(row["target"], []).append(
            100 * row["test_acc"]
        )
    return {
        method: {target: _mean_std(accs) for target, accs in sorted(by_target.items())}
        for method, by_target in groups.items()
    }


def _cells(summary: dict[str, dict[float, tuple[float, float]]], sparsity: float) -> list[str]:
    means = {m: summary[m][sparsity][0] for m in METHODS if sparsity in summary.get(m, {})}
    best = max(means.values()) if means else None
    cells = []
    for method in METHODS:
        if method not in means:
            cells.append("")
            continue
        mean, std = summary[method][sparsity]
        text = f"{mean:.2f} ± {std:.2f}"
        cells.append(f"**{text}**" if f"{mean:.2f}" == f"{best:.2f}" else text)  # ties too
    return cells


def _caption(summary: dict[str, dict[float, tuple[float, float]]], seeds: int, epochs: int) -> str:
    dense = summary.get(DENSE, {}).get(0.0)
    baseline = f"dense baseline {dense[0]:.2f} ± {dense[1]:.2f}; " if dense else ""
    return (
        f"Test accuracy (%) on the 360 held-out digits, mean ± std over {seeds} seeds, "
        f"{epochs} epochs, 64-256-256-10 MLP; {baseline}best per row in bold. "
        "Written by `python examples/sweep.py`."
    )


def write_markdown(summary: dict[str, Any], sparsities: list[float], caption: str) -> str:
    """The table as GitHub markdown."""
    lines = [caption, "", "| sparsity | " + " | ".join(METHODS.values()) + " |"]
    lines.append("|---:|" + "---:|" * len(METHODS))
    for sparsity in sparsities:
        cells = _cells(summary, sparsity)
        lines.append(f"| {100 * sparsity:g}% | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_rst(summary: dict[str, Any], sparsities: list[float], caption: str) -> str:
    """The table as a reStructuredText ``list-table``, for ``.. include::`` in the docs."""
    lines = [caption.replace("`", "``"), "", ".. list-table::", "   :header-rows: 1", ""]
    lines.append("   * - sparsity")
    lines += [f"     - {label}" for label in METHODS.values()]
    for sparsity in sparsities:
        lines.append(f"   * - {100 * sparsity:g}%")
        lines += [f"     - {cell or '..'}" for cell in _cells(summary, sparsity)]
    # docs/results.rst includes this file; a path from the docs' root finds the plot beside it.
    lines += ["", ".. image:: /results/sweep.png", "   :alt: test accuracy against sparsity"]
    return "\n".join(lines) + "\n"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The runs of a ``sweep.csv`` as :func:`run` returned them (the numbers as floats)."""
    with open(path, newline="") as file:
        return [
            {**row, "target": float(row["target"]), "test_acc": float(row["test_acc"])}
            for row in csv.DictReader(file)
        ]


def plot_summary(summary: dict[str, dict[float, tuple[float, float]]], path: Path) -> Path:
    """Accuracy against sparsity, one line per method with its spread, the dense run as a band."""
    curves = {
        label: [(100 * sparsity, *acc) for sparsity, acc in summary[method].items()]
        for method, label in METHODS.items()
        if method in summary
    }
    return plot_accuracy_vs_sparsity(curves, summary.get(DENSE, {}).get(0.0), path)


def main_sweep(argv: Sequence[str] | None = None) -> None:
    """Parse the flags, run the sweep, write the table, CSV and plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sparsities",
        type=float,
        nargs="+",
        default=[0.5, 0.8, 0.9, 0.95, 0.98],
        help="final sparsities (default: %(default)s)",
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default: 3)")
    parser.add_argument(
        "--epochs",
        type=int,
        default=TRAINER_DEFAULTS["max_epochs"],
        help="epochs per run; the schedules are scaled to fit (default: %(default)s)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        choices=list(METHODS),
        help="configs to compare (default: all)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (1 thread each)")
    parser.add_argument("--out", type=Path, default=Path("docs/results"), help="%(default)s")
    parser.add_argument(
        "--plot", action="store_true", help="only redraw sweep.png from the sweep.csv in --out"
    )
    args = parser.parse_args(argv)
    if args.plot:
        if not (args.out / "sweep.csv").is_file():
            parser.error(f"--plot needs the runs of a sweep: no {args.out / 'sweep.csv'}")
        print(plot_summary(summarize(read_rows(args.out / "sweep.csv")), args.out / "sweep.png"))
        return

    specs = [Run(DENSE, 0.0, seed, args.epochs) for seed in range(args.seeds)]
    specs += [
        Run(method, sparsity, seed, args.epochs)
        for sparsity in args.sparsities
        for method in args.methods
        for seed in range(args.seeds)
    ]
    print(f"{len(specs)} runs, {args.jobs} at a time", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    # spawn: a fresh interpreter per worker, not a fork of one that has started torch threads.
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        for row in pool.map(run, specs):
            rows.append(row)
            print(
                f"[{len(rows)}/{len(specs)}] {row['method']:<9} target {row['target']:.2f} "
                f"seed {row['seed']}: sparsity {row['sparsity']:.4f}, "
                f"test acc {100 * row['test_acc']:.2f}% ({row['seconds']:.0f} s)",
                flush=True,
            )

    with open(args.out / "sweep.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = summarize(rows)
    caption = _caption(summary, args.seeds, args.epochs)
    (args.out / "sweep.md").write_text(write_markdown(summary, args.sparsities, caption))
    (args.out / "sweep.rst").write_text(write_rst(summary, args.sparsities, caption))
    plot_summary(summary, args.out / "sweep.png")
    print(write_markdown(summary, args.sparsities, caption))
    names = ("sweep.md", "sweep.rst", "sweep.csv", "sweep.png")
    print("written: " + ", ".join(str(args.out / name) for name in names))


if __name__ == "__main__":
    main_sweep()
