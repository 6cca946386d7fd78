"""Importance scores in miniature: which ordering of the papers shows up in a tiny GPT-2?

Two measurements, each one command, 3 seeds, mean ± std (needs
``pip install -c constraints.txt -e ".[examples,transformers]"``)::

    python examples/lm/importance.py transfer   # Sanh et al. 2020: fine-tuning transfer
    python examples/lm/importance.py oneshot    # Sun et al. 2023: one-shot, no weight update

``transfer``: a 2-block byte-level GPT-2 (width 64) is pretrained on Python's help text
(``pydoc_data.topics``, as in ``examples/lm/train.py``), then fine-tuned on a second text that
ships with Python, a fixed list of standard-library source files read from the interpreter's own
``Lib/`` (:data:`STDLIB_FILES`), pruning the block projections gradually (cubic schedule) to
70/90/97% by magnitude, movement or first-order Taylor; the table is the validation perplexity
(per byte) on held-out source. ``oneshot``: the same pretrained models pruned once to
50/60/70/80% without any weight update, by magnitude (global, layer-wise, per row) and by Wanda
per row after a calibration pass of 8 batches; the table is the pydoc validation perplexity.

Pretraining is 250 steps, fine-tuning 100 (dense for 10, the cubic ramp to step 70, then 30
steps at the target); both experiments together take about 15 minutes on 2 CPU cores. Both
print a Markdown table and write it as JSON (``--out``); ``--steps-scale 0.02`` shrinks
every step count (the test runs each for a few steps). The pretrained models are cached in
``runs/lm/importance/`` so that ``oneshot`` reuses what ``transfer`` trained.
"""

from __future__ import annotations

import argparse
import math
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2LMHeadModel

# `python examples/lm/importance.py` puts examples/lm/ on sys.path; tests import us by path.
sys.path.append(str(Path(__file__).resolve().parent))

from byte_text import Windows, load_bytes, shuffled_batches, split_windows, val_batches
from gpt_bytes import copy_of, gpt_config, perplexity, train
from reporting import mean_std, write_results

from tensorplay.ao.pruning import Pruner, calibrate
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, OneShotSchedule

__all__ = ["STDLIB_FILES", "main", "oneshot", "pretrain", "stdlib_bytes", "transfer"]

#: The fine-tuning text: 410 KB of Python source (3.11) that every CPython ships in ``Lib/``.
STDLIB_FILES = (
    "argparse.py",
    "calendar.py",
    "csv.py",
    "dataclasses.py",
    "fractions.py",
    "functools.py",
    "heapq.py",
    "json/decoder.py",
    "json/encoder.py",
    "shlex.py",
    "statistics.py",
    "string.py",
    "textwrap.py",
)
SEEDS = (0, 1, 2)
# Small enough that a cell (one fine-tuning run) takes tens of seconds on 2 CPU cores.
MODEL = {"context": 64, "n_layer": 2, "n_embd": 64, "n_head": 4}
BATCH = 16
# A step is ~0.25 s on 2 CPU cores (HF GPT-2's per-op overhead dominates at this size):
# the whole of both experiments then takes about 15 minutes.
PRETRAIN_STEPS = 250
FINETUNE_STEPS = 100
LR = 1e-3
# Only the block projections (HF Conv1D) are pruned; the tied embedding/head stays dense.
PRUNED = {"module_types": ["Conv1D"]}
CACHE = Path("runs/lm/importance")


def stdlib_bytes() -> torch.Tensor:
    """The files of :data:`STDLIB_FILES` from this interpreter's ``Lib/``, joined, as bytes.

    Raises:
        FileNotFoundError: A file this Python does not ship, naming it.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in STDLIB_FILES:
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(f"Expected the standard-library file {path} to exist.")
        parts.append(path.read_bytes())
    return torch.tensor(list(b"\n".join(parts)), dtype=torch.long)


def pretrain(seed: int, steps: int, cache: Path = CACHE) -> GPT2LMHeadModel:
    """The pretrained model of ``seed`` (trained on pydoc, cached in ``cache``)."""
    path = cache / f"pretrained-seed{seed}-steps{steps}.pt"
    torch.manual_seed(seed)
    net = GPT2LMHeadModel(gpt_config(**MODEL))
    if path.is_file():
        net.load_state_dict(torch.load(path, weights_only=True))
        return net
    train_windows, _ = split_windows(load_bytes(), MODEL["context"])
    train(net, shuffled_batches(train_windows, BATCH, seed), steps, lr=LR)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), path)
    return net


def transfer(
    scale: float,
    seeds: Sequence[int],
    sparsities: Sequence[float] = (0.7, 0.9, 0.97),
    windows: int = 192,
    cache: Path = CACHE,
) -> dict[str, Any]:
    """Fine-tune each pretrained model on stdlib source, pruning gradually (the module)."""
    steps = max(4, round(FINETUNE_STEPS * scale))
    # Dense for the first 10% of fine-tuning, the cubic ramp until 70%, then 30% at the target.
    start, end = round(0.1 * steps), max(round(0.1 * steps) + 1, round(0.7 * steps))
    frequency = max(1, steps // 30)
    train_windows, val_windows = split_windows(stdlib_bytes(), MODEL["context"])
    val = val_batches(val_windows, windows)
    cells: dict[str, list[float]] = {}
    for seed in seeds:
        base = pretrain(seed, max(4, round(PRETRAIN_STEPS * scale)), cache)
        cells.setdefault("dense", []).append(_finetune(base, None, train_windows, val, steps, seed))
        for sparsity in sparsities:
            for importance in ("magnitude", "movement", "taylor"):
                schedule = CubicSchedule(
                    sparsity, start_step=start, end_step=end, frequency=frequency
                )
                options = {"importance": importance, "schedule": schedule}
                ppl = _finetune(base, options, train_windows, val, steps, seed)
                cells.setdefault(f"{importance}@{sparsity}", []).append(ppl)
    return {"steps": steps, "cells": cells}


def _finetune(
    base: GPT2LMHeadModel,
    options: dict[str, Any] | None,
    train_windows: Windows,
    val: list[torch.Tensor],
    steps: int,
    seed: int,
) -> float:
    net = copy_of(base)
    pruner = None
    if options is not None:
        schedule = options.pop("schedule")
        # Layer-wise: each projection keeps the same fraction, so the three scores differ only
        # in which units of a matrix they keep (their scales differ between layers).
        pruner = Pruner(net, schedule, scope="layerwise", masking="inplace", **PRUNED, **options)
    torch.manual_seed(seed)
    train(net, shuffled_batches(train_windows, BATCH, 1000 + seed), steps, pruner, lr=5e-4)
    return perplexity(net, val)


ONE_SHOT: dict[str, dict[str, Any]] = {
    "magnitude global": {"scope": "global"},
    "magnitude layerwise": {"scope": "layerwise"},
    "magnitude row": {"scope": "row"},
    "wanda row": {"scope": "row", "importance": "wanda"},
}


def oneshot(
    scale: float,
    seeds: Sequence[int],
    sparsities: Sequence[float] = (0.5, 0.6, 0.7, 0.8),
    windows: int = 192,
    cache: Path = CACHE,
) -> dict[str, Any]:
    """Prune each pretrained model once, no weight update (the module docstring)."""
    train_windows, val_windows = split_windows(load_bytes(), MODEL["context"])
    val = val_batches(val_windows, windows)
    cells: dict[str, list[float]] = {}
    for seed in seeds:
        base = pretrain(seed, max(4, round(PRETRAIN_STEPS * scale)), cache)
        cells.setdefault("dense", []).append(perplexity(base, val))
        calibration = shuffled_batches(train_windows, BATCH, 2000 + seed)
        batches = [next(calibration) for _ in range(8)]
        for sparsity in sparsities:
            for name, options in ONE_SHOT.items():
                net = copy_of(base)
                pruner = Pruner(net, OneShotSchedule(sparsity), **PRUNED, **options)
                calibrate(pruner, [batch[:, :-1] for batch in batches])
                pruner.step()
                cells.setdefault(f"{name}@{sparsity}", []).append(perplexity(net, val))
    return {"cells": cells}


def table(cells: dict[str, list[float]], rows: Sequence[str], columns: Sequence[float]) -> str:
    """A Markdown table of mean ± std, one row per score, one column per sparsity."""
    header = "| score | " + " | ".join(f"{c:.0%}" for c in columns) + " |"
    lines = [header, "|" + "---|" * (len(columns) + 1)]
    for row in rows:
        values = [mean_std(cells[f"{row}@{c}"]) for c in columns]
        lines.append(f"| {row} | " + " | ".join(values) + " |")
    dense = cells.get("dense")
    if dense:
        lines.append(f"| dense | {mean_std(dense)} |" + " |" * (len(columns) - 1))
    return "\n".join(lines)


EXPERIMENTS: dict[str, tuple[Callable[..., dict[str, Any]], list[str], list[float]]] = {
    "transfer": (transfer, ["magnitude", "movement", "taylor"], [0.7, 0.9, 0.97]),
    "oneshot": (oneshot, list(ONE_SHOT), [0.5, 0.6, 0.7, 0.8]),
}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run one experiment, print its table, write it as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", choices=sorted(EXPERIMENTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--steps-scale", type=float, default=1.0)
    parser.add_argument("--sparsities", type=float, nargs="+", default=None)
    # The first 192 windows (12 KB) of each validation split: the same bytes for every cell.
    parser.add_argument("--val-windows", type=int, default=192)
    parser.add_argument("--cache", type=Path, default=CACHE, help="pretrained models")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    run, rows, columns = EXPERIMENTS[args.experiment]
    columns = args.sparsities or columns
    started = time.perf_counter()
    result = run(args.steps_scale, args.seeds, columns, args.val_windows, args.cache)
    result.update(
        experiment=args.experiment,
        seeds=args.seeds,
        seconds=round(time.perf_counter() - started, 1),
        table=table(result["cells"], rows, columns),
        model=MODEL,
        threads=torch.get_num_threads(),
    )
    print(result["table"])
    print(f"({result['seconds']} s, {len(args.seeds)} seeds, validation perplexity per byte)")
    out = args.out or args.cache / f"{args.experiment}.json"
    write_results(out, result)
    if not all(math.isfinite(v) for values in result["cells"].values() for v in values):
        raise RuntimeError(f"A perplexity is not finite: {result['cells']}")
    return result


if __name__ == "__main__":
    main()
