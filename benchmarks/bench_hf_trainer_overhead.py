"""The cost of ``GradualPruningCallback`` inside ``transformers.Trainer.train``, against dense.

Run (about 7 minutes on a 2-core machine)::

    python benchmarks/bench_hf_trainer_overhead.py            # width 256, 4 blocks, 5 repeats
    python benchmarks/bench_hf_trainer_overhead.py --quick    # width 128, 2 blocks, 1 repeat

The same ``Trainer.train`` (a GPT-2 of ``--layers`` blocks ``--width`` wide on random byte tokens,
batch 8 of 128 tokens, AdamW, clipping at 1.0, logging every 10 steps, CPU, one thread) runs
three ways, side by side in this one process, the variants alternated within each repeat so
that a slower moment of the machine falls on all of them:

* **dense**: no callback, the reference;
* **reparametrize**: ``GradualPruningCallback`` on a cubic schedule to 80% of the projections
  and the tied embedding, pruning every ``--steps // 12`` steps up to two thirds of the run;
* **inplace**: the same with ``masking="inplace"`` (lean masks: the optimizer attached, the
  gradients masked before each step).

Printed, per variant: the median CPU time of ``train()`` (this process's, one thread: less
disturbed than wall time by other jobs on a shared machine) and its median wall time, each with
the median over the repeats of its ratio to the dense run of the same repeat, the CPU cost per
optimizer step and per pruning event (the difference to dense divided by their numbers), and
the final sparsity. Results go to ``benchmarks/results/hf_trainer_overhead.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, other_work, write_results

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("dense", "reparametrize", "inplace")
BATCH = 8
CONTEXT = 128
VOCAB = 256


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Random byte sequences, each its own language-model label."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (count, CONTEXT), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def schedule(steps: int) -> Any:
    """80% by two thirds of the run, pruning 12 times from step 0."""
    from tensorplay.ao.pruning import CubicSchedule

    end = 2 * steps // 3
    return CubicSchedule(0.8, end_step=end, frequency=max(1, end // 12))


def gpt2(width: int, layers: int) -> Any:
    """The network: GPT-2's defaults but for the sizes, heads of 64 (one below 64 wide)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=CONTEXT, n_embd=width, n_layer=layers,
        n_head=max(1, width // 64), bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def run(variant: str, width: int, layers: int, steps: int, out: Path) -> dict[str, Any]:
    """One ``Trainer.train`` of ``variant``: its wall time, pruning events and sparsity."""
    from transformers import PrinterCallback, Trainer, TrainingArguments

    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback

    torch.manual_seed(0)
    model = gpt2(width, layers)
    callbacks = []
    if variant != "dense":
        callbacks.append(GradualPruningCallback(schedule(steps), masking=variant, verbose=False))
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-3,
        max_grad_norm=1.0,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=Tokens(BATCH * steps), callbacks=callbacks
    )
    trainer.remove_callback(PrinterCallback)  # the logs would be printed on stdout
    start, start_cpu = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if callbacks:
        pruner = callbacks[0].pruner
        events, sparsity = len(pruner.history), pruner.sparsity()
        weights = pruner.total_count()
    else:
        events, sparsity, weights = 0, 0.0, 0
    return {
        "seconds": seconds,
        "cpu": cpu,
        "events": events,
        "sparsity": sparsity,
        "selected_weights": weights,
    }


def measure(width: int, layers: int, steps: int, repeats: int) -> dict[str, Any]:
    """Every variant ``repeats`` times, alternated; the median time of each."""
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory() as out:
        run("dense", width, layers, max(2, steps // 10), Path(out))  # warm-up: first-call costs
        for _ in range(repeats):
            for variant in VARIANTS:
                runs[variant].append(run(variant, width, layers, steps, Path(out)))
                last = runs[variant][-1]
                print(
                    f"  {variant:<14} {last['cpu']:.2f}s CPU {last['seconds']:.2f}s wall",
                    flush=True,
                )
    dense = runs["dense"]
    return {
        variant: {
            **{
                f"{clock}{suffix}": value
                for clock in ("seconds", "cpu")
                for suffix, value in (
                    ("", statistics.median(r[clock] for r in done)),
                    ("_all", [r[clock] for r in done]),
                    # Each repeat against its own dense run: the variants ran side by side.
                    (
                        "_ratio",
                        statistics.median(
                            r[clock] / d[clock] for r, d in zip(done, dense, strict=True)
                        ),
                    ),
                )
            },
            **{key: done[0][key] for key in ("events", "sparsity", "selected_weights")},
        }
        for variant, done in runs.items()
    }


def markdown(results: dict[str, Any]) -> str:
    steps = results["steps"]
    dense = results["variants"]["dense"]["cpu"]
    lines = [
        "| run | CPU (s) | vs dense | wall (s) | vs dense | CPU per step (ms) "
        "| CPU per pruning event (s) | final sparsity |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        row = results["variants"][variant]
        extra = row["cpu"] - dense  # below 0: less CPU time than dense, within the noise
        per_step = "—" if variant == "dense" else f"{1000 * extra / steps:+.1f}"
        per_event = "—" if variant == "dense" else f"{extra / row['events']:+.3f}"
        if variant != "dense" and extra <= 0:
            per_step = per_event = "none"
        lines.append(
            f"| {variant} | {row['cpu']:.2f} | {row['cpu_ratio']:.3f}x | {row['seconds']:.2f} "
            f"| {row['seconds_ratio']:.3f}x | {per_step} | {per_event} | {row['sparsity']:.4f} |"
        )
    machine, pruned = results["machine"], results["variants"]["inplace"]
    size = f"{results['layers']} blocks {results['width']} wide"
    lines += [
        "",
        f"GPT-2, {size} ({results['params'] / 1e6:.2f}M parameters, "
        f"{pruned['selected_weights'] / 1e6:.2f}M of them selected), {steps} optimizer steps of "
        f"{BATCH} x {CONTEXT} tokens, {pruned['events']} pruning events to 80%; medians of "
        f"{results['repeats']} alternated runs in one process (ratios: the median of each "
        f"repeat's against its dense run), one thread; none: no more CPU time than the dense "
        f"run. {machine['cpus']} CPUs, torch {machine['torch']}, transformers "
        f"{machine['transformers']}.",
    ]
    if noisy := other_work(machine["load"], machine["cpus"]):
        lines[-1] += f" {noisy}"
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Run the comparison and write its tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=256, help="width of the residual stream")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per variant")
    parser.add_argument("--quick", action="store_true", help="width 128, 2 blocks, 1 repeat")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.layers, args.repeats = 128, 2, 1
    # One thread: steadier times on a shared machine; the callback's work is single-threaded too.
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    # At the start: its load average is the machine's other jobs, and wall times are theirs too.
    record = machine("cpus", "load", "platform", "torch", "transformers")
    variants = measure(args.width, args.layers, args.steps, args.repeats)
    params = sum(p.numel() for p in gpt2(args.width, args.layers).parameters())
    results = {
        "machine": record,
        "width": args.width,
        "layers": args.layers,
        "steps": args.steps,
        "repeats": args.repeats,
        "params": params,
        "variants": variants,
    }
    table = markdown(results)
    write_results(args.out, "hf_trainer_overhead", results, table)
    print(table)


if __name__ == "__main__":
    main()
