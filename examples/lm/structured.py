"""Removing half of the FFN channels, gradually while training or at once: which recovers better?

One command, 3 seeds, at most 10 minutes on 2 CPU cores once the dense models
are cached (training them takes longer: see ``distill.py``; needs
``pip install -c constraints.txt -e ".[examples,transformers]"``)::

    python examples/lm/structured.py

For each seed the dense 2-block byte-level GPT-2 of ``examples/lm/distill.py`` (width 64, an FFN
of 256 channels per block, context 64; trained for 600 steps on Python's help text,
``pydoc_data.topics``; cached in ``runs/lm/distill/`` and shared with that script) loses 50% of
its FFN channels (``structure="channel"``: a column of ``mlp.c_fc`` with its bias entry and the
row of ``mlp.c_proj`` that reads it; ``scope="layerwise"``: every block keeps 128, so the shrunk
model's config says so and plain ``from_pretrained`` loads it), with the same 150 training steps
on the same batches either way:

* **one-shot**: the channels pruned at once (the lowest root mean square of their weights),
  then fine-tuned for the 150 steps;
* **gradual**: the same 50% reached on a cubic schedule over the first 70% of the steps, then
  fine-tuned at the target (Zhu & Gupta's recipe, as ``GradualPruning`` runs it in Lightning);
* and, for reference, the dense model trained for the same steps (it is not fully trained: the
  steps improve every run).

Each run is scored by its validation bits per byte on the held-out last 10% of the text (46,592
predicted bytes); the papers' order is gradual below one-shot. Then each gradual model is shrunk
(:func:`~tensorplay.ao.pruning.shrink`): its parameters before and after, its logits against the
masked model's, and the time of a forward pass (a batch of 16 windows, evaluation mode) against
the dense model's, in one process, alternating.

The results go to ``docs/results/structured.json`` and ``structured.md`` (``--out``);
``--steps-scale 0.02`` shrinks every step count (the test runs it so).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2LMHeadModel

# `python examples/lm/structured.py` puts examples/lm/ on sys.path; tests import us by path.
sys.path.append(str(Path(__file__).resolve().parent))

from byte_text import shuffled_batches, val_batches
from distill import BATCH, CACHE, LR, MODEL, pretrain, split
from gpt_bytes import copy_of, perplexity, train
from reporting import mean_std, write_results

from tensorplay.ao.pruning import Pruner, shrink
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule

__all__ = ["main", "measure_recovery", "measure_speed", "tables"]

SEEDS = (0, 1, 2)
PRETRAIN_STEPS = 600  # distill.py's dense models: its cache serves both scripts
RECOVERY_STEPS = 150
SPARSITY = 0.5
# Channels, ranked within each block: every block keeps the same width (a uniform config).
PRUNING = {"structure": "channel", "scope": "layerwise", "masking": "inplace"}
OUT = Path("docs/results/structured.json")
RUNS = {
    "continued": "dense, trained the same steps",
    "oneshot": "one-shot, then fine-tuning",
    "gradual": "gradual, fine-tuning at the target",
}


def bits(perplexity_per_byte: float) -> float:
    """Bits per byte of a perplexity per byte."""
    return math.log2(perplexity_per_byte)


# -- pruning and recovery ----------------------------------------------------------------------


def pruner_of(net: GPT2LMHeadModel, run: str, steps: int, sparsity: float) -> Pruner:
    """The pruner of ``run``: everything at step 0, or a cubic ramp over 70% of ``steps``."""
    if run == "oneshot":
        return Pruner(net, OneShotSchedule(sparsity), **PRUNING)  # type: ignore[arg-type]
    end = max(1, round(0.7 * steps))
    schedule = CubicSchedule(sparsity, end_step=end, frequency=max(1, steps // 30))
    return Pruner(net, schedule, **PRUNING)  # type: ignore[arg-type]


def recover(base: GPT2LMHeadModel, run: str, steps: int, seed: int, args: Any) -> Any:
    """A copy of ``base`` pruned by ``run`` while trained for ``steps``, and its pruner (none
    for ``"continued"``: the dense model trained on, the reference for what the steps alone
    bring)."""
    net = copy_of(base)
    pruner = None if run == "continued" else pruner_of(net, run, steps, args.sparsity)
    if run == "oneshot":
        pruner.step(0)  # type: ignore[union-attr]  # fine-tuning starts from the pruned model
    train_windows, _ = split()
    torch.manual_seed(seed)
    train(net, shuffled_batches(train_windows, BATCH, 1000 + seed), steps, pruner, lr=LR)
    if pruner is not None and abs(pruner.sparsity() - args.sparsity) > 1e-3:
        raise RuntimeError(f"Expected {args.sparsity:.0%} of the channels, got {pruner.sparsity()}")
    return net, pruner


def measure_recovery(args: Any) -> tuple[dict[str, list[float]], list[GPT2LMHeadModel], list[Any]]:
    """Validation bits per byte of every run, one per seed, by run name; the dense models and
    the gradual runs' (model, pruner) pairs, for the shrinking and speed measurements."""
    pretrain_steps = max(4, round(PRETRAIN_STEPS * args.steps_scale))
    steps = max(4, round(RECOVERY_STEPS * args.steps_scale))
    train_windows, val_windows = split()
    val = val_batches(val_windows, args.val_windows)
    cells: dict[str, list[float]] = {}
    dense, gradual = [], []
    for seed in args.seeds:
        base = pretrain(seed, pretrain_steps, train_windows, args.cache)
        dense.append(base)
        cells.setdefault("dense", []).append(bits(perplexity(base, val)))
        pruned = copy_of(base)
        pruner_of(pruned, "oneshot", steps, args.sparsity).step(0)
        cells.setdefault("pruned", []).append(bits(perplexity(pruned, val)))
        for run in RUNS:
            net, pruner = recover(base, run, steps, seed, args)
            cells.setdefault(run, []).append(bits(perplexity(net, val)))
            print(f"seed {seed} {run}: {cells[run][-1]:.4f} bits per byte", flush=True)
            if run == "gradual":
                gradual.append((net, pruner))
    return cells, dense, gradual


# -- the shrunk model --------------------------------------------------------------------------


def shrink_gradual(gradual: list[Any], val: list[torch.Tensor]) -> dict[str, Any]:
    """Shrink each gradual model: its parameters before and after, and the largest difference
    of its logits from the masked model's on a validation batch."""
    before, after, differences = [], [], []
    for net, pruner in gradual:
        net.eval()
        with torch.no_grad():
            masked = net(input_ids=val[0][:, :-1]).logits
        pruner.make_permanent()
        report = shrink(net)
        with torch.no_grad():
            shrunk = net(input_ids=val[0][:, :-1]).logits
        before.append(report.parameters_before)
        after.append(report.parameters_after)
        differences.append(float((shrunk - masked).abs().max()))
    return {
        "parameters_before": before[0],
        "parameters_after": after[0],
        "n_inner_after": gradual[0][0].config.n_inner,
        "largest_logit_difference": max(differences),
    }


def _forward_seconds(net: GPT2LMHeadModel, batch: torch.Tensor, count: int) -> float:
    started = time.perf_counter()
    with torch.no_grad():
        for _ in range(count):
            net(input_ids=batch)
    return (time.perf_counter() - started) / count


def measure_speed(dense: GPT2LMHeadModel, shrunk: GPT2LMHeadModel, rounds: int) -> dict[str, Any]:
    """Seconds per forward pass of a batch of 16 windows, dense and shrunk, alternating in one
    process so both see the same load; the median of the per-round ratios."""
    batch = torch.randint(
        0, 256, (16, MODEL["context"]), generator=torch.Generator().manual_seed(0)
    )
    nets = {"dense": dense.eval(), "shrunk": shrunk.eval()}
    for net in nets.values():
        _forward_seconds(net, batch, 3)  # warm-up
    times: dict[str, list[float]] = {"dense": [], "shrunk": []}
    for _ in range(rounds):
        for kind, net in nets.items():
            times[kind].append(_forward_seconds(net, batch, 10))
    ratios = [s / d for d, s in zip(times["dense"], times["shrunk"], strict=True)]
    return {
        "forward_seconds": {kind: statistics.median(values) for kind, values in times.items()},
        "time_ratio": statistics.median(ratios),
        "rounds": rounds,
    }


# -- report ------------------------------------------------------------------------------------


def tables(result: dict[str, Any]) -> str:
    """The recovery and size/speed tables, in Markdown, with their captions."""
    cells, seeds = result["cells"], len(result["seeds"])
    sparsity = f"{result['sparsity']:.0%}"
    wins = sum(g < o for o, g in zip(cells["oneshot"], cells["gradual"], strict=True))
    lines = [
        f"| {sparsity} of the FFN channels of every block, {result['recovery_steps']} steps "
        "| bits per byte | "
        "perplexity per byte |",
        "|---|---:|---:|",
        f"| dense, before these steps | {mean_std(cells['dense'], 3)} | "
        f"{2 ** statistics.fmean(cells['dense']):.2f} |",
        f"| one-shot, before fine-tuning | {mean_std(cells['pruned'], 3)} | "
        f"{2 ** statistics.fmean(cells['pruned']):.2f} |",
    ]
    for run, label in RUNS.items():
        lines.append(
            f"| {label} | {mean_std(cells[run], 3)} | {2 ** statistics.fmean(cells[run]):.2f} |"
        )
    lines += [
        "",
        'Each block keeps the same number of channels (`scope="layerwise"`). '
        f"Validation bits per byte, mean ± std over {seeds} seeds (lower is better; the "
        f"perplexity per byte is 2 to that mean): gradual is lower than one-shot in {wins} of "
        f"{seeds} seeds. The dense model trained for the same {result['recovery_steps']} steps "
        "is the reference: the pruned models gain from the steps as well.",
        "",
    ]
    size, speed = result["shrunk"], result["speed"]
    seconds = speed["forward_seconds"]
    lines += [
        "| the model | dense | shrunk | ratio |",
        "|---|---:|---:|---:|",
        f"| parameters | {size['parameters_before']:,} | {size['parameters_after']:,} | "
        f"{size['parameters_after'] / size['parameters_before']:.2f}x |",
        f"| forward pass (ms) | {1000 * seconds['dense']:.2f} | {1000 * seconds['shrunk']:.2f} | "
        f"{speed['time_ratio']:.2f}x |",
        "",
        f"The gradual model of seed {result['seeds'][0]} shrunk to {size['n_inner_after']} FFN "
        "channels per block; its logits differ from the masked model's by at most "
        f"{size['largest_logit_difference']:.1e}. Forward pass: a batch of 16 windows of "
        f"{result['model']['context']} bytes in evaluation mode, the median of "
        f"{speed['rounds']} alternating rounds of 10 passes each, in one process, on "
        f"{result['threads']} thread{'s' if result['threads'] > 1 else ''}; the ratio is the "
        "median of the rounds' ratios.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the recovery runs, shrink the gradual models, time them; print and write the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--steps-scale", type=float, default=1.0)
    parser.add_argument("--sparsity", type=float, default=SPARSITY)
    parser.add_argument("--val-windows", type=int, default=None, help="default: all")
    parser.add_argument("--speed-rounds", type=int, default=20)
    parser.add_argument("--cache", type=Path, default=CACHE, help="dense models")
    parser.add_argument("--out", type=Path, default=OUT, help=".json; the .md goes beside it")
    # The model is tiny: one intra-op thread is as fast, and leaves the other core to the rest.
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    cells, dense, gradual = measure_recovery(args)
    _, val_windows = split()
    shrunk = shrink_gradual(gradual, val_batches(val_windows, 16))
    speed = measure_speed(dense[0], gradual[0][0], args.speed_rounds)
    result: dict[str, Any] = {
        "seeds": args.seeds,
        "model": MODEL,
        "pretrain_steps": max(4, round(PRETRAIN_STEPS * args.steps_scale)),
        "recovery_steps": max(4, round(RECOVERY_STEPS * args.steps_scale)),
        "sparsity": args.sparsity,
        "pruning": PRUNING,
        "cells": cells,
        "shrunk": shrunk,
        "speed": speed,
        "threads": torch.get_num_threads(),
    }
    result["seconds"] = round(time.perf_counter() - started, 1)
    text = tables(result)
    print(text)
    write_results(args.out, result, text)
    if shrunk["largest_logit_difference"] > 1e-3:
        raise RuntimeError(f"The shrunk model computes other logits: {shrunk}")
    return result


if __name__ == "__main__":
    main()
