"""Recovering what pruning costs, in miniature: fine-tuning or distilling from the dense model.

One command, 3 seeds, 4.3 minutes of CPU time (needs
``pip install -c constraints.txt -e ".[examples,transformers]"``)::

    python examples/lm/distill.py

For each seed a 2-block byte-level GPT-2 (width 64, context 64; :data:`MODEL`) is trained dense
for 600 steps on Python's help text (``pydoc_data.topics``, as in ``examples/lm/train.py``). From
that dense model, with the same 150 recovery steps on the same batches:

* **one-shot**: 90% of the block projections pruned at once (global magnitude), then
  (a) plain fine-tuning, or (b) fine-tuning with distillation from the dense model;
* **gradual**: the same 90% reached on a cubic schedule over the first 70% of the steps, then
  fine-tuned at the target, (c) without, or (d) with distillation from the first pruning step.

The task loss is the next-byte cross-entropy; distillation adds
``Distillation(temperature=2.0, weight=1.0).loss()`` to it, the teacher being a frozen copy of
the dense model. Each run is scored by its validation perplexity per byte on the held-out last
10% of the text (46,592 predicted bytes). Then the cost of a distilled step against a plain one,
in one process, alternating: its time, its peak memory (what is held between steps plus the most
a step allocates, from the PyTorch profiler's record of every allocation and free), and the
teacher's bytes per parameter in float32 and bfloat16.

The results go to ``docs/results/distillation.json`` and ``distillation.md`` (``--out``);
``--steps-scale 0.02`` shrinks every step count (the test runs it so). The dense models are cached
in ``runs/lm/distill/``. ``--structure`` and ``--sparsity`` choose the pruning:
``--structure channel --sparsity 0.5 --out docs/results/distillation_channel.json`` prunes half
of the FFN channels instead (global magnitude of each channel's slices) and shrinks the model
after its recovery.
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
from torch.profiler import ProfilerActivity, profile
from transformers import GPT2LMHeadModel

# `python examples/lm/distill.py` puts examples/lm/ on sys.path; tests import us by path.
sys.path.append(str(Path(__file__).resolve().parent))

from byte_text import Windows, load_bytes, shuffled_batches, split_windows, val_batches
from gpt_bytes import copy_of, gpt_config, nll, perplexity, train
from reporting import mean_std, write_results

from tensorplay.ao.pruning import Distillation, Pruner, dense_copy, shrink
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule, Schedule

__all__ = [
    "main",
    "measure_cost",
    "measure_recovery",
    "prune_once",
    "pretrain",
    "pruner_of",
    "tables",
]

SEEDS = (0, 1, 2)
# Small enough that a step takes about 0.1 s of CPU time on one thread (HF GPT-2's per-op
# overhead dominates at this size): 3 seeds of all the runs below take about 4 minutes of CPU.
MODEL = {"context": 64, "n_layer": 2, "n_embd": 64, "n_head": 4}
BATCH = 16
# Dense training long enough for the teacher to be worth learning from (the recovery steps are a
# quarter of it: a pruned model recovers on a small fraction of the dense model's tokens).
PRETRAIN_STEPS = 600
RECOVERY_STEPS = 150
LR = 1e-3
SPARSITY = 0.9
# Only the block projections (HF Conv1D) are pruned; the tied embedding/head stays dense.
PRUNED = {"module_types": ["Conv1D"]}
# Hinton et al.'s soft targets at a moderate temperature, weighted like the task loss.
DISTILL = {"temperature": 2.0, "weight": 1.0}
CACHE = Path("runs/lm/distill")
OUT = Path("docs/results/distillation.json")
RUNS = {
    "oneshot": "one-shot, then fine-tuning",
    "gradual": "gradual, fine-tuning at the target",
}


# -- data --------------------------------------------------------------------------------------


def split() -> tuple[Windows, Windows]:
    """The training and validation windows of the help text (the last 10% held out)."""
    return split_windows(load_bytes(), MODEL["context"])


# -- training ----------------------------------------------------------------------------------


def pretrain(seed: int, steps: int, train_windows: Windows, cache: Path = CACHE) -> GPT2LMHeadModel:
    """The dense model of ``seed``, trained for ``steps`` (cached in ``cache``)."""
    path = cache / f"dense-seed{seed}-steps{steps}.pt"
    torch.manual_seed(seed)
    net = GPT2LMHeadModel(gpt_config(**MODEL))
    if path.is_file():
        net.load_state_dict(torch.load(path, weights_only=True))
        return net
    train(net, shuffled_batches(train_windows, BATCH, seed), steps, lr=LR)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), path)
    return net


def pruner_of(net: GPT2LMHeadModel, schedule: Schedule, structure: str) -> Pruner:
    """The pruner of ``net``'s units: single weights of the block projections (``"element"``)
    or the FFN channels (``"channel"``: each with its slices in ``c_fc`` and ``c_proj``), ranked
    globally by magnitude, held as lean masks."""
    if structure == "element":
        return Pruner(net, schedule, masking="inplace", **PRUNED)
    if structure == "channel":  # the units of a GPT-2: FFN channels, found from its modules
        return Pruner(net, schedule, masking="inplace", structure="channel")
    raise ValueError(f"Expected `structure` to be 'element' or 'channel', but got {structure!r}.")


def prune_once(net: GPT2LMHeadModel, structure: str, sparsity: float) -> Pruner:
    """Prune ``net`` once, to ``sparsity`` of its units (``structure``, see :func:`pruner_of`)."""
    pruner = pruner_of(net, OneShotSchedule(sparsity), structure)
    pruner.step(0)
    return pruner


def recover(
    base: GPT2LMHeadModel,
    train_windows: Windows,
    run: str,
    distilled: bool,
    steps: int,
    seed: int,
    args: Any,
) -> GPT2LMHeadModel:
    """A copy of ``base`` pruned (``run``: one-shot or gradual) and trained for ``steps``."""
    net = copy_of(base)
    # Attached before the first pruning step: the teacher is the dense model.
    distill = Distillation(**DISTILL).attach(net) if distilled else None
    if run == "oneshot":
        pruner = prune_once(net, args.structure, args.sparsity)
    else:  # the cubic ramp over the first 70% of the steps, then fine-tuning at the target
        end = max(1, round(0.7 * steps))
        schedule = CubicSchedule(args.sparsity, end_step=end, frequency=max(1, steps // 30))
        pruner = pruner_of(net, schedule, args.structure)
    torch.manual_seed(seed)
    train(net, shuffled_batches(train_windows, BATCH, 1000 + seed), steps, pruner, distill, LR)
    if distill is not None:
        distill.detach()
    if abs(pruner.sparsity() - args.sparsity) > 1e-3:
        raise RuntimeError(f"Expected {args.sparsity:.0%} sparsity, got {pruner.sparsity():.2%}.")
    if args.structure == "channel":  # the pruned channels removed: a smaller model, same outputs
        shrink(net)
    return net


def measure_recovery(args: Any) -> dict[str, list[float]]:
    """Validation perplexity per byte of every run, one value per seed, by run name."""
    pretrain_steps = max(4, round(PRETRAIN_STEPS * args.steps_scale))
    steps = max(4, round(RECOVERY_STEPS * args.steps_scale))
    train_windows, val_windows = split()
    val = val_batches(val_windows, args.val_windows)
    cells: dict[str, list[float]] = {}
    for seed in args.seeds:
        base = pretrain(seed, pretrain_steps, train_windows, args.cache)
        cells.setdefault("dense", []).append(perplexity(base, val))
        pruned = copy_of(base)
        prune_once(pruned, args.structure, args.sparsity)
        cells.setdefault("pruned", []).append(perplexity(pruned, val))
        for run in RUNS:
            for distilled in (False, True):
                net = recover(base, train_windows, run, distilled, steps, seed, args)
                name = f"{run}/{'distilled' if distilled else 'plain'}"
                cells.setdefault(name, []).append(perplexity(net, val))
                print(f"seed {seed} {name}: {cells[name][-1]:.3f}", flush=True)
    return cells


# -- cost --------------------------------------------------------------------------------------


def _steps(
    net: GPT2LMHeadModel, optimizer: Any, batch: torch.Tensor, count: int, distill: Any
) -> float:
    """Seconds per training step over ``count`` steps of ``batch``."""
    started = time.perf_counter()
    for _ in range(count):
        loss = nll(net, batch) / batch[:, 1:].numel()
        if distill is not None:
            loss = loss + distill.loss()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - started) / count


def held_bytes(*objects: Any) -> int:
    """The bytes of the tensors held between steps: modules' parameters and buffers,
    optimizers' state."""
    tensors: dict[int, torch.Tensor] = {}
    for held in objects:
        if isinstance(held, torch.nn.Module):
            found = [*held.parameters(), *held.buffers()]
        else:  # an optimizer
            found = [v for state in held.state.values() for v in state.values()]
        tensors.update((id(t), t) for t in found if isinstance(t, torch.Tensor))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def step_peak_bytes(net: GPT2LMHeadModel, optimizer: Any, batch: torch.Tensor, distill: Any) -> int:
    """The most bytes one training step allocates above what is held between steps: the
    running total of every allocation and free the profiler records, in time order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        _steps(net, optimizer, batch, 1, distill)
    live = peak = 0
    for event in sorted(profiler.events(), key=lambda event: event.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def teacher_bytes_per_parameter(net: GPT2LMHeadModel, dtype: torch.dtype) -> float:
    """The teacher's parameter and buffer bytes per parameter of the student (ties once)."""
    return held_bytes(dense_copy(net, dtype)) / sum(p.numel() for p in net.parameters())


def measure_cost(rounds: int, steps: int) -> dict[str, Any]:
    """Time and memory of a distilled step against a plain one, and the teacher's bytes."""
    torch.manual_seed(0)
    batch = torch.randint(0, 256, (BATCH, MODEL["context"] + 1))
    plain = GPT2LMHeadModel(gpt_config(**MODEL)).train()
    distilled = copy_of(plain).train()
    distill = Distillation(**DISTILL).attach(distilled)
    runs = {
        "plain": (plain, torch.optim.AdamW(plain.parameters(), lr=LR), None),
        "distilled": (distilled, torch.optim.AdamW(distilled.parameters(), lr=LR), distill),
    }
    for net, optimizer, kd in runs.values():
        _steps(net, optimizer, batch, 2, kd)  # warm-up: the optimizer's state exists after it
    times: dict[str, list[float]] = {"plain": [], "distilled": []}
    peaks: dict[str, list[int]] = {"plain": [], "distilled": []}
    for _ in range(rounds):  # alternating, so both see the same load on a shared machine
        for kind, (net, optimizer, kd) in runs.items():
            times[kind].append(_steps(net, optimizer, batch, steps, kd))
            peaks[kind].append(step_peak_bytes(net, optimizer, batch, kd))
    held = {
        "plain": held_bytes(plain, runs["plain"][1]),
        "distilled": held_bytes(distilled, runs["distilled"][1], distill.teacher),
    }
    ratios = [d / p for p, d in zip(times["plain"], times["distilled"], strict=True)]
    return {
        "step_seconds": {kind: statistics.median(values) for kind, values in times.items()},
        "time_ratio": statistics.median(ratios),
        "held_mb": {kind: value / 2**20 for kind, value in held.items()},
        "peak_mb": {kind: (held[kind] + max(peaks[kind])) / 2**20 for kind in held},
        "teacher_bytes_per_parameter": {
            "float32": teacher_bytes_per_parameter(plain, torch.float32),
            "bfloat16": teacher_bytes_per_parameter(plain, torch.bfloat16),
        },
        "rounds": rounds,
        "steps_per_round": steps,
    }


# -- report ------------------------------------------------------------------------------------


def tables(result: dict[str, Any]) -> str:
    """The recovery and cost tables, in Markdown, with their captions."""
    cells, cost, seeds = result["cells"], result["cost"], len(result["seeds"])
    sparsity = f"{result['sparsity']:.0%}"
    if result.get("structure") == "channel":
        sparsity += " of the FFN channels ranked globally, shrunk"
    else:
        sparsity += " of the block projections' weights"
    lines = [
        f"| pruned to {sparsity}, {result['recovery_steps']} steps | fine-tuning | "
        "distillation | distillation lower in |",
        "|---|---:|---:|---:|",
    ]
    for run, label in RUNS.items():
        plain, distilled = cells[f"{run}/plain"], cells[f"{run}/distilled"]
        wins = sum(d < p for p, d in zip(plain, distilled, strict=True))
        lines.append(
            f"| {label} | {mean_std(plain)} | {mean_std(distilled)} | {wins} of {seeds} seeds |"
        )
    lines += [
        "",
        f"Validation perplexity per byte, mean ± std over {seeds} seeds (lower is better): the "
        f"dense model (the teacher) {mean_std(cells['dense'])}, one-shot pruned before any "
        f"recovery {mean_std(cells['pruned'])}.",
        "",
        "| one training step | fine-tuning | distillation | ratio |",
        "|---|---:|---:|---:|",
    ]
    seconds, peak = cost["step_seconds"], cost["peak_mb"]
    lines.append(
        f"| time (ms) | {1000 * seconds['plain']:.0f} | {1000 * seconds['distilled']:.0f} | "
        f"{cost['time_ratio']:.2f}x |"
    )
    lines.append(
        f"| peak memory (MB) | {peak['plain']:.1f} | {peak['distilled']:.1f} | "
        f"{peak['distilled'] / peak['plain']:.2f}x |"
    )
    teacher = cost["teacher_bytes_per_parameter"]
    lines += [
        "",
        "| teacher dtype | bytes per parameter |",
        "|---|---:|",
        f"| float32 | {teacher['float32']:.2f} |",
        f"| bfloat16 | {teacher['bfloat16']:.2f} |",
        "",
        f"Time: the median of {cost['rounds']} alternating rounds of {cost['steps_per_round']} "
        "steps each, in one process. Peak memory: what is held between steps (the model, "
        "AdamW's state and, distilling, the float32 teacher) plus the most a step allocates on "
        "top of it (every allocation and free the PyTorch profiler records, in time order). "
        "The teacher: its parameters and buffers per parameter of the student.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the recovery runs and the cost measurement, print the tables, write them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--steps-scale", type=float, default=1.0)
    parser.add_argument("--structure", choices=["element", "channel"], default="element")
    parser.add_argument("--sparsity", type=float, default=SPARSITY)
    parser.add_argument("--val-windows", type=int, default=None, help="default: all")
    parser.add_argument("--cost-rounds", type=int, default=10)
    parser.add_argument("--cache", type=Path, default=CACHE, help="dense models")
    parser.add_argument("--out", type=Path, default=OUT, help=".json; the .md goes beside it")
    # The model is tiny: one intra-op thread is as fast, and leaves the other core to the rest.
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    cells = measure_recovery(args)
    cost = measure_cost(args.cost_rounds, max(1, round(10 * min(1.0, args.steps_scale * 10))))
    result: dict[str, Any] = {
        "seeds": args.seeds,
        "model": MODEL,
        "batch": BATCH,
        "pretrain_steps": max(4, round(PRETRAIN_STEPS * args.steps_scale)),
        "recovery_steps": max(4, round(RECOVERY_STEPS * args.steps_scale)),
        "structure": args.structure,
        "sparsity": args.sparsity,
        "distill": DISTILL,
        "cells": cells,
        "cost": cost,
        "threads": torch.get_num_threads(),
    }
    result["seconds"] = round(time.perf_counter() - started, 1)
    text = tables(result)
    print(text)
    write_results(args.out, result, text)
    if not all(math.isfinite(v) for values in cells.values() for v in values):
        raise RuntimeError(f"A perplexity is not finite: {cells}")
    return result


if __name__ == "__main__":
    main()
