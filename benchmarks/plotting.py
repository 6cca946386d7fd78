"""The benchmarks' figures: drawn from the results JSON a script wrote, saved as PNG files.

Each benchmark script has ``plot(results, folder)``, which draws its figures from the dict it
wrote to ``results/<name>.json``, and a ``--plot [FOLDER]`` option that does so from the JSON in
``--out`` and measures nothing. This module holds what they share, and redraws every figure of
the docs from ``benchmarks/results/`` (no benchmark runs)::

    python benchmarks/plotting.py            # into docs/figures/
    python benchmarks/plotting.py --out /tmp/figures

matplotlib draws on its own ``Figure`` objects (the Agg canvas, no display, pyplot untouched).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: measuring needs none of it
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FIGURES = ROOT / "docs" / "figures"
DPI = 150
# One colour per way of pruning, the same in every figure.
COLORS = {
    "lean": "tab:green",
    "reparametrize": "tab:blue",
    "tensorplay": "tab:blue",
    "torch": "tab:red",
    "lightning": "tab:purple",
    "dense": "tab:gray",
    "floor": "tab:gray",
}
# The scripts whose figures the docs show, each with the results file its plot() reads.
SCRIPTS = {
    "bench_global_unstructured": "global_unstructured.json",
    "bench_lean_selection": "lean_selection.json",
    "bench_training_overhead": "training_overhead.json",
    "bench_callback_overhead": "callback_overhead.json",
    "bench_large_model": "large_model.json",
    "bench_structured_speed": "structured_speed.json",
    "bench_width": "width.json",
}

__all__ = [
    "COLORS",
    "DPI",
    "FIGURES",
    "add_plot_option",
    "legend_below",
    "new_figure",
    "plot_saved",
    "redraw_all",
    "save",
    "time_vs_size",
]

Plot = Callable[[dict[str, Any], Path], list[Path]]


def add_plot_option(parser: argparse.ArgumentParser) -> None:
    """The scripts' ``--plot [FOLDER]``: draw the figures of the saved results, measure nothing."""
    parser.add_argument(
        "--plot",
        nargs="?",
        const=FIGURES,
        type=Path,
        metavar="FOLDER",
        help="only draw the figures of the JSON in --out, into FOLDER (default: docs/figures)",
    )


def plot_saved(plot: Plot, results: Path, folder: Path) -> list[Path]:
    """Draw ``plot``'s figures from the JSON file ``results`` into ``folder``, and print them.

    Raises:
        FileNotFoundError: If ``results`` does not exist (the benchmark has not run).
    """
    if not results.is_file():
        raise FileNotFoundError(f"No results to plot at {results}: run the benchmark first.")
    written = plot(json.loads(results.read_text()), folder)
    for path in written:
        print(path)
    return written


def new_figure(width: float, height: float) -> Figure:
    """A blank figure of ``width`` x ``height`` inches (``DPI`` pixels per inch when saved)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def save(figure: Figure, path: Path) -> Path:
    """Write ``figure`` to ``path`` as a PNG (white background, so it reads in dark mode too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, facecolor="white")
    return path


def time_vs_size(
    axes: Axes,
    params: Sequence[int],
    labels: Sequence[str],
    seconds: Mapping[str, Sequence[float | None]],
    reference: str,
) -> None:
    """Seconds against parameters, both on log scales, one line per way.

    Each point of a way other than ``reference`` is labelled with its speed-up over
    ``reference`` at the same size (where both were measured).

    Args:
        axes: Where to draw.
        params: The model sizes, ascending.
        labels: How each size is written (``"50M"``).
        seconds: ``{way: [seconds per size, None where not measured]}``; a way named in
            ``COLORS`` gets its colour, any other (``"read pass"``) a grey dotted line.
        reference: The way the speed-ups are measured against.
    """
    for way, times in seconds.items():
        points = [(p, t) for p, t in zip(params, times, strict=True) if t is not None]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        if way in COLORS:
            axes.plot(xs, ys, marker="o", color=COLORS[way], label=way)
        else:
            axes.plot(xs, ys, marker=".", color="tab:gray", linestyle=":", label=way)
        if way == reference or way not in COLORS:
            continue
        for p, t, base in zip(params, times, seconds[reference], strict=True):
            if t is not None and base is not None:
                axes.annotate(
                    f"{base / t:.0f}x",
                    (p, t),
                    # Below and right of the point: the lines rise to the right, away from it.
                    xytext=(6, -5),
                    textcoords="offset points",
                    va="top",
                    fontsize=9,
                    fontweight="bold",
                    color=COLORS[way],
                )
    from matplotlib.ticker import NullLocator

    measured = [t for times in seconds.values() for t in times if t is not None]
    low, high = min(measured) / 2.5, max(measured) * 2  # room for the labels below the points
    if axes.get_autoscaley_on() is False:  # a panel sharing this y axis has set it already
        previous_low, previous_high = axes.get_ylim()
        low, high = min(low, previous_low), max(high, previous_high)
    axes.set_ylim(low, high)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xticks(list(params), list(labels))
    axes.xaxis.set_minor_locator(NullLocator())
    # Room on the right of the last size for its labels.
    axes.set_xlim(params[0] / 1.6, params[-1] * 2.2)
    axes.set_xlabel("parameters")
    axes.set_ylabel("seconds per call (log scale)")
    axes.grid(True, which="major", alpha=0.3)


def legend_below(figure: Figure, axes: Axes) -> None:
    """The legend of ``axes`` once, under the figure's panels, clear of every line."""
    handles, labels = axes.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=9)


def _load(script: str) -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module(script)


def redraw_all(results: Path = RESULTS, out: Path = FIGURES) -> list[Path]:
    """Every figure of the docs, drawn from the results JSON files in ``results``, into ``out``.

    Returns:
        The files written (a benchmark whose JSON is missing is skipped).
    """
    written: list[Path] = []
    for script, name in SCRIPTS.items():
        path = results / name
        if path.is_file():
            written += _load(script).plot(json.loads(path.read_text()), out)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="%(default)s")
    parser.add_argument("--out", type=Path, default=FIGURES, help="%(default)s")
    args = parser.parse_args(argv)
    for path in redraw_all(args.results, args.out):
        print(path)


if __name__ == "__main__":
    main()
