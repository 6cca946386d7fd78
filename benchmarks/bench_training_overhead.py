"""Pruning's cost per optimizer step, side by side: dense, floor, lean, reparametrize.

Run (about 3 minutes on a 2-core machine)::

    python benchmarks/bench_training_overhead.py                   # width 2048, batch 64 and 512
    python benchmarks/bench_training_overhead.py --rounds 30       # steadier medians
    python benchmarks/bench_training_overhead.py --threads 1       # on a busy machine
    python benchmarks/bench_training_overhead.py --quick           # width 256, a few rounds

The model of ``bench_callback_overhead.py`` (four ``width x width`` linear layers with ReLU, MSE
loss on a fixed synthetic batch) trains with SGD with momentum in a plain loop
(``zero_grad``, forward, backward, ``step``: fewer confounders than a ``Trainer``), three ways,
each its own copy of one initialisation:

* **dense**: no pruning, the reference;
* **lean**: ``Pruner(model, OneShotSchedule(0.9), masking="inplace")``, pruned once to 90%, then
  ``pruner.attach(optimizer)`` (gradients masked before each step, pruned weights kept zero);
* **reparametrize**: the same pruner with the default ``masking="reparametrize"`` (the forward
  pre-hook recomputes ``weight = weight_orig * weight_mask`` every step).

And the **floor**: one masked pass over the weights, ``torch._foreach_mul_(weights,
bool_masks)``, timed alone: the least any scheme that keeps pruned weights at zero can add.

The ways take turns (round-robin, the order rotating each round, after warm-up steps), so load
on the machine hits them alike; each round times ``--steps`` steps of each. Printed per batch
size: the median time per step, the overhead against dense (the median over the rounds of each
round's ratio to its own dense turn: load drifts between rounds far more than the overheads),
and the lean overhead as a multiple of the floor. Results go to
``benchmarks/results/training_overhead.json`` and ``.md``. On a busy machine a 1-2% difference
is within the noise: compare many rounds. ``--plot`` draws the docs' figure from that JSON,
measuring nothing (``docs/figures/training_overhead.png``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import in_turns, machine, median_ratios, write_results
from plotting import add_plot_option, plot_saved

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("dense", "lean", "reparametrize")
SPARSITY = 0.9
LR, MOMENTUM = 1e-3, 0.9


def _mlp(width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())])


def _weights(model: nn.Module) -> list[Tensor]:
    """The weights as the forward sees them (``weight`` of each linear layer)."""
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear)]


class _Run:
    """One way to train: a model, its optimizer, and a step on the fixed batch."""

    def __init__(self, mode: str, base: nn.Sequential, batch: tuple[Tensor, Tensor]) -> None:
        from tensorplay.ao.pruning import OneShotSchedule, Pruner

        self.mode = mode
        self.model = copy.deepcopy(base)
        self.batch = batch
        self.pruner: Any = None
        if mode != "dense":
            masking = "inplace" if mode == "lean" else "reparametrize"
            self.pruner = Pruner(self.model, OneShotSchedule(SPARSITY), masking=masking)
            self.pruner.step(0)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)
        if mode == "lean":
            self.pruner.attach(self.optimizer)

    def step(self) -> None:
        x, y = self.batch
        self.optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.step()

    def sparsity(self) -> float:
        weights = [w.detach() for w in _weights(self.model)]
        return sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)


def _floor(base: nn.Sequential) -> Callable[[], None]:
    """One masked pass over the weights: ``_foreach_mul_`` by bool masks at 90% sparsity."""
    weights = [w.detach().clone() for w in _weights(base)]
    generator = torch.Generator().manual_seed(1)
    masks = [torch.rand(w.shape, generator=generator) >= SPARSITY for w in weights]

    def run() -> None:
        torch._foreach_mul_(weights, masks)

    return run


def measure(width: int, batch_size: int, rounds: int, steps: int, warmup: int) -> dict[str, Any]:
    """Median seconds per step of each way and of the floor, taking turns."""
    base = _mlp(width)
    generator = torch.Generator().manual_seed(2)
    batch = (
        torch.randn(batch_size, width, generator=generator),
        torch.randn(batch_size, width, generator=generator),
    )
    runs = {mode: _Run(mode, base, batch) for mode in MODES}
    calls: dict[str, Callable[[], None]] = {mode: run.step for mode, run in runs.items()}
    calls["floor"] = _floor(base)
    for call in calls.values():  # warm-up
        for _ in range(warmup):
            call()
    times = in_turns(calls, rounds, steps)
    seconds = {name: statistics.median(values) for name, values in times.items()}
    # Against the dense turn of the same round (the load of a busy machine drifts between
    # rounds far more than the overheads measured): the median of the per-round ratios.
    ratio = median_ratios(times, "dense")
    return {
        "batch": batch_size,
        "seconds": seconds,
        "seconds_all": times,
        "overhead": {name: ratio[name] - 1 for name in ("lean", "reparametrize")},
        "floor_fraction": ratio["floor"],
        "lean_over_floor": (ratio["lean"] - 1) / ratio["floor"],
        "sparsity": {mode: run.sparsity() for mode, run in runs.items()},
        "lean_zeros_kept": _lean_zeros_kept(runs["lean"]),
    }


def _lean_zeros_kept(run: _Run) -> bool:
    """Whether every pruned weight of the lean run is still exactly zero after training."""
    layers = [m for m in run.model.modules() if isinstance(m, nn.Linear)]
    return all(bool((m.weight[~m.weight_mask] == 0).all()) for m in layers)


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| batch | dense step (ms) | floor | lean | reparametrize | lean / floor |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        seconds, overhead = row["seconds"], row["overhead"]
        lines.append(
            f"| {row['batch']} | {seconds['dense'] * 1e3:.1f} | {row['floor_fraction']:+.1%} "
            f"| {overhead['lean']:+.1%} | {overhead['reparametrize']:+.1%} "
            f"| {row['lean_over_floor']:.2f}x |"
        )
    machine = results["machine"]
    lines += [
        "",
        f"Per optimizer step against dense: the median over {results['rounds']} rounds of "
        f"{results['steps']} steps, taken in turns, of each round's ratio to its dense turn; "
        f"dense step: the median time. An MLP of four {results['width']}x"
        f"{results['width']} linear layers, SGD with momentum, {SPARSITY:.0%} sparsity, CPU "
        f"({machine['cpus']} CPUs, {machine['threads']} torch threads), torch "
        f"{machine['torch']}. Floor: one `torch._foreach_mul_(weights, bool_masks)` alone. "
        "lean / floor: the lean overhead as a multiple of the floor.",
    ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], folder: Path) -> list[Path]:
    """``training_overhead.png``: each way's time per step over dense, beside the floor's.

    One group of bars per batch size: the floor (one masked pass alone), lean and reparametrize,
    each labelled with its overhead; the lean bar also with its multiple of the floor.
    """
    from plotting import COLORS, new_figure, save

    figure = new_figure(8.0, 3.8)
    axes = figure.add_subplot()
    ways = ("floor", "lean", "reparametrize")
    for group, row in enumerate(results["rows"]):
        overhead = {"floor": row["floor_fraction"], **row["overhead"]}
        for index, way in enumerate(ways):
            x, value = group + (index - 1) * 0.27, 100 * overhead[way]
            hatch = "//" if way == "floor" else None
            axes.bar(x, value, width=0.25, color=COLORS[way], alpha=0.9, hatch=hatch)
            label = f"{value:+.1f}%"
            if way == "lean":
                label += f"\n{row['lean_over_floor']:.2f}x floor"
            axes.annotate(
                label,
                (x, max(value, 0.0)),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=9,
            )
    axes.set_xticks(
        range(len(results["rows"])),
        [
            f"batch {r['batch']}\n(dense step {1e3 * r['seconds']['dense']:.0f} ms)"
            for r in results["rows"]
        ],
    )
    handles = [axes.bar(0, 0, color=COLORS[w], hatch="//" if w == "floor" else None) for w in ways]
    axes.legend(handles, ["floor: one masked pass, alone", "lean", "reparametrize"], fontsize=9)
    axes.set_ylabel("time per step over dense (%)")
    axes.set_ylim(0, axes.get_ylim()[1] * 1.25)  # room for the labels
    axes.grid(True, axis="y", alpha=0.3)
    width = results["width"]
    axes.set_title(
        f"Per optimizer step at 90% sparsity: four {width}x{width} linear layers, SGD, CPU",
        fontsize=11,
    )
    return [save(figure, folder / "training_overhead.png")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=2048, help="features of each layer")
    parser.add_argument("--batches", default="64,512", help="comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=12, help="turns of each way")
    parser.add_argument("--steps", type=int, default=4, help="steps per turn")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each way first")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--quick", action="store_true", help="width 256, 3 rounds of 2 steps, one thread"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    add_plot_option(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.plot is not None:
        plot_saved(plot, args.out / "training_overhead.json", args.plot)
        return
    if args.quick:
        args.width, args.rounds, args.steps, args.warmup, args.threads = 256, 3, 2, 1, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for batch_size in (int(b) for b in args.batches.split(",")):
        row = measure(args.width, batch_size, args.rounds, args.steps, args.warmup)
        rows.append(row)
        print(
            f"  batch {batch_size}: dense {row['seconds']['dense'] * 1e3:.1f} ms, "
            f"lean {row['overhead']['lean']:+.1%}, reparametrize "
            f"{row['overhead']['reparametrize']:+.1%}, floor {row['floor_fraction']:+.1%}",
            flush=True,
        )
    results = {
        "machine": machine("cpus", "threads", "platform", "torch"),
        "width": args.width,
        "rounds": args.rounds,
        "steps": args.steps,
        "rows": rows,
    }
    table = markdown(results)
    write_results(args.out, "training_overhead", results, table)
    print(table)


if __name__ == "__main__":
    main()
