"""How good is ``target_latency``'s estimate? Estimated against measured latency of shrunk models.

Run (a few minutes on one thread of a 2-core CPU)::

    python benchmarks/bench_latency.py            # the small Llama, budgets 75% and 50%
    python benchmarks/bench_latency.py --tiny     # seconds: what the slow test runs

The model is a small Llama built from its config (random init, float32, on the CPU): hidden 384,
6 layers, 6 query heads on 2 key/value heads (head_dim 64), FFN 1024, vocabulary 4096 (12.6M
parameters). For each structure (FFN channels, heads, the two together, layers, the hidden size)
and each budget (``target_latency`` of 75% and 50% of the dense model's latency, on a forward of
``1 x 128`` tokens), a copy is pruned by ``prune_one_shot(..., importance="magnitude")``: the
copy's parts are timed once (the latency table), units go until the estimate meets the budget,
and :meth:`~tensorplay.ao.pruning.Pruner.budget_report` gives the **estimated** fraction. The
copy is then shrunk and its forward timed against the dense model's, in turns (dense and shrunk
alternating, the order swapped every round), the **measured** fraction being the median over the
rounds of shrunk over dense. The table prints both and their ratio (measured over estimated:
above 1, the shrunk model is slower than estimated). A budget the structure cannot reach is
refused before anything changes; the table says so, with the least it can reach.

One torch thread by default: on a machine shared with other work, a thread per core makes an
operation wait for whichever thread the system has descheduled, and swings the times by 5x. On
one thread both the table and the measured forwards are read on this thread's CPU time
(``time.thread_time``), which other programs do not stretch.
Results go to ``benchmarks/results/latency.json`` and ``.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import copy
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.append(str(Path(__file__).resolve().parent))

from harness import machine, other_work, write_results

from tensorplay.ao.pruning import LatencyBudget, prune_one_shot, shrink

ROOT = Path(__file__).resolve().parent
STRUCTURES: list[tuple[str, Any]] = [
    ("FFN channels", "channel"),
    ("heads", "head"),
    ("channels + heads", ("channel", "head")),
    ("layers", "layer"),
    ("hidden size", "hidden"),
]
FULL = {"hidden": 384, "layers": 6, "heads": 6, "kv_heads": 2, "ffn": 1024, "vocab": 4096}
TINY = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256}


def llama(size: dict[str, int]) -> nn.Module:
    """A Llama of ``size``, random init, seed 0."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=size["ffn"],
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"], max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def clock() -> float:
    """CPU time of this thread on one torch thread (other programs do not stretch it, as
    ``target_latency``'s table is timed), else wall time."""
    return time.thread_time() if torch.get_num_threads() == 1 else time.perf_counter()


def forward_seconds(model: nn.Module, ids: Tensor, repeats: int) -> float:
    """The median time of ``repeats`` forwards of ``model`` on ``ids`` (one untimed first)."""
    times = []
    with torch.no_grad():
        model(ids)
        for _ in range(repeats):
            begun = clock()
            model(ids)
            times.append(clock() - begun)
    return statistics.median(times)


def measured_fraction(dense: nn.Module, shrunk: nn.Module, ids: Tensor, rounds: int) -> float:
    """The median over ``rounds`` of the shrunk model's forward time over the dense one's,
    timed in turns (the order swapped every round)."""
    ratios = []
    for index in range(rounds):
        pair = [dense, shrunk] if index % 2 == 0 else [shrunk, dense]
        times = {id(model): forward_seconds(model, ids, 3) for model in pair}
        ratios.append(times[id(shrunk)] / times[id(dense)])
    return statistics.median(ratios)


def run_case(
    dense: nn.Module, structure: Any, fraction: float, ids: Tensor, args: argparse.Namespace
) -> dict[str, Any]:
    """One structure at one budget: the estimate, then the shrunk model timed."""
    model = copy.deepcopy(dense)
    budget = LatencyBudget(fraction, example_inputs=ids, repeats=args.repeats)
    try:
        pruner = prune_one_shot(
            model, [ids], target_latency=budget, structure=structure, importance="magnitude"
        )
    except ValueError as error:
        least = re.search(r"at least (\d\.\d+)", str(error))
        return {"reachable": False, "least": float(least.group(1)) if least else None}
    line = pruner.budget_report()["target_latency"]
    units = pruner.pruned_count()
    shrink(model)
    measured = measured_fraction(dense, model, ids, args.rounds)
    return {
        "reachable": True,
        "units": units,
        "estimated": line.fraction,
        "measured": measured,
        "ratio": measured / line.fraction,
        "dense_seconds": line.before,
    }


def table(results: dict[str, Any]) -> str:
    """The Markdown table of ``results``."""
    setup, record = results["setup"], results["machine"]
    shape = "x".join(str(size) for size in setup["input_shape"])
    caption = (
        f"Estimated against measured latency of shrunk models: a Llama of "
        f"{results['params'] / 1e6:.1f}M parameters, a forward of {shape} tokens on the CPU, "
        f"{setup['threads']} thread(s); measured: median of {setup['rounds']} rounds of shrunk "
        f"over dense. {other_work(record['load'], record['cpus'])}"
    )
    lines = [
        "| structure | budget | estimated | measured | measured / estimated |",
        "|---|---|---|---|---|",
    ]  # fmt: skip
    for row in results["rows"]:
        budget = f"{row['budget']:.0%}"
        if not row["reachable"]:
            least = "" if row["least"] is None else f" (least {row['least']:.2f})"
            lines.append(f"| {row['structure']} | {budget} | unreachable{least} | - | - |")
            continue
        lines.append(
            f"| {row['structure']} | {budget} | {row['estimated']:.3f} | {row['measured']:.3f} "
            f"| {row['ratio']:.2f} |"
        )
    return "\n".join([*lines, "", caption.rstrip()]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model: the smoke test")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10, help="forwards per table time")
    parser.add_argument("--rounds", type=int, default=7, help="dense/shrunk turns per case")
    parser.add_argument(
        "--budgets",
        type=float,
        nargs="+",
        default=None,
        help="fractions of the dense latency (default 0.75 0.5; --tiny 0.95)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    if args.tiny:
        args.repeats, args.rounds = 3, 3
    if args.budgets is None:  # a tiny model's fixed work per forward leaves little to remove
        args.budgets = [0.95] if args.tiny else [0.75, 0.5]
    torch.set_num_threads(args.threads)
    size = TINY if args.tiny else FULL
    dense = llama(size)
    ids = torch.randint(0, size["vocab"], (1, 32 if args.tiny else 128),
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    rows = []
    for label, structure in STRUCTURES:
        for fraction in args.budgets:
            found = run_case(dense, structure, fraction, ids, args)
            rows.append({"structure": label, "budget": fraction, **found})
            print(rows[-1], flush=True)
    results = {
        "setup": {
            "model": size, "input_shape": list(ids.shape), "threads": args.threads,
            "repeats": args.repeats, "rounds": args.rounds, "budgets": args.budgets,
        },
        "params": sum(p.numel() for p in dense.parameters()),
        "machine": machine("cpus", "threads", "load", "torch", "transformers"),
        "rows": rows,
    }  # fmt: skip
    markdown = table(results)
    write_results(args.out, "latency", results, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
