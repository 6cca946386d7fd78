"""Pruning without training to a parameter budget: FFN channels and heads together, then recovery.

Run (about 30 minutes on one thread of a loaded 2-core CPU once the dense model is cached)::

    python benchmarks/bench_budget_reconstruction.py           # the tables of docs/one_shot.rst
    python benchmarks/bench_budget_reconstruction.py --tiny    # seconds: what the slow test runs

The model is the one of ``bench_reconstruction.py`` (the LM example's 2-block byte-level GPT-2,
trained dense for 2,000 steps, cached in ``runs/lm/distill/``). Each copy is pruned by
``prune_one_shot(structure=("channel", "head"), target_params=...)`` to keep 80%, 65% or 50% of
the model's parameters as the budget counts them (every parameter, the tied embedding once, the
position embedding included: 120,576), FFN channels and heads ranked together by standardised
score per parameter removed, by magnitude, activation norm (``"wanda"``) or first-order Taylor;
once without and once with ``reconstruct=True``. There is one trained model: the **seeds vary
the calibration windows** (64 training windows drawn with seeds 0, 1, 2), not the training.
Each pruned copy is scored by its perplexity per byte on the first 512 held-out windows, then
shrunk (:func:`~tensorplay.ao.pruning.shrink`): its parameters are counted after shrinking,
exactly what was removed.

Recovery (``--recovery-seeds``, by default every seed): from each pruned model, the
LM example's 150 steps of AdamW at its learning rate (``examples/lm/distill.py``), with the
pruner attached to the optimizer so that the lean masks keep the pruned units at zero; once on
the task loss alone ("fine-tuned") and once with distillation from the dense model added
(``Distillation(teacher, temperature=2, weight=1)``, the example's). The run fails unless the
pruner counts as many pruned units after recovery as before, and unless the shrunk model's
perplexity equals the masked one's (to 1e-4, relative): the pruned units stayed pruned.

Results go to ``benchmarks/results/budget_reconstruction.json`` and ``.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# The benchmarks' harness and reconstruction benchmark; the LM example's data and training.
sys.path.append(str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1] / "examples" / "lm"))

from bench_reconstruction import (
    CALIBRATION_WINDOWS,
    IMPORTANCES,
    PRETRAIN_STEPS,
    ROOT,
    VAL_WINDOWS,
    calibration,
    dense_model,
    pruned_copy,
)
from byte_text import shuffled_batches, val_batches
from distill import BATCH, CACHE, DISTILL, LR, RECOVERY_STEPS, split
from gpt_bytes import perplexity, train
from harness import machine, write_results

from tensorplay.ao.pruning import Distillation, Pruner, dense_copy, shrink
from tensorplay.ao.pruning.structured.units.budget import model_params

# The parameters kept, as a fraction of today's: 20%, 35% and 50% of them removed.
KEPT = (0.8, 0.65, 0.5)
SEEDS = (0, 1, 2)
STRUCTURE = ("channel", "head")
# Shrunk and masked models compute the same: only float reassociation may differ.
SAME_PERPLEXITY = 1e-4


def _widths(report: Any) -> dict[str, int]:
    """The heads and FFN channels the shrunk model keeps, summed over its blocks."""
    kept = {"heads": 0, "channels": 0}
    for group in report.groups:
        if group.kind in ("head", "channel"):
            kept["heads" if group.kind == "head" else "channels"] += group.after
    return kept


def shrunk_params(net: nn.Module, val: list[Tensor], masked: float) -> Any:
    """Shrink ``net``; its report, once its perplexity is checked to equal ``masked``."""
    report = shrink(net)
    after = perplexity(net, val)  # type: ignore[arg-type]
    if abs(after - masked) > SAME_PERPLEXITY * masked:
        raise RuntimeError(f"The shrunk model scores {after:.5f}, the masked one {masked:.5f}.")
    return report


def recover(
    net: nn.Module, pruner: Pruner | None, teacher: nn.Module | None, steps: int, seed: int
) -> None:
    """``steps`` of the LM example's training of ``net``, the masks held by ``pruner`` (if
    pruned); distilled from ``teacher`` if one is given."""
    pruned = None if pruner is None else pruner.pruned_count()
    train_windows, _ = split()
    distill = None if teacher is None else Distillation(teacher, **DISTILL).attach(net)
    torch.manual_seed(seed)
    batches = shuffled_batches(train_windows, BATCH, 1000 + seed)
    train(net, batches, steps, pruner, distill, LR)  # type: ignore[arg-type]
    if distill is not None:
        distill.detach()
    if pruner is not None and pruner.pruned_count() != pruned:
        raise RuntimeError(f"{pruned} units pruned before recovery, {pruner.pruned_count()} after.")


def dense_recovery(
    base: nn.Module, teacher: nn.Module, val: list[Tensor], steps: int, seeds: Sequence[int]
) -> dict[str, dict[str, float]]:
    """The reference of the recovery rows: the dense model trained the same ``steps`` on the
    same batches, fine-tuned and distilled (from its own dense copy); spreads over ``seeds``."""
    scores: dict[str, list[float]] = {"finetuned": [], "distilled": []}
    for seed in seeds:
        for label, distilled_from in (("finetuned", None), ("distilled", teacher)):
            net = copy.deepcopy(base)
            recover(net, None, distilled_from, steps, seed)
            scores[label].append(perplexity(net, val))  # type: ignore[arg-type]
    return {label: _spread(values) for label, values in scores.items()}


def cell(
    base: nn.Module,
    teacher: nn.Module,
    batches: list[Tensor],
    val: list[Tensor],
    kept: float,
    importance: str,
    reconstruct: bool,
    recovery: int,
    seed: int,
) -> dict[str, Any]:
    """One pruned model's perplexity, size and (``recovery`` steps > 0) recoveries."""
    how = {"target_params": kept, "structure": STRUCTURE, "make_permanent": False}
    net, pruner, seconds = pruned_copy(base, batches, importance, reconstruct, **how)
    result: dict[str, Any] = {"perplexity": perplexity(net, val), "seconds": seconds}  # type: ignore[arg-type]
    result["units_pruned"] = pruner.pruned_count()
    for label, distilled_from in (("finetuned", None), ("distilled", teacher)):
        if recovery:
            trained, held, _ = pruned_copy(base, batches, importance, reconstruct, **how)
            recover(trained, held, distilled_from, recovery, seed)
            result[label] = perplexity(trained, val)  # type: ignore[arg-type]
            shrunk_params(trained, val, result[label])
    report = shrunk_params(net, val, result["perplexity"])
    result.update(params=report.parameters_after, **_widths(report))
    return result


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every cell: per kept fraction and importance, per seed, without and with reconstruction."""
    _, val_windows = split()
    device = torch.device("cpu")
    base = dense_model(0, args.steps, device, args.cache)
    base.eval()
    teacher = dense_copy(base)
    val = [batch.to(device) for batch in val_batches(val_windows, args.val_windows)]
    dense = perplexity(base, val)  # type: ignore[arg-type]
    total = model_params(base)
    print(f"dense: {dense:.3f} perplexity per byte, {total:,} parameters", flush=True)
    reference = None
    if args.recovery_steps and args.recovery_seeds:
        reference = dense_recovery(base, teacher, val, args.recovery_steps, args.recovery_seeds)
        print(f"dense, trained on: {reference}", flush=True)
    rows = []
    for kept in args.kept:
        for importance in IMPORTANCES:
            row: dict[str, Any] = {"kept": kept, "importance": importance, "seeds": {}}
            for seed in args.seeds:
                batches = calibration(args.calibration, device, seed)
                steps = args.recovery_steps if seed in args.recovery_seeds else 0
                row["seeds"][seed] = {
                    label: cell(base, teacher, batches, val, kept, importance, flag, steps, seed)
                    for label, flag in (("plain", False), ("reconstructed", True))
                }
            rows.append(summarise(row))
            print(_budget_row(rows[-1], total), flush=True)
    return {
        "dense": dense,
        "params": total,
        "dense_recovered": reference,
        "rows": rows,
        "setup": {
            "pretrain_steps": args.steps,
            "structure": list(STRUCTURE),
            "calibration_windows": args.calibration,
            "calibration_seeds": list(args.seeds),
            "val_windows": args.val_windows,
            "recovery_steps": args.recovery_steps,
            "recovery_seeds": list(args.recovery_seeds),
            "distillation": DISTILL,
            "lr": LR,
            "masking": "inplace",
            "threads": torch.get_num_threads(),
        },
        "machine": machine("cpus", "threads", "load", "torch", "transformers"),
    }


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def summarise(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with, over its seeds, the mean, min and max of each measured value and of the
    ratio reconstructed / plain."""
    seeds = list(row["seeds"].values())
    for label in ("plain", "reconstructed"):
        for key in ("perplexity", "params", "heads", "channels", "finetuned", "distilled"):
            values = [seed[label][key] for seed in seeds if key in seed[label]]
            if values:
                row[f"{label}_{key}"] = _spread(values)
    for key in ("perplexity", "finetuned", "distilled"):
        ratios = [
            seed["reconstructed"][key] / seed["plain"][key]
            for seed in seeds
            if key in seed["plain"]
        ]
        if ratios:
            row[f"ratio_{key}"] = _spread(ratios)
    return row


def _cell(spread: dict[str, float], digits: int = 3) -> str:
    if spread["min"] == spread["max"]:
        return f"{spread['mean']:.{digits}f}"
    return f"{spread['mean']:.{digits}f} ({spread['min']:.{digits}f}-{spread['max']:.{digits}f})"


def _params(spread: dict[str, float], total: int) -> str:
    low, high = round(spread["min"]), round(spread["max"])
    span = f"{low:,}" if low == high else f"{low:,}-{high:,}"
    return f"{span} ({1 - spread['mean'] / total:.1%})"


def _budget_row(row: dict[str, Any], total: int) -> str:
    units = f"{_cell(row['plain_heads'], 1)} / {_cell(row['plain_channels'], 0)}"
    return (
        f"| {1 - row['kept']:.0%} | {_params(row['plain_params'], total)} | {units} | "
        f"{row['importance']} | {_cell(row['plain_perplexity'])} | "
        f"{_cell(row['reconstructed_perplexity'])} | {_cell(row['ratio_perplexity'])} |"
    )


def _recovery_row(row: dict[str, Any]) -> str:
    cells = [f"{1 - row['kept']:.0%}", row["importance"]]
    for key in ("perplexity", "finetuned", "distilled"):
        cells += [
            f"{row[f'plain_{key}']['mean']:.3f}",
            f"{row[f'reconstructed_{key}']['mean']:.3f}",
            _cell(row[f"ratio_{key}"]),
        ]
    return "| " + " | ".join(cells) + " |"


def _dense_recovered(reference: dict[str, dict[str, float]] | None) -> str:
    if reference is None:
        return ""
    return (
        " The dense model trained the same steps scores "
        f"{_cell(reference['finetuned'])} fine-tuned and {_cell(reference['distilled'])} "
        "distilled (from its own copy)."
    )


def tables(result: dict[str, Any]) -> str:
    """The Markdown tables, with their captions."""
    setup, total = result["setup"], result["params"]
    seeds = ", ".join(str(seed) for seed in setup["calibration_seeds"])
    recovered = ", ".join(str(seed) for seed in setup["recovery_seeds"])
    lines = [
        "| removed (asked) | parameters kept (removed) | heads / FFN channels kept | importance "
        "| plain | reconstructed | ratio |",
        "|---:|---:|---:|---|---:|---:|---:|",
        *(_budget_row(row, total) for row in result["rows"]),
        "",
        f"Perplexity per byte of the {setup['pretrain_steps']}-step byte-level GPT-2 (dense: "
        f"{result['dense']:.3f}, {total:,} parameters, embeddings included) after one-shot "
        "pruning of FFN channels and heads together to a parameter budget "
        "(`target_params`), without and with reconstruction; ratio: reconstructed / plain. "
        "Mean (min-max) over calibration seeds "
        f"{seeds}: one trained model, the seeds draw its {setup['calibration_windows']} "
        "calibration windows; parameters counted after `shrink`, heads (of 8) and channels "
        "(of 512) summed over both blocks. Measured by "
        "`benchmarks/bench_budget_reconstruction.py` on the CPU.",
    ]
    if setup["recovery_steps"] and setup["recovery_seeds"]:
        lines += [
            "",
            "| removed | importance | one-shot plain | reconstructed | ratio | fine-tuned plain "
            "| reconstructed | ratio | distilled plain | reconstructed | ratio |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *(_recovery_row(row) for row in result["rows"]),
            "",
            f"Perplexity per byte after {setup['recovery_steps']} steps of recovery training "
            "from each pruned model (AdamW, the LM example's learning rate, the pruned units "
            "held at zero by the pruner's lean masks), on the task loss alone (fine-tuned) or "
            "with distillation from the dense model (distilled). Means over calibration seeds "
            f"{recovered} (the seed draws the recovery batches too); ratio: reconstructed / "
            "plain, mean (min-max)."
            + _dense_recovered(result.get("dense_recovered"))
            + " Measured by `benchmarks/bench_budget_reconstruction.py` on the CPU.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps and windows: seconds")
    parser.add_argument("--steps", type=int, default=PRETRAIN_STEPS, help="dense training steps")
    parser.add_argument("--calibration", type=int, default=CALIBRATION_WINDOWS, help="windows")
    parser.add_argument("--val-windows", type=int, default=VAL_WINDOWS)
    parser.add_argument("--recovery-steps", type=int, default=RECOVERY_STEPS)
    parser.add_argument("--recovery-seeds", type=int, nargs="*", default=list(SEEDS))
    parser.add_argument("--cache", type=Path, default=CACHE, help="the dense model's folder")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    args.kept, args.seeds = KEPT, SEEDS
    if args.tiny:
        args.steps, args.calibration, args.val_windows, args.recovery_steps = 8, 16, 16, 2
        args.kept, args.seeds = (0.5,), (0, 1)
    args.recovery_seeds = [seed for seed in args.recovery_seeds if seed in args.seeds]
    torch.set_num_threads(1)  # one thread: the machine is shared, and the times comparable
    result = measure(args)
    table = tables(result)
    print(table)
    write_results(args.out, "budget_reconstruction", result, table)
    return result


if __name__ == "__main__":
    main()
