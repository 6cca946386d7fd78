"""A model bigger than torch can prune: one global exact pruning of a bf16 model, and its memory.

Run (the default needs ~11 GB of free memory for the 3B model and takes about 5 minutes on a
2-core machine; check ``free -g`` first)::

    python benchmarks/bench_large_model.py                     # lean at 134M, 1B, 3B; torch at 134M
    python benchmarks/bench_large_model.py --sizes 200M,1B --torch-params 50M
    python benchmarks/bench_large_model.py --quick             # 20M, about a minute
    python benchmarks/bench_large_model.py --plot              # docs/figures/large_model.png

The model is ``layers x nn.Linear(width, width, bias=False)`` in bf16 (``--width 8192``: 45
layers make 3.02B parameters), built on the meta device and materialised on the CPU
(``to_empty``, then ``normal_(0, 0.02)`` layer by layer: the weights are the only large
allocation). It is pruned once, globally and exactly, to 50% of its weights by L1 magnitude:

* **lean**: ``Pruner(model, OneShotSchedule(0.5), masking="inplace")``, building the pruner and
  its step both timed: a ``bool`` mask per weight (1 byte per parameter, held), the weights
  zeroed in place;
* **reparametrize**: the same ``Pruner`` with the default masking: it must hold a mask and the
  masked weight in the parameters' dtype (4 bytes per bf16 parameter), so it runs up to
  ``--reparametrize-max``;
* **torch**: :func:`torch.nn.utils.prune.global_unstructured` with ``L1Unstructured`` at a size
  it can run (``--torch-params``). Its need at a larger size is its measured peak bytes per
  parameter times the parameters: torch concatenates every score into one vector and runs
  ``topk`` on it, so its memory grows in proportion.

Each measurement runs in a fresh process: the model is built, the library warmed up on a small
stand-in model, then the call is made with the peak resident memory reset just before it
(``/proc/self/clear_refs``) and read just after (``VmHWM``; where there is no such file, a
thread samples the resident memory every millisecond). Memory is per parameter **above the
weights**: the peak during the call minus the resident memory before it, and what stays held
after it. A size whose need exceeds the free memory is skipped and says so. Every run checks that
exactly ``round(0.5 * parameters)`` weights were pruned (lean: and are zero).

Printed: a table with each way's time, peak and held bytes per parameter, and torch's need at
the same size as a ratio. Results go to ``benchmarks/results/large_model.json`` and ``.md``;
``--plot`` draws ``docs/figures/large_model.png`` from that JSON, measuring nothing.
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
    GIB,
    PeakMemory,
    WorkerError,
    machine,
    parse_size,
    proc_kib,
    size_label,
    worker_json,
    write_results,
)
from plotting import add_plot_option, plot_saved

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "large_model"
WAYS = ("lean", "reparametrize", "torch")
SPARSITY = 0.5
# What each way needs above the weights, in bytes per parameter, to decide what fits: the lean
# masks and the selection (~1.2), the reparametrization's mask and masked weight in bf16 (4)
# plus its selection, torch's concatenations (measured ~28 in bf16; with room).
NEED_ABOVE_WEIGHTS = {"lean": 2.0, "reparametrize": 5.5, "torch": 40.0}


# --- the worker: one measurement in this process ----------------------------------------------


def build(params: int, width: int, dtype_name: str) -> Any:
    """``layers x Linear(width, width)`` of about ``params`` parameters, made on the meta device
    and materialised on the CPU (``normal_(0, 0.02)``, seeded)."""
    import torch
    from torch import nn

    dtype = getattr(torch, dtype_name)
    layers = _layers(params, width)
    with torch.device("meta"):
        model = nn.Sequential(
            *[nn.Linear(width, width, bias=False, dtype=dtype) for _ in range(layers)]
        )
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model:
            layer.weight.normal_(0.0, 0.02, generator=generator)
    return model


def _prune(way: str, model: Any) -> None:
    """One global exact pruning of every weight of ``model`` to 50%."""
    if way == "torch":
        import torch.nn.utils.prune as prune

        pairs = [(layer, "weight") for layer in model]
        prune.global_unstructured(pairs, prune.L1Unstructured, amount=SPARSITY)
        return
    from tensorplay.ao.pruning import OneShotSchedule, Pruner

    masking = "inplace" if way == "lean" else "reparametrize"
    Pruner(model, OneShotSchedule(SPARSITY), masking=masking).step()


def _pruned(way: str, model: Any) -> int:
    """Weights pruned (masks at zero); lean: and zero in the weights, or the run fails."""
    pruned = sum(int((layer.weight_mask == 0).sum()) for layer in model)
    if way == "lean":
        zeros = sum(int((layer.weight == 0).sum()) for layer in model)
        if zeros < pruned:
            raise RuntimeError(f"lean: {zeros} zero weights, but {pruned} pruned")
    return pruned


def worker(way: str, params: int, width: int, dtype: str) -> dict[str, Any]:
    """Build the model, prune it once, report time and memory (run in a fresh process)."""
    import torch

    warm = build(4 * 256 * 256, 256, dtype)
    _prune(way, warm)
    del warm
    model = build(params, width, dtype)
    total = sum(layer.weight.numel() for layer in model)
    weights = sum(layer.weight.numel() * layer.weight.element_size() for layer in model)
    with PeakMemory() as memory:
        start = time.perf_counter()
        _prune(way, model)
        seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "peak_bytes_per_param": (memory.peak - memory.before) / total,
        "held_bytes_per_param": (memory.after - memory.before) / total,
        "weights_bytes": weights,
        "params": total,
        "layers": len(model),
        "pruned": _pruned(way, model),
        "expected_pruned": round(SPARSITY * total),
        "threads": torch.get_num_threads(),
        "peak_measured_by": memory.measured_by,
    }


# --- the driver: subprocesses, the table ------------------------------------------------------


def _available_bytes() -> int | None:
    try:
        return proc_kib("MemAvailable", "/proc/meminfo") * 1024
    except (OSError, RuntimeError):
        return None


def measure(way: str, params: int, width: int, dtype: str) -> dict[str, Any]:
    """One fresh process; a skip where the free memory is short, an error where it failed."""
    weight_bytes = 2 if dtype in ("bfloat16", "float16") else 4
    need = params * (weight_bytes + NEED_ABOVE_WEIGHTS[way])
    available = _available_bytes()
    if available is not None and need > available:
        return {"skipped": f"needs ~{need / GIB:.1f} GiB, {available / GIB:.1f} GiB available"}
    try:
        result: dict[str, Any] = worker_json(
            __file__, "--worker", way, str(params), str(width), dtype
        )
    except WorkerError as error:
        return {"error": error.last_lines}
    # torch rounds its amount once per call like us; any other count is a wrong result.
    if result["pruned"] != result["expected_pruned"]:
        return {"error": [f"pruned {result['pruned']}, expected {result['expected_pruned']}"]}
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch_reference = measure("torch", args.torch_params, args.width, args.dtype)
    _progress(size_label(_held(args.torch_params, args.width)), "torch", torch_reference)
    rows: list[dict[str, Any]] = []
    for size in args.sizes:
        row: dict[str, Any] = {"size": size_label(_held(size, args.width))}
        for way in ("lean", "reparametrize"):
            if way == "reparametrize" and size > args.reparametrize_max:
                continue
            row[way] = measure(way, size, args.width, args.dtype)
            _progress(row["size"], way, row[way])
        if size == args.torch_params:
            row["torch"] = torch_reference
        rows.append(row)
    return {
        "machine": machine("cpus", "memory_gib", "platform", "python", "torch"),
        "dtype": args.dtype,
        "width": args.width,
        "sparsity": SPARSITY,
        "torch_reference": {
            "size": size_label(_held(args.torch_params, args.width)),
            **torch_reference,
        },
        "rows": rows,
    }


def _progress(size: str, way: str, result: dict[str, Any]) -> None:
    shown = result.get("error") or result.get("skipped")
    if shown is None:
        shown = (
            f"{result['seconds']:.2f}s peak {result['peak_bytes_per_param']:.2f} "
            f"held {result['held_bytes_per_param']:.2f} B/param above the weights"
        )
    print(f"  {size:>6} {way:<13} {shown}", flush=True)


def _layers(params: int, width: int) -> int:
    """The whole ``width x width`` layers closest to ``params`` parameters (one at least)."""
    return max(1, round(params / (width * width)))


def _held(params: int, width: int) -> int:
    """The parameters the model built for ``params`` holds: whole layers."""
    return _layers(params, width) * width * width


def _measured(result: dict[str, Any] | None) -> bool:
    return result is not None and "seconds" in result


def markdown(results: dict[str, Any]) -> str:
    reference = results["torch_reference"]
    theirs = reference.get("peak_bytes_per_param") if _measured(reference) else None
    lines = [
        "| parameters | weights (GiB) | way | time (s) | peak above the weights: B/param (GiB) "
        "| held: B/param | torch's peak at this size (GiB) | torch / this way |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        for way in WAYS:
            result = row.get(way)
            if result is None:
                continue
            if not _measured(result):
                reason = result.get("error") or result.get("skipped")
                lines.append(f"| {row['size']} | | {way} | {reason} | | | | |")
                continue
            params = result["params"]
            peak = result["peak_bytes_per_param"]
            need = "—" if theirs is None else f"{theirs * params / GIB:.1f}"
            if way == "torch":
                need, ratio = f"{peak * params / GIB:.1f} (measured)", "—"
            else:
                ratio = "—" if theirs is None else f"{theirs / peak:.0f}x"
            lines.append(
                f"| {size_label(params)} ({params:,}) | {result['weights_bytes'] / GIB:.2f} "
                f"| {way} "
                f"| {result['seconds']:.2f} | {peak:.2f} ({peak * params / GIB:.2f}) "
                f"| {result['held_bytes_per_param']:.2f} | {need} | {ratio} |"
            )
    machine = results["machine"]
    torch_line = (
        f"torch measured at {reference['size']}: {theirs:.1f} B/param above the weights; its "
        "need at a larger size is that times the parameters."
        if theirs is not None
        else "torch could not be measured in this run."
    )
    lines += [
        "",
        f"CPU, {results['dtype']}, `{results['width']} x {results['width']}` linear layers built "
        f"on the meta device; one global L1 pruning to {results['sparsity']:.0%}, exact count. "
        "Peak: the most resident memory during the call minus before it; held: after minus "
        f"before. lean: Pruner(masking='inplace'); reparametrize: Pruner(masking='reparametrize')"
        f"; torch: torch.nn.utils.prune.global_unstructured. {torch_line} One fresh process per "
        f"measurement; {machine['cpus']} CPUs, {machine['memory_gib']} GiB, torch "
        f"{machine['torch']}, Python {machine['python']}.",
    ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], folder: Path) -> list[Path]:
    """``large_model.png``: at the largest size the lean mode ran, the memory each way needs
    (the weights, and the peak above them; torch's from its bytes per parameter, hatched) beside
    the machine's memory; and each way's peak bytes per parameter at every size measured."""
    from matplotlib.ticker import NullLocator
    from plotting import COLORS, new_figure, save

    rows = [row for row in results["rows"] if _measured(row.get("lean"))]
    largest = max(rows, key=lambda row: row["lean"]["params"])
    params = largest["lean"]["params"]
    weights = largest["lean"]["weights_bytes"] / GIB
    reference = results["torch_reference"]
    figure = new_figure(9.5, 3.9)
    left, right = figure.subplots(1, 2, width_ratios=[1.15, 1])

    bars: list[tuple[str, float, bool]] = []
    for way in ("lean", "reparametrize"):
        if _measured(largest.get(way)):
            bars.append((way, largest[way]["peak_bytes_per_param"] * params / GIB, False))
    if _measured(reference):
        bars.append(("torch", reference["peak_bytes_per_param"] * params / GIB, True))
    for index, (way, extra, estimated) in enumerate(bars):
        left.bar(index, weights, color="tab:gray", alpha=0.5)
        left.bar(
            index,
            extra,
            bottom=weights,
            color=COLORS[way],
            hatch="//" if estimated else None,
            alpha=0.55 if estimated else 1.0,
        )
        note = f"{weights + extra:.1f} GiB" + ("\n(from its B/param)" if estimated else "")
        left.annotate(
            note,
            (index, weights + extra),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=9,
        )
    left.axhline(results["machine"]["memory_gib"], color="black", linestyle="--", linewidth=1)
    left.annotate(
        f"this machine: {results['machine']['memory_gib']:.0f} GiB",
        (-0.4, results["machine"]["memory_gib"]),
        xytext=(0, 3),
        textcoords="offset points",
        fontsize=8,
    )
    top = max([weights + extra for _, extra, _ in bars] + [results["machine"]["memory_gib"]])
    left.set_ylim(0, top * 1.2)  # room for the labels
    left.set_xticks(range(len(bars)), [way for way, _, _ in bars])
    left.set_ylabel("GiB: weights (grey) + peak above them")
    left.set_title(f"pruning {size_label(params)} {results['dtype']} parameters", fontsize=10)
    left.grid(True, axis="y", alpha=0.3)

    for way in WAYS:
        points = [
            (row[way]["params"], row[way]["peak_bytes_per_param"])
            for row in results["rows"]
            if _measured(row.get(way))
        ]
        if way == "torch" and _measured(reference):
            points = [(reference["params"], reference["peak_bytes_per_param"])]
        if points:
            xs, ys = zip(*sorted(points), strict=True)
            right.plot(xs, ys, marker="o", color=COLORS[way], label=way)
    right.set_xscale("log")
    right.set_yscale("log")
    sizes = sorted({p for way in WAYS for p in right_sizes(results, way)} | {params})
    right.set_xticks(sizes, [size_label(p) for p in sizes])
    right.xaxis.set_minor_locator(NullLocator())
    right.set_xlim(sizes[0] / 1.6, sizes[-1] * 1.6)
    right.set_yticks([1, 2, 4, 8, 16, 32], ["1", "2", "4", "8", "16", "32"])
    right.yaxis.set_minor_locator(NullLocator())
    right.set_xlabel("parameters")
    right.set_ylabel("peak bytes per parameter above the weights")
    right.set_title("memory per parameter, every size run", fontsize=10)
    right.grid(True, which="major", alpha=0.3)
    right.legend(fontsize=9)
    figure.suptitle(
        "One global exact L1 pruning to 50% on the CPU (hatched: torch's need from its measured "
        "bytes per parameter)",
        fontsize=10,
    )
    return [save(figure, folder / f"{NAME}.png")]


def right_sizes(results: dict[str, Any], way: str) -> list[int]:
    """The parameters of every size ``way`` was measured at."""
    found = [row[way]["params"] for row in results["rows"] if _measured(row.get(way))]
    reference = results["torch_reference"]
    return found + ([reference["params"]] if way == "torch" and _measured(reference) else [])


def main(argv: list[str] | None = None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--worker":
        way, params, width, dtype = argv[1:5]
        print(json.dumps(worker(way, int(params), int(width), dtype)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="134M,1B,3B", help="comma-separated, e.g. 200M,3B")
    parser.add_argument("--width", type=int, default=8192, help="in and out features of a layer")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--torch-params", default="134M", help="the size torch is measured at")
    parser.add_argument("--reparametrize-max", default="1B", help="largest reparametrized size")
    parser.add_argument("--quick", action="store_true", help="20M, width 1024, torch at 20M")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    add_plot_option(parser)
    args = parser.parse_args(argv)
    if args.plot is not None:
        plot_saved(plot, args.out / f"{NAME}.json", args.plot)
        return
    if args.quick:
        args.sizes, args.width, args.torch_params = "20M", 1024, "20M"
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    args.torch_params = parse_size(args.torch_params)
    args.reparametrize_max = parse_size(args.reparametrize_max)
    results = run(args)
    table = markdown(results)
    write_results(args.out, NAME, results, table)
    print(table)


if __name__ == "__main__":
    main()
