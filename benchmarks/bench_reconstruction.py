"""Pruning without training: what reconstruction recovers of one-shot structured pruning.

Run (about 5 minutes on 2 shared CPU cores once the dense model is cached; training it adds
about 20)::

    python benchmarks/bench_reconstruction.py           # the table of docs/one_shot.rst
    python benchmarks/bench_reconstruction.py --tiny    # seconds: what the slow-tier test runs

The model is the LM example's (``examples/lm/distill.py``): a 2-block byte-level GPT-2 (width 64,
4 heads, an FFN of 256 channels, context 64) trained dense on Python's help text
(``pydoc_data.topics``) by the example's recipe, for 2,000 steps rather than its 600: long
enough that pruning costs it (a fifth of its FFN channels cost 6% of its perplexity per byte,
half of them 82%). It is cached in ``runs/lm/distill/`` beside the example's. Then, each on a
fresh copy, ``prune_one_shot`` removes 20%, 35% or 50% of the FFN channels
(``structure="channel"``) or of the heads (``"head"``), ranked globally by magnitude, activation
norm (``"wanda"``) or first-order Taylor, after a calibration pass over
``--calibration`` training windows; once without and once with ``reconstruct=True`` (the
``mlp.c_proj`` or ``attn.c_proj`` of each block re-solved on the same windows). Each copy is
scored by its perplexity per byte on the first ``--val-windows`` held-out windows (the last
10% of the text). The ratio is reconstructed over plain: below 1 is better.

A second table sweeps ``reconstruct_damping`` (the ridge ``lambda`` relative to the mean
diagonal of each Gram matrix) at 50% with Wanda: the default, 0.001, is chosen from it.

Results go to ``benchmarks/results/reconstruction.json`` and ``.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# The LM example's data, model and training; the benchmarks' harness.
sys.path.append(str(Path(__file__).resolve().parents[1] / "examples" / "lm"))
sys.path.append(str(Path(__file__).resolve().parent))

from byte_text import shuffled_batches, val_batches
from distill import BATCH, CACHE, LR, MODEL, split
from gpt_bytes import gpt_config, nll, perplexity, train
from harness import machine, write_results
from transformers import GPT2LMHeadModel

from tensorplay.ao.pruning import Pruner, prune_one_shot
from tensorplay.ao.pruning.structured.reconstruction import DEFAULT_DAMPING

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"channel": "FFN channels", "head": "heads"}
SPARSITIES = (0.2, 0.35, 0.5)
IMPORTANCES = ("magnitude", "wanda", "taylor")
DAMPINGS = (0.0, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
# Longer than the example's 600 steps (its cache file is another): after 600 steps, half of the
# FFN channels cost that model 1% of its perplexity; after 2,000, a fifth of them cost 6%.
PRETRAIN_STEPS = 2000
# 8 batches of 8 windows of 64 bytes: 4,096 calibration tokens, 16 per input of the widest
# consumer (mlp.c_proj reads 256 channels), so its Gram matrix is far from singular.
CALIBRATION_WINDOWS = 64
CALIBRATION_BATCH = 8
CALIBRATION_SEED = 12345  # the windows' draw (the budget benchmark varies it)
VAL_WINDOWS = 512  # 32,256 predicted bytes


def loss(net: nn.Module, batch: Tensor) -> Tensor:
    """The mean next-byte loss: Taylor's gradients come from it; the others only run it."""
    mean: Tensor = nll(net, batch) / batch[:, 1:].numel()  # type: ignore[arg-type]
    return mean


def dense_model(seed: int, steps: int, device: torch.device, cache: Path) -> nn.Module:
    """The example's dense model of ``seed`` trained for ``steps`` (``distill.pretrain``'s
    recipe and cache file, on ``device``)."""
    path = cache / f"dense-seed{seed}-steps{steps}.pt"
    torch.manual_seed(seed)
    net = GPT2LMHeadModel(gpt_config(**MODEL))
    module: nn.Module = net
    module.to(device)
    if path.is_file():
        net.load_state_dict(torch.load(path, weights_only=True))
        return module
    train_windows, _ = split()
    batches = (batch.to(device) for batch in shuffled_batches(train_windows, BATCH, seed))
    train(net, batches, steps, lr=LR)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({name: t.cpu() for name, t in net.state_dict().items()}, path)
    return module


def calibration(windows: int, device: torch.device, seed: int = CALIBRATION_SEED) -> list[Tensor]:
    """``windows`` training windows in batches of :data:`CALIBRATION_BATCH`, drawn with
    ``seed``."""
    train_windows, _ = split()
    stream = shuffled_batches(train_windows, CALIBRATION_BATCH, seed=seed)
    return [next(stream).to(device) for _ in range(max(1, windows // CALIBRATION_BATCH))]


def prune(
    base: nn.Module,
    batches: list[Tensor],
    kind: str,
    sparsity: float,
    importance: str,
    reconstruct: bool,
    damping: float = DEFAULT_DAMPING,
) -> tuple[nn.Module, float]:
    """A pruned copy of ``base`` and the seconds ``prune_one_shot`` took."""
    net, _, seconds = pruned_copy(
        base, batches, importance, reconstruct, sparsity=sparsity, structure=kind,
        reconstruct_damping=damping,
    )  # fmt: skip
    return net, seconds


def pruned_copy(
    base: nn.Module, batches: list[Tensor], importance: str, reconstruct: bool, **how: Any
) -> tuple[nn.Module, Pruner, float]:
    """A copy of ``base`` pruned by ``prune_one_shot`` (lean masks; ``how``: its other
    arguments), its pruner and the seconds the call took."""
    net = copy.deepcopy(base)
    started = time.perf_counter()
    pruner = prune_one_shot(
        net, batches, importance=importance, forward=loss, reconstruct=reconstruct,
        masking="inplace", **how,
    )  # fmt: skip
    return net, pruner, time.perf_counter() - started


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every cell of the main table and of the damping sweep (the module)."""
    _, val_windows = split()
    device = torch.device(args.device)
    base = dense_model(args.seed, args.steps, device, args.cache)
    base.eval()
    val = [batch.to(device) for batch in val_batches(val_windows, args.val_windows)]
    batches = calibration(args.calibration, device)
    dense = perplexity(base, val)
    print(f"dense: {dense:.3f} perplexity per byte", flush=True)
    rows = []
    for kind in KINDS:
        for sparsity in args.sparsities:
            for importance in IMPORTANCES:
                row: dict[str, Any] = {"kind": kind, "sparsity": sparsity, "importance": importance}
                for label, flag in (("plain", False), ("reconstructed", True)):
                    net, seconds = prune(base, batches, kind, sparsity, importance, flag)
                    row[label] = perplexity(net, val)
                    row[f"{label}_seconds"] = seconds
                row["ratio"] = row["reconstructed"] / row["plain"]
                # The share of what pruning cost (in log perplexity) that reconstruction won back.
                cost = math.log(row["plain"] / dense)
                row["recovered"] = math.log(row["plain"] / row["reconstructed"]) / cost
                print(_row(row), flush=True)
                rows.append(row)
    sweep = []
    for kind in KINDS:
        for damping in args.dampings:
            net, _ = prune(base, batches, kind, max(args.sparsities), "wanda", True, damping)
            sweep.append({"kind": kind, "damping": damping, "perplexity": perplexity(net, val)})
            print(f"{kind} damping {damping:g}: {sweep[-1]['perplexity']:.3f}", flush=True)
    return {
        "dense": dense,
        "rows": rows,
        "damping_sweep": sweep,
        "setup": {
            "pretrain_steps": args.steps,
            "calibration_tokens": sum(batch[:, :-1].numel() for batch in batches),
            "val_windows": args.val_windows,
            "seed": args.seed,
            "dampings": list(args.dampings),
            "scope": "global",
            "masking": "inplace",
            "device": args.device,
        },
        "machine": machine("cpus", "threads", "load", "torch", "transformers"),
    }


def _row(row: dict[str, Any]) -> str:
    return (
        f"| {KINDS[row['kind']]} | {row['sparsity']:.0%} | {row['importance']} | "
        f"{row['plain']:.3f} | {row['reconstructed']:.3f} | {row['ratio']:.3f} | "
        f"{row['recovered']:.0%} |"
    )


def tables(result: dict[str, Any]) -> str:
    """The Markdown tables, with their captions."""
    setup = result["setup"]
    lines = [
        f"Perplexity per byte of the {setup['pretrain_steps']}-step byte-level GPT-2 (dense: "
        f"{result['dense']:.3f}) after one-shot pruning, without and with reconstruction "
        f"({setup['calibration_tokens']:,} calibration tokens; ratio: reconstructed / plain; "
        "recovered: the share of the log-perplexity pruning cost that reconstruction won back).",
        "",
        "| units | pruned | importance | plain | reconstructed | ratio | recovered |",
        "|---|---:|---|---:|---:|---:|---:|",
        *(_row(row) for row in result["rows"]),
        "",
        "`reconstruct_damping` at the largest sparsity, Wanda (perplexity per byte):",
        "",
        "| units | " + " | ".join(f"{d:g}" for d in setup["dampings"]) + " |",
        "|---|" + "---:|" * len(setup["dampings"]),
    ]
    for kind in KINDS:
        cells = [f"{s['perplexity']:.3f}" for s in result["damping_sweep"] if s["kind"] == kind]
        lines.append(f"| {KINDS[kind]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Measured by `benchmarks/bench_reconstruction.py` on the CPU; the default "
        "`reconstruct_damping` is the sweep's best within 0.003 for both kinds (0.001).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps and windows: seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=PRETRAIN_STEPS, help="dense training steps")
    parser.add_argument("--calibration", type=int, default=CALIBRATION_WINDOWS, help="windows")
    parser.add_argument("--val-windows", type=int, default=VAL_WINDOWS)
    parser.add_argument("--cache", type=Path, default=CACHE, help="the dense models' folder")
    parser.add_argument("--device", default="cpu", help="where to train, prune and evaluate")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    args.sparsities, args.dampings = SPARSITIES, DAMPINGS
    if args.tiny:
        args.steps, args.calibration, args.val_windows = 8, 16, 16
        args.sparsities, args.dampings = (0.5,), (0.0, 0.01)
    torch.manual_seed(args.seed)
    result = measure(args)
    table = tables(result)
    print(table)
    write_results(args.out, "reconstruction", result, table)
    return result


if __name__ == "__main__":
    main()
