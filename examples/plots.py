"""The plots of a run and of a sweep, written as PNG files (matplotlib, no display needed).

``plot_sparsity_curve`` reads the CSV logger's ``metrics.csv``; the per-layer bars come from
:func:`tensorplay.report.plot_layer_sparsity`, the same chart ``tensorplay-report --plot`` draws.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from tensorplay.report import plot_layer_sparsity

__all__ = ["plot_accuracy_vs_sparsity", "plot_layer_sparsity", "plot_sparsity_curve"]


def read_sparsity_curve(metrics_csv: Path) -> tuple[list[int], list[float], list[float]]:
    """``(steps, target, actual)`` from the rows of ``metrics.csv`` that logged pruning."""
    steps, target, actual = [], [], []
    with open(metrics_csv, newline="") as file:
        for row in csv.DictReader(file):
            if row.get("pruning/sparsity"):
                steps.append(int(row["step"]))
                target.append(100 * float(row["pruning/target_sparsity"]))
                actual.append(100 * float(row["pruning/sparsity"]))
    return steps, target, actual


def plot_sparsity_curve(metrics_csv: Path, path: Path) -> Path | None:
    """Target and actual sparsity per optimizer step; ``None`` if the run logged no pruning."""
    if not metrics_csv.is_file():
        return None
    steps, target, actual = read_sparsity_curve(metrics_csv)
    if not steps:
        return None
    figure = Figure(figsize=(6.4, 3.6), layout="constrained")
    axes = figure.add_subplot()
    # Both are step functions: the target holds between pruning steps, and so do the masks.
    axes.step(steps, actual, where="post", color="tab:blue", linewidth=3, alpha=0.6, label="actual")
    axes.step(steps, target, where="post", color="black", linestyle=":", label="target")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("sparsity (%)")
    axes.set_ylim(0, 100)
    axes.legend(loc="lower right")
    figure.savefig(path, dpi=120)
    return path


def plot_accuracy_vs_sparsity(
    results: Mapping[str, Sequence[tuple[float, float, float]]],
    dense: tuple[float, float] | None,
    path: Path,
) -> Path:
    """Test accuracy against sparsity, one line per method with its spread over seeds.

    Two panels: every point, and a close-up of the few points around the dense baseline where
    the methods differ by less than a point.

    Args:
        results: ``{method: [(sparsity %, mean accuracy %, std), ...]}``.
        dense: ``(mean, std)`` of the dense baseline, drawn as a band; ``None`` for no baseline.
        path: Where to write the PNG.
    """
    figure = Figure(figsize=(10, 4.0), layout="constrained")
    panels = figure.subplots(1, 2)
    sparsities = sorted({point[0] for points in results.values() for point in points})
    for axes in panels:
        if dense is not None:
            mean, std = dense
            axes.axhspan(mean - std, mean + std, color="grey", alpha=0.2)
            axes.axhline(mean, color="grey", linestyle="--", label="dense")
        for method, points in results.items():
            sparsity, accuracy, spread = zip(*points, strict=True)
            axes.errorbar(sparsity, accuracy, yerr=spread, marker="o", capsize=3, label=method)
        # 50, 80, 90, 95, 98%: each step halves what remains; a log scale of the density
        # (100 - sparsity) spaces them evenly where a linear axis crowds the interesting end.
        axes.set_xscale("function", functions=(_log_density, _from_log_density))
        axes.set_xticks(sparsities, [f"{s:g}" for s in sparsities])
        axes.set_xlabel("sparsity (% of weights pruned)")
        axes.set_ylabel("test accuracy (%)")
    panels[0].set_title("all runs")
    panels[0].legend(loc="lower left")
    if dense is not None:
        panels[1].set_ylim(dense[0] - 3, min(100.0, dense[0] + 1.5))
    panels[1].set_title("close-up around the dense baseline")
    figure.savefig(path, dpi=120)
    return path


def _log_density(sparsity: Any) -> Any:
    return -np.log10(np.clip(100.0 - np.asarray(sparsity), 1e-3, None))


def _from_log_density(value: Any) -> Any:
    return 100.0 - 10.0 ** (-np.asarray(value))
