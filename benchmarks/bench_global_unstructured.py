"""``global_unstructured`` side by side: tensorplay against ``torch.nn.utils.prune`` (CPU, fp32).

Run (the full run takes about 15 minutes on a 2-core machine and needs ~20 GB of free memory
for the 200M torch runs and the 1B tensorplay runs; run nothing heavy next to it)::

    python benchmarks/bench_global_unstructured.py                 # 10M, 50M, 200M, 1B, layouts
    python benchmarks/bench_global_unstructured.py --quick         # 2M and 10M, 1 repeat
    python benchmarks/bench_global_unstructured.py --sizes 10M,50M --repeats 5 --no-billion
    python benchmarks/bench_global_unstructured.py --skip-torch    # no torch rows

Every measurement runs in a fresh subprocess (so no allocator state or cache carries over): the
model is built, the library is warmed up on a small stand-in model (which pages in its code and
starts its threads, for torch and tensorplay alike), then the timed call is made, with the peak
resident memory reset just before it (``/proc/self/clear_refs``) and read just after
(``VmHWM``). "Extra" memory is that peak minus the
resident memory before the call, per parameter. The *second* call is an iterative one: a first
``amount=0.5`` call (not timed), then the timed ``amount=0.5`` call on top of it. The models are
stacks of transformer-shaped ``nn.Linear`` weights (``d x 4d`` and ``4d x d``); the layout rows
spread 50M parameters over 64 or 1024 tensors instead. The *read pass* is the time of one
``sum`` over every weight: the physical floor of any exact selection. Beside each call's wall
time the JSON holds its ``cpu_seconds``: the process's CPU time during the call (every thread,
user and system), which other processes on a shared machine do not stretch.

Results go to ``benchmarks/results/global_unstructured.json`` and ``.md`` (the docs include the
markdown table). ``--plot`` draws the figure of the docs from that JSON, measuring nothing::

    python benchmarks/bench_global_unstructured.py --plot   # docs/figures/global_unstructured.png
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (
    PeakMemory,
    WorkerError,
    cpu_seconds,
    machine,
    median_of_runs,
    parse_size,
    proc_kib,
    worker_json,
    write_results,
)
from plotting import add_plot_option, plot_saved

RESULTS = Path(__file__).resolve().parent / "results"
LIBRARIES = ("torch", "tensorplay")
WARM_BYTES_PER_PARAM = 48


# --- the worker: one measurement in this process ----------------------------------------------


def _shapes(params: int, layout: str) -> list[tuple[int, int]]:
    """Weight shapes of about ``params`` units."""
    if layout == "transformer":
        d = 512 if params < 20e6 else 1024 if params < 500e6 else 2048
        layers = max(1, round(params / (4 * d * d)))
        return [(4 * d, d) if i % 2 == 0 else (d, 4 * d) for i in range(layers)]
    count = int(layout.removeprefix("tensors"))
    rows = 256
    return [(rows, max(1, round(params / count / rows)))] * count


def _warm_memory(params: int) -> None:
    """Touch and free the memory the call may use, the same amount for both libraries.

    On a virtual machine the first touch of memory the guest has not used lately is far
    slower than any later one (on the 2-core VM the table comes from: ~1.4 s per GB, against
    ~0.2 s once the host backs it), and which calls meet it depends on what ran before. Touching
    and freeing ``WARM_BYTES_PER_PARAM`` bytes per parameter (torch's peak is ~47) just before
    the call, capped by the free memory, takes that machine artefact out of both libraries'
    times; the memory a call allocates is still faulted in by the call itself.
    """
    import torch

    available = proc_kib("MemAvailable", "/proc/meminfo") * 1024
    size = min(WARM_BYTES_PER_PARAM * params, available - (2 << 30))
    if size > 0:
        buffer = torch.empty(size // 4, dtype=torch.float32)
        buffer.fill_(0)
        del buffer


def worker(library: str, params: int, call: str, layout: str) -> dict[str, Any]:
    """Build the model, make the call, report time and memory (run in a fresh process)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = []
    for out_features, in_features in _shapes(params, layout):
        layer = nn.utils.skip_init(nn.Linear, in_features, out_features, bias=False)
        with torch.no_grad():
            layer.weight.normal_()
        layers.append(layer)
    pairs = [(layer, "weight") for layer in layers]
    total = sum(layer.weight.numel() for layer in layers)

    if library == "torch":
        import torch.nn.utils.prune as prune
    else:
        import tensorplay.ao.pruning as prune  # type: ignore[no-redef]

    def prune_once() -> None:
        prune.global_unstructured(pairs, prune.L1Unstructured, amount=0.5)

    # Warm-up on a small stand-in (both libraries): pages in the library code and starts the
    # thread pools, so the measurement is the call's own time and memory, not the process's.
    warm = [nn.Linear(256, 1024, bias=False) for _ in range(2)]
    for _ in range(2):
        prune.global_unstructured([(w, "weight") for w in warm], prune.L1Unstructured, amount=0.5)
    del warm

    if call == "second":
        prune_once()
    _warm_memory(total)
    reads = []
    for _ in range(3):
        start = time.perf_counter()
        for layer in layers:
            layer.weight.sum()
        reads.append(time.perf_counter() - start)
    with PeakMemory() as memory:
        start, cpu_start = time.perf_counter(), cpu_seconds()
        prune_once()
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    pruned = sum(int((layer.weight_mask == 0).sum()) for layer in layers)
    first = round(0.5 * total)
    expected = first if call == "first" else first + round(0.5 * (total - first))
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "extra_bytes_per_param": (memory.peak - memory.before) / total,
        "read_pass_seconds": min(reads),
        "params": total,
        "tensors": len(layers),
        "pruned": pruned,
        "expected_pruned": expected,
        "threads": torch.get_num_threads(),
    }


# --- the driver: subprocesses, medians, the table ---------------------------------------------


def measure(library: str, params: int, call: str, layout: str, repeats: int) -> dict[str, Any]:
    runs = []
    for _ in range(repeats):
        try:
            runs.append(worker_json(__file__, "--worker", library, str(params), call, layout))
        except WorkerError as error:
            return {"error": error.last_lines}
    if any(r["pruned"] != r["expected_pruned"] for r in runs):
        return {"error": [f"wrong count: {runs}"]}
    medians = ("cpu_seconds", "extra_bytes_per_param", "read_pass_seconds")
    firsts = ("params", "tensors", "threads")
    return {**median_of_runs(runs, medians, firsts), "repeats": repeats}


def _label(params: int) -> str:
    return f"{params / 1e9:g}B" if params >= 1e9 else f"{params / 1e6:g}M"


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    plan: list[tuple[int, str, tuple[str, ...]]] = [
        (size, "transformer", ("tensorplay",) if args.skip_torch else LIBRARIES)
        for size in args.sizes
    ]
    if args.billion:
        plan.append((1_000_000_000, "transformer", ("tensorplay",)))
    for size, layout, libraries in plan:
        for call in ("first", "second"):
            row: dict[str, Any] = {"size": _label(size), "layout": layout, "call": call}
            for library in libraries:
                repeats = (
                    args.repeats
                    if library == "tensorplay" or size < 1e8
                    else args.torch_repeats_large
                )
                row[library] = measure(library, size, call, layout, repeats)
                _progress(row, library)
            rows.append(row)
    layouts = []
    if args.layouts:
        size = 50_000_000 if not args.quick else 5_000_000
        for layout in ("tensors64", "tensors1024"):
            row = {"size": _label(size), "layout": layout, "call": "first"}
            row["tensorplay"] = measure("tensorplay", size, "first", layout, args.repeats)
            _progress(row, "tensorplay")
            layouts.append(row)
    return {
        "machine": machine("cpus", "platform", "python", "torch"),
        "rows": rows,
        "layouts": layouts,
    }


def _progress(row: dict[str, Any], library: str) -> None:
    result = row[library]
    shown = (
        result.get("error")
        or f"{result['seconds']:.3f}s {result['extra_bytes_per_param']:.2f} B/param"
    )
    print(
        f"  {row['size']:>5} {row['layout']:<12} {row['call']:<6} {library:<10} {shown}", flush=True
    )


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| params | call | torch (s) | tensorplay (s) | speed-up | torch extra B/param "
        "| tensorplay extra B/param | read pass (s) | tensorplay / read pass |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        ours = row["tensorplay"]
        theirs = row.get("torch")
        if "error" in ours:
            lines.append(f"| {row['size']} | {row['call']} | | error: {ours['error']} | | | | | |")
            continue
        if theirs and "error" not in theirs:
            t_time, ratio = (
                f"{theirs['seconds']:.2f}",
                f"{theirs['seconds'] / ours['seconds']:.1f}x",
            )
            t_mem = f"{theirs['extra_bytes_per_param']:.1f}"
        else:
            t_time = ratio = t_mem = "—"
        lines.append(
            f"| {row['size']} | {row['call']} | {t_time} | {ours['seconds']:.3f} | {ratio} "
            f"| {t_mem} | {ours['extra_bytes_per_param']:.2f} | {ours['read_pass_seconds']:.3f} "
            f"| {ours['seconds'] / ours['read_pass_seconds']:.0f}x |"
        )
    if results["layouts"]:
        lines += [
            "",
            "| params | tensors | tensorplay first call (s) | extra B/param |",
            "|---|---|---|---|",
        ]
        for row in results["layouts"]:
            ours = row["tensorplay"]
            if "error" in ours:
                continue
            lines.append(
                f"| {row['size']} | {ours['tensors']} | {ours['seconds']:.3f} "
                f"| {ours['extra_bytes_per_param']:.2f} |"
            )
    machine = results["machine"]
    lines += [
        "",
        f"CPU, fp32, amount 0.5, medians of {results.get('repeats', '?')} fresh processes; "
        f"{machine['cpus']} CPUs, torch {machine['torch']}, Python {machine['python']}. "
        "Extra memory: peak resident memory during the call minus before it. The masks and "
        "masked weights a first call must leave take 8 bytes/param.",
    ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], folder: Path) -> list[Path]:
    """``global_unstructured.png``: time against model size, torch and tensorplay, per call.

    One panel per call (first, second), log-log, each tensorplay point labelled with its
    speed-up over torch, and the read pass (one ``sum`` over the weights) as the floor.
    """
    from plotting import legend_below, new_figure, save, time_vs_size

    figure = new_figure(9.0, 3.8)
    panels = figure.subplots(1, 2, sharey=True)
    titles = {"first": "first call: 50% of an unpruned model", "second": "second call: 50% more"}
    for axes, call in zip(panels, ("first", "second"), strict=True):
        rows = [r for r in results["rows"] if r["call"] == call and "seconds" in r["tensorplay"]]
        rows.sort(key=lambda row: row["tensorplay"]["params"])

        def seconds(row: dict[str, Any], library: str) -> float | None:
            return row.get(library, {}).get("seconds")

        time_vs_size(
            axes,
            [row["tensorplay"]["params"] for row in rows],
            [row["size"] for row in rows],
            {
                "torch": [seconds(row, "torch") for row in rows],
                "tensorplay": [seconds(row, "tensorplay") for row in rows],
                "read pass": [row["tensorplay"]["read_pass_seconds"] for row in rows],
            },
            reference="torch",
        )
        axes.set_title(titles[call], fontsize=10)
    panels[1].set_ylabel("")
    legend_below(figure, panels[0])
    figure.suptitle(
        "global_unstructured, L1, CPU fp32: time per call (labels: speed-up over torch)",
        fontsize=11,
    )
    return [save(figure, folder / "global_unstructured.png")]


def main(argv: list[str] | None = None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--worker":
        library, params, call, layout = argv[1:5]
        print(json.dumps(worker(library, int(params), call, layout)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10M,50M,200M", help="comma-separated, e.g. 10M,50M")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per measurement")
    parser.add_argument(
        "--torch-repeats-large", type=int, default=3, help="repeats of torch at >= 100M params"
    )
    parser.add_argument("--quick", action="store_true", help="2M and 10M, one repeat, no 1B")
    parser.add_argument("--no-billion", dest="billion", action="store_false", help="skip 1B")
    parser.add_argument("--no-layouts", dest="layouts", action="store_false", help="skip 64/1024")
    parser.add_argument(
        "--skip-torch", action="store_true", help="no torch runs (e.g. in an A/B of two commits)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    add_plot_option(parser)
    args = parser.parse_args(argv)
    if args.plot is not None:
        plot_saved(plot, args.out / "global_unstructured.json", args.plot)
        return
    if args.quick:
        args.sizes, args.repeats, args.torch_repeats_large, args.billion = "2M,10M", 1, 1, False
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    results = run(args)
    results["repeats"] = args.repeats
    table = markdown(results)
    write_results(args.out, "global_unstructured", results, table)
    print(table)


if __name__ == "__main__":
    main()
