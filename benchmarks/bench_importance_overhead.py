"""What an importance score costs per optimizer step, side by side with magnitude.

Run (a minute or two on a 2-core machine)::

    python benchmarks/bench_importance_overhead.py              # width 1024, batch 64
    python benchmarks/bench_importance_overhead.py --quick      # width 64, a few rounds

Four ``width x width`` linear layers with ReLU (MSE loss on a fixed synthetic batch) train with
SGD with momentum in a plain loop, lean masks (``masking="inplace"``) pruned once to 50% and
the optimizer attached (``pruner.attach``), one copy of one initialisation per way:

* **magnitude**: the reference (``importance="magnitude"``: no state, no hooks);
* **movement**, **taylor**: the attached optimizer's pre-step hook adds ``-w * g`` or
  ``|w * g|`` to a float32 accumulator every step; **movement-bf16**: a bfloat16 accumulator;
* **wanda**: every forward adds the input features' sums of squares (the hooks stay on while
  training; a one-shot user calibrates and steps once).

The ways take turns (round-robin, the order rotating each round, after warm-up steps), on one
torch thread timed by the thread's CPU time (``time.thread_time``: a busy shared machine
delays the run but does not inflate it); printed: the median time per step and the median over
rounds of each round's ratio to its own magnitude turn. Then the accumulator bytes per pruned
parameter (read from the pruner's state), and the cost of a Wanda calibration pass:
``calibrate`` over ``--calibration`` batches against the same forwards without the hooks.
Results go to ``benchmarks/results/importance_overhead.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import Pruner, calibrate
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import counted, in_turns, median_ratios, seconds_per_call, write_results

RESULTS = Path(__file__).resolve().parent / "results"
# CPU time of this thread: with one torch thread every kernel runs here, and time spent
# waiting for a core that other processes hold (a shared machine) is not counted.
CLOCK = time.thread_time
WAYS: dict[str, dict[str, Any]] = {
    "magnitude": {},
    "movement": {"importance": "movement"},
    "movement-bf16": {"importance": "movement", "accumulator_dtype": "bfloat16"},
    "taylor": {"importance": "taylor"},
    "wanda": {"importance": "wanda"},
}


def _mlp(width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())])


class _Run:
    """One way: its model, optimizer and pruner (pruned at step 0, after one accumulated step)."""

    def __init__(self, options: dict[str, Any], base: nn.Sequential, batch: tuple[Tensor, Tensor]):
        self.model = copy.deepcopy(base)
        self.batch = batch
        self.pruner = Pruner(self.model, OneShotSchedule(0.5, step=1), masking="inplace", **options)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.pruner.attach(self.optimizer)
        self.step()
        self.pruner.step(0)
        self.step()
        self.pruner.step(1)  # pruned: the loop below runs at 50%

    def step(self) -> None:
        x, y = self.batch
        self.optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.step()


def _bytes_per_parameter(pruner: Pruner) -> float:
    sums = pruner.importance.state_dict().get("sums", {})
    return sum(t.numel() * t.element_size() for t in sums.values()) / pruner.total_count()


def measure(
    width: int, batch_size: int, rounds: int, steps: int, calibration: int
) -> dict[str, Any]:
    """Time every way, read the accumulators' bytes, time a calibration pass."""
    base = _mlp(width)
    generator = torch.Generator().manual_seed(1)
    batch = (torch.randn(batch_size, width, generator=generator),) * 2
    runs = {name: _Run(options, base, batch) for name, options in WAYS.items()}
    names = list(runs)
    steps_by_name = {name: run.step for name, run in runs.items()}
    times = in_turns(steps_by_name, rounds, steps, clock=CLOCK)
    ratios = median_ratios(times, "magnitude")
    ways = {
        name: {
            "median_step_ms": 1e3 * statistics.median(times[name]),
            "ratio_to_magnitude": ratios[name],
            "accumulator_bytes_per_parameter": _bytes_per_parameter(runs[name].pruner),
        }
        for name in names
    }
    return {"ways": ways, "calibration": _calibration(base, batch[0], calibration)}


def _calibration(base: nn.Sequential, x: Tensor, batches: int) -> dict[str, Any]:
    """``calibrate`` over ``batches`` batches against the same forwards without the hooks."""
    model = copy.deepcopy(base)

    def plain() -> None:
        with torch.no_grad():
            for _ in range(batches):
                model(x)

    plain()  # warm-up
    bare = min(seconds_per_call(plain, 1, CLOCK) for _ in range(5))
    pruner = Pruner(model, OneShotSchedule(0.5), importance="wanda", scope="row")
    hooked = min(
        seconds_per_call(lambda: calibrate(pruner, [x] * batches), 1, CLOCK) for _ in range(5)
    )
    return {
        "batches": batches,
        "plain_forwards_ms": 1e3 * bare,
        "calibrate_ms": 1e3 * hooked,
        "ratio": hooked / bare,
        "norm_bytes_per_parameter": sum(
            t.numel() * t.element_size() for t in pruner.importance.state_dict()["sums"].values()
        )
        / pruner.total_count(),
    }


def markdown(results: dict[str, Any]) -> str:
    """The results as Markdown tables."""
    config = results["config"]
    lines = [
        f"Width {config['width']}, 4 linear layers, batch {config['batch']}, lean masks at 50%, "
        f"SGD with momentum; {config['rounds']} rounds of {config['steps']} steps, "
        f"{counted(config['threads'], 'thread')}, CPU time, torch {config['torch']}.",
        "",
        "| importance | median step (ms) | vs magnitude | accumulator bytes / parameter |",
        "|---|---|---|---|",
    ]
    for name, way in results["ways"].items():
        lines.append(
            f"| {name} | {way['median_step_ms']:.2f} | {way['ratio_to_magnitude']:.3f}x | "
            f"{way['accumulator_bytes_per_parameter']:.4g} |"
        )
    cal = results["calibration"]
    lines += [
        "",
        f"Wanda calibration, {cal['batches']} batches: {cal['calibrate_ms']:.2f} ms against "
        f"{cal['plain_forwards_ms']:.2f} ms for the same forwards without hooks "
        f"({cal['ratio']:.2f}x); the norms take {cal['norm_bytes_per_parameter']:.4g} bytes "
        "per pruned parameter.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, measure, print and save."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--calibration", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU time)")
    parser.add_argument("--quick", action="store_true", help="width 64, 3 rounds of 3 steps")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.rounds, args.steps = 64, 3, 3
    torch.set_num_threads(args.threads)
    results = measure(args.width, args.batch, args.rounds, args.steps, args.calibration)
    results["config"] = {
        "width": args.width,
        "batch": args.batch,
        "rounds": args.rounds,
        "steps": args.steps,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
    }
    table = markdown(results)
    print(table)
    write_results(args.out, "importance_overhead", results, table + "\n")


if __name__ == "__main__":
    main()
