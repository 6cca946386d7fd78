"""Width against depth: what removing a quarter or half of a model's parameters costs, per kind.

Run (about 2 minutes on one thread once the dense model is cached; training it takes about 5)::

    python benchmarks/bench_width.py           # the tables of docs/width.rst
    python benchmarks/bench_width.py --tiny    # seconds: what the slow test runs

The model is the one of ``bench_reconstruction.py``: the LM example's 2-block byte-level GPT-2
(width 64, 4 heads, FFN of 256) trained dense for 2,000 steps on Python's help text, cached in
``runs/lm/distill/``. Each copy is pruned by ``prune_one_shot(structure=kind,
target_params=kept)`` to keep 75% or 50% of the model's parameters as the budget counts them
(every parameter, the tied embedding once), one kind alone per row: the hidden size (the
residual stream's channels), FFN channels, heads or whole blocks (depth), each ranked by the
score named in its row after a calibration pass over 64 training windows. Each pruned copy is
shrunk (:func:`~tensorplay.ao.pruning.shrink`), its parameters counted, and scored by its
perplexity per byte on 512 held-out windows: once as pruned ("one-shot") and once after 150
steps of training with distillation from the dense model ("recovered"; the LM example's
learning rate). A budget a kind cannot meet (two blocks cannot lose half their parameters
without losing both) is recorded as refused, with the library's message.

A second table ranks the hidden size's channels by each score ("random": a seeded random draw,
``importance="magnitude", method="random_unstructured"``) at both budgets.

The last columns time a forward of 8 windows of 64 bytes on one thread (prefill), each shrunk
model in turns with the dense one: the median ratio over rounds.

Results go to ``benchmarks/results/width.json`` and ``.md`` (``--out``); ``--plot`` draws
``width.png`` (perplexity against parameters kept, per axis) from them.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# The benchmarks' harness and reconstruction benchmarks; the LM example's data and training.
sys.path.append(str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1] / "examples" / "lm"))

from bench_budget_reconstruction import DISTILL, recover
from bench_reconstruction import (
    CALIBRATION_WINDOWS,
    PRETRAIN_STEPS,
    ROOT,
    VAL_WINDOWS,
    calibration,
    dense_model,
    loss,
)
from byte_text import val_batches
from distill import CACHE, LR, RECOVERY_STEPS, split
from gpt_bytes import perplexity
from harness import in_turns, machine, median_ratios, write_results
from plotting import add_plot_option, plot_saved

from tensorplay.ao.pruning import dense_copy, prune_one_shot, shrink
from tensorplay.ao.pruning.structured.units import STRUCTURES
from tensorplay.ao.pruning.structured.units.budget import model_params

# The parameters kept, as a fraction of the dense model's: a quarter and a half removed.
KEPT = (0.75, 0.5)
# Each kind with the score it is ranked by in the first table: Minitron's activation score for
# width, first-order Taylor (the loss's sensitivity to a block) for depth.
KINDS = {
    "hidden": ("hidden size", "activation"),
    "channel": ("FFN channels", "activation"),
    "head": ("heads", "activation"),
    "layer": ("depth (blocks)", "taylor"),
    "mix": ("searched mix", "search"),
}
# The searched mix: the kinds ``search=True`` shares the budget among, each ranked as above.
MIX = ("layer", "hidden", "channel")
HIDDEN_SCORES = ("activation", "magnitude", "taylor", "random")
SEED = 0
LATENCY_ROUNDS = 7


def prune_shrunk(
    base: nn.Module, batches: list[Tensor], kind: str, kept: float, score: str
) -> nn.Module:
    """A shrunk copy of ``base`` keeping ``kept`` of its parameters, ``kind`` ranked by
    ``score``; raises the library's ``ValueError`` where the budget cannot be met."""
    net = copy.deepcopy(base)
    torch.manual_seed(SEED)
    if kind == "mix":
        scores = {part: KINDS[part][1] for part in MIX}
        found = prune_one_shot(
            net, batches, target_params=kept, structure=MIX, search=True, forward=loss,
            importance=scores,
        )  # fmt: skip
        net.search = found.search_report()  # type: ignore[assignment]  # read by cell()
        shrink(net)
        return net.eval()
    if score == "random":
        how: dict[str, Any] = {"importance": "magnitude", "method": "random_unstructured"}
    else:
        how = {"importance": score}
    prune_one_shot(net, batches, target_params=kept, structure=kind, forward=loss, **how)
    shrink(net)
    return net.eval()


def prefill_ratios(base: nn.Module, nets: dict[str, nn.Module], batch: Tensor) -> dict[str, float]:
    """Per shrunk model, the median over rounds of its forward's CPU time over the dense one's."""

    def forward(net: nn.Module) -> Any:
        def call() -> None:
            with torch.no_grad():
                net(input_ids=batch)

        return call

    calls = {"dense": forward(base), **{key: forward(net) for key, net in nets.items()}}
    return median_ratios(in_turns(calls, LATENCY_ROUNDS, 3), "dense")


def cell(
    base: nn.Module,
    teacher: nn.Module,
    batches: list[Tensor],
    val: list[Tensor],
    kind: str,
    kept: float,
    score: str,
    recovery: int,
) -> tuple[dict[str, Any], nn.Module | None]:
    """One row's measurements (and its shrunk model, before recovery), or the refusal."""
    row: dict[str, Any] = {"kind": kind, "kept": kept, "importance": score}
    try:
        net = prune_shrunk(base, batches, kind, kept, score)
    except ValueError as error:
        row["refused"] = str(error).splitlines()[0]
        return row, None
    row["params"] = model_params(net)
    report = vars(net).pop("search", None)
    if report is not None:  # the searched mix: what was chosen, among how many, how fast
        chosen = next(candidate for candidate in report if candidate["chosen"])
        row["units"] = chosen["units"]
        row["candidates"] = len(report)
        row["search_seconds"] = sum(candidate["seconds"] for candidate in report)
    row["oneshot"] = perplexity(net, val)  # type: ignore[arg-type]
    if recovery:
        recovered = copy.deepcopy(net)
        recover(recovered, None, teacher, recovery, SEED)
        row["recovered"] = perplexity(recovered, val)  # type: ignore[arg-type]
    return row, net


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every row of both tables."""
    _, val_windows = split()
    device = torch.device("cpu")
    base = dense_model(SEED, args.steps, device, args.cache).eval()
    teacher = dense_copy(base)
    val = [batch.to(device) for batch in val_batches(val_windows, args.val_windows)]
    batches = calibration(args.calibration, device)
    dense = perplexity(base, val)  # type: ignore[arg-type]
    total = model_params(base)
    print(f"dense: {dense:.3f} perplexity per byte, {total:,} parameters", flush=True)
    kinds = [kind for kind in KINDS if kind in STRUCTURES or kind == "mix"]
    rows, shrunk = [], {}
    for kept in args.kept:
        for kind in kinds:
            row, net = cell(
                base, teacher, batches, val, kind, kept, KINDS[kind][1], args.recovery_steps
            )
            rows.append(row)
            if net is not None:
                shrunk[f"{kind}@{kept}"] = net
            print(_kind_row(row, total), flush=True)
    for key, ratio in prefill_ratios(base, shrunk, val[0][:, :-1]).items():
        for row in rows:
            if f"{row['kind']}@{row['kept']}" == key:
                row["prefill_vs_dense"] = ratio
    scores = []
    if "hidden" in kinds:
        for kept in args.kept:
            for score in HIDDEN_SCORES:
                done = [r for r in rows if (r["kind"], r["kept"], r["importance"]) == (
                    "hidden", kept, score)]  # fmt: skip
                row = done[0] if done else cell(
                    base, teacher, batches, val, "hidden", kept, score, args.recovery_steps
                )[0]  # fmt: skip
                scores.append(row)
                print(_kind_row(row, total), flush=True)
    return {
        "dense": dense,
        "params": total,
        "rows": rows,
        "hidden_scores": scores,
        "setup": {
            "pretrain_steps": args.steps,
            "kinds": {kind: KINDS[kind][1] for kind in kinds},
            "calibration_windows": args.calibration,
            "val_windows": args.val_windows,
            "recovery_steps": args.recovery_steps,
            "distillation": DISTILL,
            "lr": LR,
            "seed": SEED,
            "threads": torch.get_num_threads(),
        },
        "machine": machine("cpus", "threads", "load", "torch", "transformers"),
    }


def _perplexity(row: dict[str, Any], key: str) -> str:
    return f"{row[key]:.3f}" if key in row else "-"


def _kind_row(row: dict[str, Any], total: int) -> str:
    label = KINDS[row["kind"]][0]
    if row.get("units") is not None:  # the searched mix: the units each kind gave
        label += " (" + ", ".join(f"{kind} {count}" for kind, count in row["units"].items()) + ")"
    head = f"| {label} | {1 - row['kept']:.0%} | {row['importance']} |"
    if "refused" in row:
        least = re.search(r"at least (\d+)", row["refused"])
        why = f"at least {int(least[1]):,} kept" if least else row["refused"]
        return f"{head} refused ({why}) | | | |"
    prefill = f"{row['prefill_vs_dense']:.2f}" if "prefill_vs_dense" in row else "-"
    return (
        f"{head} {row['params']:,} ({row['params'] / total:.1%}) | {_perplexity(row, 'oneshot')} "
        f"| {_perplexity(row, 'recovered')} | {prefill} |"
    )


def _mix_verdicts(result: dict[str, Any]) -> list[str]:
    """Per budget, whether the searched mix beats every single kind (one-shot and recovered),
    and what the search cost."""
    lines = []
    for mix in (row for row in result["rows"] if row["kind"] == "mix" and "refused" not in row):
        singles = [
            row for row in result["rows"]
            if row["kind"] != "mix" and row["kept"] == mix["kept"]
            and "refused" not in row
        ]  # fmt: skip
        verdicts = []
        for key, label in (("oneshot", "one-shot"), ("recovered", "recovered")):
            best = min(singles, key=lambda row: row[key])
            beats = "beats" if mix[key] < best[key] else "does not beat"
            verdicts.append(
                f"{label} it {beats} every single kind ({mix[key]:.3f} against "
                f"{KINDS[best['kind']][0]}'s {best[key]:.3f})"
            )
        lines.append(
            f"At {1 - mix['kept']:.0%} removed, the searched mix scored {mix['candidates']} "
            f"candidates in {mix['search_seconds']:.1f} s; " + "; ".join(verdicts) + "."
        )
    return [" ".join(lines)] if lines else []


def tables(result: dict[str, Any]) -> str:
    """The Markdown tables, with their captions."""
    setup, total = result["setup"], result["params"]
    header = [
        "| pruned | removed (asked) | importance | parameters kept | one-shot | recovered "
        "| prefill time / dense |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    lines = [
        *header,
        *(_kind_row(row, total) for row in result["rows"]),
        "",
        f"Perplexity per byte of the {setup['pretrain_steps']}-step byte-level GPT-2 (dense: "
        f"{result['dense']:.3f}, {total:,} parameters) pruned one kind at a time to a parameter "
        "budget (`target_params`), then shrunk: one-shot, and recovered by "
        f"{setup['recovery_steps']} steps of training with distillation from the dense model. "
        "Parameters counted after `shrink`; prefill time: a forward of 8 x 64 bytes on one "
        "thread, the median ratio over rounds timed in turns with the dense model. Measured by "
        "`benchmarks/bench_width.py` on the CPU.",
        *_mix_verdicts(result),
    ]
    if result["hidden_scores"]:
        lines += [
            "",
            *header,
            *(_kind_row(row, total) for row in result["hidden_scores"]),
            "",
            "The hidden size's channels ranked by each score at the same budgets (random: a "
            "seeded random draw).",
        ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], folder: Path) -> list[Path]:
    """``width.png``: perplexity per byte against the parameters kept, one-shot and recovered,
    one line per axis (each point a budget it met), the dense model as a dashed line."""
    from plotting import new_figure, save

    figure = new_figure(9.0, 3.8)
    total = results["params"]
    for index, key in enumerate(("oneshot", "recovered")):
        axes = figure.add_subplot(1, 2, index + 1)
        for kind, (label, _) in KINDS.items():
            rows = [r for r in results["rows"] if r["kind"] == kind and "refused" not in r]
            if rows:
                kept = [100 * r["params"] / total for r in rows]
                axes.plot(kept, [r[key] for r in rows], marker="o", label=label)
        axes.axhline(results["dense"], color="tab:gray", linestyle="--", label="dense")
        axes.set_xlabel("parameters kept (%)")
        axes.set_ylabel("perplexity per byte")
        axes.set_title("one-shot" if key == "oneshot" else "recovered (distilled)")
        axes.invert_xaxis()
        if index == 0:
            axes.legend(fontsize="small")
    return [save(figure, folder / "width.png")]


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps and windows: seconds")
    parser.add_argument("--steps", type=int, default=PRETRAIN_STEPS, help="dense training steps")
    parser.add_argument("--calibration", type=int, default=CALIBRATION_WINDOWS, help="windows")
    parser.add_argument("--val-windows", type=int, default=VAL_WINDOWS)
    parser.add_argument("--recovery-steps", type=int, default=RECOVERY_STEPS)
    parser.add_argument("--cache", type=Path, default=CACHE, help="the dense model's folder")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    add_plot_option(parser)
    args = parser.parse_args(argv)
    if args.plot is not None:
        plot_saved(plot, args.out / "width.json", args.plot)
        return {}
    args.kept = KEPT
    if args.tiny:
        args.steps, args.calibration, args.val_windows, args.recovery_steps = 8, 16, 16, 2
    torch.set_num_threads(1)  # one thread: the machine is shared, and the times comparable
    result = measure(args)
    table = tables(result)
    print(table)
    write_results(args.out, "width", result, table)
    return result


if __name__ == "__main__":
    main()
