"""Pruning during training: tensorplay's callback against Lightning's ``ModelPruning`` and dense.

Run (about 4 minutes on a 2-core machine)::

    python benchmarks/bench_callback_overhead.py             # width 2048, 3 repeats
    python benchmarks/bench_callback_overhead.py --quick     # width 512, 1 repeat

The same ``Trainer.fit`` (an MLP of four ``width x width`` linear layers on synthetic data, 10
epochs of 10 optimizer steps, batch 64, SGD, CPU) runs three ways, each in a fresh process:

* **dense**: no pruning, the reference;
* **tensorplay**: :class:`~tensorplay.callbacks.GradualPruning` on a cubic schedule to 90%
  sparsity, pruning every 10 steps (10 pruning events);
* **lightning**: :class:`lightning.pytorch.callbacks.ModelPruning` with global L1 pruning at
  the end of each epoch (10 pruning events), its per-epoch ``amount`` chosen so the sparsity
  after each event is the same as tensorplay's.

Printed: the median fit time of each, its ratio to the dense run, the cost per pruning event
(the difference to the dense run divided by the number of events) and the final sparsity.
Results go to ``benchmarks/results/callback_overhead.json`` and ``.md``; ``--plot`` draws the
docs' figure from that JSON, measuring nothing (``docs/figures/callback_overhead.png``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, median_of_runs, worker_json, write_results
from plotting import add_plot_option, plot_saved

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("dense", "tensorplay", "lightning")
EPOCHS = 10
STEPS_PER_EPOCH = 10
BATCH = 64
FINAL_SPARSITY = 0.9


# --- the worker: one fit in this process -------------------------------------------------------


def _targets() -> list[float]:
    """The cumulative sparsity after each of the ``EPOCHS`` pruning events (tensorplay's)."""
    from tensorplay.ao.pruning import CubicSchedule

    schedule = _schedule(CubicSchedule)
    return [schedule(epoch * STEPS_PER_EPOCH) for epoch in range(EPOCHS)]


def _schedule(cubic: Any) -> Any:
    # Pruning steps 0, 10, ..., 90: one per epoch, at its first optimizer step.
    return cubic(
        final_sparsity=FINAL_SPARSITY,
        end_step=(EPOCHS - 1) * STEPS_PER_EPOCH,
        frequency=STEPS_PER_EPOCH,
    )


def worker(variant: str, width: int) -> dict[str, Any]:
    """Fit once with ``variant`` and report the time and the final sparsity."""
    import lightning.pytorch as pl
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                *[m for _ in range(4) for m in (nn.Linear(width, width), nn.ReLU())]
            )

        def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    samples = BATCH * STEPS_PER_EPOCH
    data = TensorDataset(torch.randn(samples, width), torch.randn(samples, width))
    loader = DataLoader(data, batch_size=BATCH)
    model = MLP()
    callbacks: list[pl.Callback] = []
    if variant == "tensorplay":
        from tensorplay.ao.pruning import CubicSchedule
        from tensorplay.callbacks import GradualPruning

        callbacks.append(GradualPruning(_schedule(CubicSchedule), verbose=False))
    elif variant == "lightning":
        from lightning.pytorch.callbacks import ModelPruning

        targets = _targets()

        def amount(epoch: int) -> float:
            # ModelPruning prunes a fraction of what remains: the increment that reaches the
            # same cumulative target as tensorplay after this epoch.
            before = targets[epoch - 1] if epoch else 0.0
            return 1 - (1 - targets[epoch]) / (1 - before)

        callbacks.append(
            ModelPruning(
                "l1_unstructured",
                parameter_names=["weight"],
                amount=amount,
                use_global_unstructured=True,
                make_pruning_permanent=False,
                verbose=0,
            )
        )
    trainer = pl.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    start = time.perf_counter()
    trainer.fit(model, loader)
    seconds = time.perf_counter() - start
    weights = [m for m in model.net if isinstance(m, nn.Linear)]
    zeros = sum(int((m.weight == 0).sum()) for m in weights)
    total = sum(m.weight.numel() for m in weights)
    return {"seconds": seconds, "sparsity": zeros / total, "params": total}


# --- the driver ----------------------------------------------------------------------------------


def measure(variant: str, width: int, repeats: int) -> dict[str, Any]:
    runs = [worker_json(__file__, "--worker", variant, str(width)) for _ in range(repeats)]
    return median_of_runs(runs, firsts=("sparsity", "params"))


def markdown(results: dict[str, Any]) -> str:
    dense = results["variants"]["dense"]["seconds"]
    lines = [
        "| run | fit (s) | vs dense | per pruning event (s) | final sparsity |",
        "|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        row = results["variants"][variant]
        per_event = "—" if variant == "dense" else f"{(row['seconds'] - dense) / EPOCHS:.3f}"
        lines.append(
            f"| {variant} | {row['seconds']:.2f} | {row['seconds'] / dense:.2f}x | {per_event} "
            f"| {row['sparsity']:.4f} |"
        )
    machine = results["machine"]
    lines += [
        "",
        f"An MLP of {results['params'] / 1e6:.1f}M weights, {EPOCHS} epochs of "
        f"{STEPS_PER_EPOCH} steps, {EPOCHS} pruning events to {FINAL_SPARSITY:.0%}; medians of "
        f"{results['repeats']} fresh processes; {machine['cpus']} CPUs, torch {machine['torch']}, "
        f"lightning {machine['lightning']}.",
    ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], folder: Path) -> list[Path]:
    """``callback_overhead.png``: the fit time of each run, its ratio to dense, per pruning event.

    One bar per run (the median), a dot per fresh process, the ratio to the dense run and the
    cost of one pruning event written beside it.
    """
    from plotting import COLORS, new_figure, save

    figure = new_figure(9.0, 2.8)
    axes = figure.add_subplot()
    dense = results["variants"]["dense"]["seconds"]
    for index, variant in enumerate(VARIANTS):
        row = results["variants"][variant]
        axes.barh(index, row["seconds"], height=0.6, color=COLORS[variant], alpha=0.85)
        axes.plot(row["seconds_all"], [index] * len(row["seconds_all"]), "k.", markersize=5)
        label = f"{row['seconds']:.1f} s, {row['seconds'] / dense:.2f}x dense"
        if variant != "dense":
            label += f", {(row['seconds'] - dense) / EPOCHS:.2f} s per pruning event"
        right = max(row["seconds"], *row["seconds_all"])
        axes.annotate(
            label,
            (right, index),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=9,
        )
    axes.set_yticks(
        range(len(VARIANTS)), ["dense", "tensorplay\nGradualPruning", "Lightning\nModelPruning"]
    )
    axes.invert_yaxis()
    axes.set_xlim(0, axes.get_xlim()[1] * 2.0)  # room for the labels
    axes.set_xlabel("Trainer.fit time (s): bars the median, dots each fresh process")
    axes.grid(True, axis="x", alpha=0.3)
    axes.set_title(
        f"Pruning inside Trainer.fit: {EPOCHS} pruning events to {FINAL_SPARSITY:.0%}, "
        f"{results['params'] / 1e6:.1f}M weights, CPU",
        fontsize=11,
    )
    return [save(figure, folder / "callback_overhead.png")]


def main(argv: list[str] | None = None) -> None:
    """Run the comparison (or, with ``--worker``, one fit)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        print(json.dumps(worker(argv[1], int(argv[2]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=2048, help="features of each layer")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per variant")
    parser.add_argument("--quick", action="store_true", help="width 512, one repeat")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    add_plot_option(parser)
    args = parser.parse_args(argv)
    if args.plot is not None:
        plot_saved(plot, args.out / "callback_overhead.json", args.plot)
        return
    if args.quick:
        args.width, args.repeats = 512, 1
    variants = {}
    for variant in VARIANTS:
        variants[variant] = measure(variant, args.width, args.repeats)
        print(f"  {variant:<10} {variants[variant]['seconds']:.2f}s", flush=True)
    results = {
        "machine": machine("cpus", "platform", "torch", "lightning"),
        "width": args.width,
        "repeats": args.repeats,
        "params": variants["dense"]["params"],
        "variants": variants,
    }
    table = markdown(results)
    write_results(args.out, "callback_overhead", results, table)
    print(table)


if __name__ == "__main__":
    main()
