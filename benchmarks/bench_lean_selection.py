"""Global L1 selection in the three ways to hold masks, side by side (CPU, fp32 by default).

Run (about 4 minutes on a 2-core machine at the default sizes; needs ~12 GB of free memory for
torch at 200M parameters)::

    python benchmarks/bench_lean_selection.py                       # 50M and 200M, 1 repeat
    python benchmarks/bench_lean_selection.py --sizes 50M --repeats 3
    python benchmarks/bench_lean_selection.py --quick               # 2M, no torch past 10M
    python benchmarks/bench_lean_selection.py --dtype bfloat16      # the weights in bf16

Three ways, each measured in a fresh process (so no allocator state carries over), on the models
of ``bench_global_unstructured.py`` (stacks of transformer-shaped ``nn.Linear`` weights):

* **lean**: ``Pruner(model, schedule, masking="inplace")``: a ``bool`` mask per weight, the
  weights zeroed in place;
* **reparametrize**: the same ``Pruner`` with the default ``masking="reparametrize"``
  (torch's ``_orig``, float ``_mask`` and recomputed weight);
* **torch**: :func:`torch.nn.utils.prune.global_unstructured` with ``L1Unstructured``.

The **first** call prunes 50% of an unpruned model (for the pruners: building the pruner and
its first step, both timed); the **second** is an iterative one on top of it (an untimed first
call, then the timed call that takes the sparsity to 75%: ``amount=0.5`` of the rest for torch).
Per call: the time, the **peak** extra memory (peak resident memory during the call, ``VmHWM``
reset through ``/proc/self/clear_refs`` just before it, minus the resident memory before it) and
the **held** extra memory (resident memory after the call minus before it), per parameter. Each
process warms its library up on a small stand-in model first and touches and frees the memory
the call may use (see ``bench_global_unstructured.py`` for why, and for ``cpu_seconds``, the
call's CPU time, beside its wall time in the JSON). Printed: a table with the
speed-up of each mode against torch in the same run; results go to
``benchmarks/results/lean_selection.json`` and ``.md``. Timings from a busy machine are noisy:
compare the ratios of one run. ``--plot`` draws the docs' two figures from that JSON, measuring
nothing (``docs/figures/lean_selection_time.png`` and ``lean_selection_memory.png``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_global_unstructured import _label, _shapes, _warm_memory
from harness import (
    PeakMemory,
    WorkerError,
    cpu_seconds,
    how_often,
    machine,
    median_of_runs,
    parse_size,
    worker_json,
    write_results,
)
from plotting import add_plot_option, plot_saved

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("lean", "reparametrize", "torch")
FIRST, SECOND = 0.5, 0.75  # cumulative sparsity after the first and the second call
_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _targets(step: int) -> float:
    """The pruners' schedule: 50% at step 0, 75% at step 1 (a module-level function)."""
    return (FIRST, SECOND)[min(step, 1)]


# --- the worker: one measurement in this process ----------------------------------------------


def _model(params: int, dtype: str = "float32") -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = []
    for out_features, in_features in _shapes(params, "transformer"):
        layer = nn.utils.skip_init(
            nn.Linear, in_features, out_features, bias=False, dtype=getattr(torch, dtype)
        )
        with torch.no_grad():
            layer.weight.normal_()
        layers.append(layer)
    return nn.Sequential(*layers)


def _caller(mode: str, model: Any) -> Any:
    """``call()`` prunes once more: to 50%, then to 75% of the weights."""
    if mode == "torch":
        import torch.nn.utils.prune as prune

        pairs = [(layer, "weight") for layer in model]

        def call() -> None:
            prune.global_unstructured(pairs, prune.L1Unstructured, amount=0.5)

        return call
    from tensorplay.ao.pruning import Pruner
    from tensorplay.ao.pruning.pruner.schedules import CallableSchedule

    holder: dict[str, Any] = {}

    def step() -> None:
        if "pruner" not in holder:  # the first call builds the pruner: timed with its step
            schedule = CallableSchedule(_targets, end_step=1)
            masking = "inplace" if mode == "lean" else "reparametrize"
            holder["pruner"] = Pruner(model, schedule, masking=masking)
        holder["pruner"].step()

    return step


def _pruned(model: Any) -> int:
    return sum(int((layer.weight_mask == 0).sum()) for layer in model)


def worker(mode: str, params: int, call: str, dtype: str = "float32") -> dict[str, Any]:
    """Build the model, make the call, report time and memory (run in a fresh process)."""
    import torch

    warm = _model(300_000, dtype)
    for _ in range(2):
        _caller(mode, warm)()
    del warm
    model = _model(params, dtype)
    total = sum(layer.weight.numel() for layer in model)
    prune_once = _caller(mode, model)
    if call == "second":
        prune_once()
    _warm_memory(total)
    with PeakMemory() as memory:
        start, cpu_start = time.perf_counter(), cpu_seconds()
        prune_once()
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    expected = round((FIRST if call == "first" else SECOND) * total)
    if mode == "lean":
        zeros = sum(int((layer.weight == 0).sum()) for layer in model)
        if zeros < expected:
            raise RuntimeError(f"lean: {zeros} zero weights, expected at least {expected}")
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "peak_bytes_per_param": (memory.peak - memory.before) / total,
        "held_bytes_per_param": (memory.after - memory.before) / total,
        "params": total,
        "pruned": _pruned(model),
        "expected_pruned": expected,
        "threads": torch.get_num_threads(),
    }


# --- the driver: subprocesses, medians, the table ---------------------------------------------


def measure(mode: str, params: int, call: str, repeats: int, dtype: str) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        try:
            runs.append(worker_json(__file__, "--worker", mode, str(params), call, dtype))
        except WorkerError as error:
            return {"error": error.last_lines}
    # torch rounds its relative amount once per call; the pruners' counts are exact.
    if any(abs(r["pruned"] - r["expected_pruned"]) > (mode == "torch") for r in runs):
        return {"error": [f"wrong count: {runs}"]}
    medians = ("cpu_seconds", "peak_bytes_per_param", "held_bytes_per_param")
    return {**median_of_runs(runs, medians, firsts=("params", "threads")), "repeats": repeats}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for size in args.sizes:
        for call in ("first", "second"):
            row: dict[str, Any] = {"size": _label(size), "call": call}
            for mode in MODES:
                if mode == "torch" and (args.skip_torch or size > args.torch_max):
                    continue
                row[mode] = measure(mode, size, call, args.repeats, args.dtype)
                _progress(row, mode)
            rows.append(row)
    return {
        "machine": machine("cpus", "platform", "python", "torch"),
        "repeats": args.repeats,
        "dtype": args.dtype,
        "rows": rows,
    }


def _progress(row: dict[str, Any], mode: str) -> None:
    result = row[mode]
    shown = result.get("error") or (
        f"{result['seconds']:.3f}s peak {result['peak_bytes_per_param']:.2f} "
        f"held {result['held_bytes_per_param']:.2f} B/param"
    )
    print(f"  {row['size']:>5} {row['call']:<6} {mode:<13} {shown}", flush=True)


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| params | call | mode | time (s) | vs torch | peak extra B/param | held extra B/param |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        torch_result = row.get("torch", {})
        for mode in MODES:
            if mode not in row:
                continue
            result = row[mode]
            if "error" in result:
                error = result["error"]
                lines.append(f"| {row['size']} | {row['call']} | {mode} | error: {error} | | | |")
                continue
            ratio = "—"
            if mode != "torch" and "seconds" in torch_result:
                ratio = f"{torch_result['seconds'] / result['seconds']:.1f}x faster"
            held = result["held_bytes_per_param"]  # below 0: memory given back, none added
            shown = f"{held:.2f}" if held > 0 else "none"
            lines.append(
                f"| {row['size']} | {row['call']} | {mode} | {result['seconds']:.3f} | {ratio} "
                f"| {result['peak_bytes_per_param']:.2f} | {shown} |"
            )
    machine = results["machine"]
    dtype = _DTYPES[results.get("dtype", "float32")]
    lines += [
        "",
        f"CPU, {dtype}, global L1; first call: 50% of an unpruned model, second: on to 75%. "
        f"{how_often(results['repeats'], 'in a fresh process')}; {machine['cpus']} CPUs, torch "
        f"{machine['torch']}, Python {machine['python']}. Peak: the most resident memory during "
        "the call minus before it; held: after minus before (none: no more than before). "
        "lean: Pruner(masking='inplace'); reparametrize: Pruner(masking='reparametrize'); "
        "torch: torch.nn.utils.prune.",
    ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], folder: Path) -> list[Path]:
    """Two figures: time against model size per mode, and extra bytes per parameter per mode.

    ``lean_selection_time.png``: one log-log panel per call, each pruner's point labelled with
    its speed-up over torch. ``lean_selection_memory.png``: at the largest size measured, the
    peak and the held extra bytes per parameter of each mode, one panel per call.
    """
    from plotting import COLORS, legend_below, new_figure, save, time_vs_size

    def measured(row: dict[str, Any], mode: str) -> dict[str, Any] | None:
        result = row.get(mode)
        return result if result is not None and "seconds" in result else None

    calls = {"first": "first call: 50% of an unpruned model", "second": "second call: on to 75%"}
    rows = {call: [row for row in results["rows"] if row["call"] == call] for call in calls}
    figure = new_figure(9.0, 3.8)
    panels = figure.subplots(1, 2, sharey=True)
    for axes, (call, title) in zip(panels, calls.items(), strict=True):
        sizes = sorted(rows[call], key=lambda row: row["lean"]["params"])
        time_vs_size(
            axes,
            [row["lean"]["params"] for row in sizes],
            [row["size"] for row in sizes],
            {mode: [(measured(row, mode) or {}).get("seconds") for row in sizes] for mode in MODES},
            reference="torch",
        )
        axes.set_title(title, fontsize=10)
    panels[1].set_ylabel("")
    legend_below(figure, panels[0])
    figure.suptitle(
        f"Global L1 selection, CPU {_DTYPES[results.get('dtype', 'float32')]}: time per call "
        "(labels: speed-up over torch)",
        fontsize=11,
    )
    written = [save(figure, folder / "lean_selection_time.png")]

    largest = max(results["rows"], key=lambda row: row["lean"]["params"])["size"]
    figure = new_figure(9.0, 3.6)
    panels = figure.subplots(1, 2, sharey=True)
    for axes, (call, title) in zip(panels, calls.items(), strict=True):
        row = next(r for r in rows[call] if r["size"] == largest)
        modes = [mode for mode in MODES if measured(row, mode)]
        for index, mode in enumerate(modes):
            result = row[mode]
            for offset, kind, alpha in ((-0.2, "peak", 0.45), (0.2, "held", 1.0)):
                value = result[f"{kind}_bytes_per_param"]
                axes.bar(index + offset, value, width=0.38, color=COLORS[mode], alpha=alpha)
                axes.annotate(
                    f"{round(value, 1) + 0.0:.1f}\n{kind}",  # + 0.0: -0.02 reads 0.0, not -0.0
                    (index + offset, max(value, 0.0)),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=9,
                )
        axes.set_xticks(range(len(modes)), modes)
        axes.set_title(title, fontsize=10)
        axes.grid(True, axis="y", alpha=0.3)
    panels[0].set_ylabel("extra bytes per parameter")
    top = max(axes.get_ylim()[1] for axes in panels)
    panels[0].set_ylim(0, top * 1.18)  # room for the labels above the tallest bar
    figure.suptitle(
        f"Memory of one call at {largest} parameters: peak during it (light), held after (dark)",
        fontsize=11,
    )
    written.append(save(figure, folder / "lean_selection_memory.png"))
    return written


def main(argv: list[str] | None = None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--worker":
        mode, params, call, dtype = argv[1:5]
        print(json.dumps(worker(mode, int(params), call, dtype)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="50M,200M", help="comma-separated, e.g. 10M,50M")
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes per measurement")
    parser.add_argument(
        "--torch-max", default="200M", help="largest size torch runs at (it needs ~47 B/param)"
    )
    parser.add_argument("--quick", action="store_true", help="2M, one repeat")
    parser.add_argument(
        "--skip-torch", action="store_true", help="no torch runs (e.g. in an A/B of two commits)"
    )
    parser.add_argument("--dtype", default="float32", choices=list(_DTYPES), help="the weights'")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    add_plot_option(parser)
    args = parser.parse_args(argv)
    if args.plot is not None:
        plot_saved(plot, args.out / "lean_selection.json", args.plot)
        return
    if args.quick:
        args.sizes, args.repeats = "2M", 1
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    args.torch_max = parse_size(args.torch_max)
    results = run(args)
    table = markdown(results)
    write_results(args.out, "lean_selection", results, table)
    print(table)


if __name__ == "__main__":
    main()
