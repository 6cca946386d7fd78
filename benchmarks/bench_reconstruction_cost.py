"""What reconstruction costs: time and peak memory of ``prune_one_shot`` on a 100M Llama.

Run (about 30 minutes on one thread of a loaded 2-core CPU)::

    python benchmarks/bench_reconstruction_cost.py          # the table of docs/one_shot.rst
    python benchmarks/bench_reconstruction_cost.py --tiny   # seconds: what the slow test runs
    python benchmarks/bench_reconstruction_cost.py --runs magnitude:4,8 wanda:4,8

The model is ``bench_structured_speed.py``'s Llama (``LlamaForCausalLM`` from a ``LlamaConfig``,
random init: hidden 768, 12 layers, 12 query and 4 key/value heads, an FFN of 2,048, a vocabulary
of 32,000 tied to the output head: 100,092,672 parameters) in float32. ``prune_one_shot`` removes
20% of its parameters (``target_params=0.8``, FFN channels and heads together,
``structure=("channel", "head")``, lean masks), once without and once with
``reconstruct=True``, by magnitude or Wanda, after calibration on 4 to 32 random sequences
of 256 tokens (batches of 4; ``--runs``). Reconstruction re-solves the ``o_proj`` and
``down_proj`` of every block, each after running the calibration batches through the dense copy
and the pruned model up to it: its time grows with the tokens and with the square of the depth.

Each configuration runs in a fresh process, on one thread (``torch.set_num_threads(1)``), after
a warm-up on a tiny Llama: the wall time of the call, the process's CPU time during it (which
does not grow while other processes hold the cores of a shared machine), and its peak resident
memory above what the process held before the call (the model and the batches built): the
kernel's own peak (``VmHWM``, reset just before the call through ``/proc/self/clear_refs``).
CPU milliseconds per token show whether the time is linear in the calibration tokens; the line
through the two largest sizes measured extrapolates to the 64 sequences of 256 tokens a
calibration set often has (labelled as such: not measured).

Results go to ``benchmarks/results/reconstruction_cost.json`` and ``.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.append(str(Path(__file__).resolve().parent))

from bench_structured_speed import FULL, TINY, Size, build_llama
from harness import (
    PeakMemory,
    counted,
    cpu_seconds,
    machine,
    other_work,
    worker_json,
    write_results,
)

from tensorplay.ao.pruning import prune_one_shot, shrink
from tensorplay.ao.pruning.structured.units.budget import model_params

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 256  # per calibration sequence
BATCH = 4  # sequences per calibration batch
# Sequences of calibration per importance, smallest first. 32 sequences only by magnitude: there
# reconstruction takes about 5 CPU-minutes on one thread, and Wanda's calibration adds little.
RUNS = ("magnitude:4,8,16,32", "wanda:4,8,16")
ASKED = 64  # sequences of 256 tokens: the calibration set the cost is extrapolated to
KEPT = 0.8


def batches(size: Size, sequences: int) -> list[torch.Tensor]:
    """``sequences`` random sequences of :data:`TOKENS` token ids in batches of :data:`BATCH`
    (seeded)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(size.vocab, (sequences, TOKENS), generator=generator)
    return [ids[first : first + BATCH] for first in range(0, sequences, BATCH)]


def prune(model: Any, data: list[torch.Tensor], importance: str, reconstruct: bool) -> None:
    """One ``prune_one_shot`` to :data:`KEPT` of the parameters, channels and heads."""
    prune_one_shot(
        model, data, target_params=KEPT, importance=importance, structure=("channel", "head"),
        reconstruct=reconstruct, masking="inplace",
    )  # fmt: skip


def worker(importance: str, reconstruct: bool, sequences: int, tiny: bool) -> dict[str, Any]:
    """Time and peak memory of one call (run in a fresh process)."""
    torch.set_num_threads(1)
    prune(build_llama(TINY), batches(TINY, 2), importance, reconstruct)  # warm-up
    size = TINY if tiny else FULL
    model = build_llama(size)
    params = model_params(model)
    data = batches(size, sequences)
    with PeakMemory() as memory:
        started, cpu = time.perf_counter(), cpu_seconds()
        prune(model, data, importance, reconstruct)
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    shrink(model)  # what was removed, counted
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "peak_bytes": memory.peak - memory.before,
        "peak_bytes_per_param": (memory.peak - memory.before) / params,
        "params": params,
        "params_after": model_params(model),
        "tokens": sequences * TOKENS,
        "threads": torch.get_num_threads(),
        "peak_measured_by": memory.measured_by,
    }


def runs(plan: Sequence[str]) -> list[tuple[str, int]]:
    """``["magnitude:4,8", "wanda:4"]`` as ``(importance, sequences)`` pairs, in order.

    Raises:
        ValueError: An item without an importance, or with a size that is not an int.

    Example:
        >>> runs(["magnitude:4,8", "wanda:4"])
        [('magnitude', 4), ('magnitude', 8), ('wanda', 4)]
    """
    pairs = []
    for item in plan:
        importance, _, sizes = item.partition(":")
        if not importance or not sizes:
            raise ValueError(f"Expected `--runs` items like 'magnitude:4,8', but got {item!r}.")
        pairs += [(importance, int(size)) for size in sizes.split(",")]
    return pairs


def measure_row(importance: str, sequences: int, tiny: bool) -> dict[str, Any]:
    """One calibration size without and with reconstruction, each in a fresh process."""
    row: dict[str, Any] = {"importance": importance, "sequences": sequences}
    for label, flag in (("plain", False), ("reconstructed", True)):
        worker_args = ["--worker", importance, str(flag), str(sequences)]
        row[label] = worker_json(__file__, *worker_args, *(["--tiny"] * tiny))
        print(f"{importance} {sequences}x{TOKENS} {label}: {row[label]}", flush=True)
    for key in ("seconds", "cpu_seconds", "peak_bytes"):
        row[f"{key}_ratio"] = row["reconstructed"][key] / row["plain"][key]
    row["load"] = os.getloadavg()[0]  # the machine's 1-minute load when the row was done
    return row


def measured(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The rows an earlier run wrote to ``path``, by importance and size (none if no file)."""
    if not path.is_file():
        return {}
    rows = json.loads(path.read_text())["rows"]
    return {(row["importance"], row["sequences"]): row for row in rows}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every configuration, each in a fresh process; the results are written after each row
    (a run stopped early keeps the rows it measured, and ``--resume`` takes them up)."""
    result: dict[str, Any] = {
        "rows": [],
        "setup": {
            "model": (TINY if args.tiny else FULL)._asdict(),
            "target_params": KEPT,
            "tokens_per_sequence": TOKENS,
            "batch": BATCH,
            "asked_sequences": ASKED,
            "dtype": "float32",
            "masking": "inplace",
        },
        "machine": machine("cpus", "load", "memory_gib", "torch", "transformers"),
    }
    done = measured(args.out / "reconstruction_cost.json") if args.resume else {}
    for importance, sequences in runs(args.runs):
        row = done.get((importance, sequences)) or measure_row(importance, sequences, args.tiny)
        result["rows"].append(row)
        result["setup"].update(params=row["plain"]["params"], threads=row["plain"]["threads"])
        write_results(args.out, "reconstruction_cost", result, tables(result))
    return result


def _row(row: dict[str, Any], params: int) -> str:
    plain, solved = row["plain"], row["reconstructed"]
    per_token = [1e3 * run["cpu_seconds"] / run["tokens"] for run in (plain, solved)]
    return (
        f"| {row['importance']} | {row['sequences']} x {TOKENS} | {plain['seconds']:.1f} | "
        f"{solved['seconds']:.1f} | {plain['cpu_seconds']:.1f} | {solved['cpu_seconds']:.1f} | "
        f"{row['cpu_seconds_ratio']:.1f} | {per_token[0]:.1f} / {per_token[1]:.1f} | "
        f"{plain['peak_bytes'] / params:.2f} | {solved['peak_bytes'] / params:.2f} | "
        f"{row['peak_bytes_ratio']:.2f} |"
    )


def extrapolated(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """CPU seconds at :data:`ASKED` sequences per importance, plain and reconstructed (not
    measured): the line through the two largest sizes measured (a fixed cost plus a cost per
    token), or the cost per token of the one size."""
    tokens = ASKED * TOKENS
    guesses: dict[str, dict[str, float]] = {}
    for importance in dict.fromkeys(row["importance"] for row in result["rows"]):
        rows = sorted(
            (row for row in result["rows"] if row["importance"] == importance),
            key=lambda row: row["sequences"],
        )[-2:]
        guesses[importance] = {}
        for label in ("plain", "reconstructed"):
            runs = [row[label] for row in rows]
            if len(runs) == 1:
                guess = runs[0]["cpu_seconds"] / runs[0]["tokens"] * tokens
            else:
                slope = (runs[1]["cpu_seconds"] - runs[0]["cpu_seconds"]) / (
                    runs[1]["tokens"] - runs[0]["tokens"]
                )
                guess = runs[1]["cpu_seconds"] + slope * (tokens - runs[1]["tokens"])
            guesses[importance][label] = guess
    return guesses


def tables(result: dict[str, Any]) -> str:
    """The Markdown table, its extrapolation and its caption."""
    setup = result["setup"]
    params = setup["params"]
    model = setup["model"]
    guesses = "; ".join(
        f"{importance}: {guess['plain'] / 60:.1f} min plain, "
        f"{guess['reconstructed'] / 60:.1f} min reconstructed"
        for importance, guess in extrapolated(result).items()
    )
    lines = [
        "| importance | calibration | plain (s) | reconstructed (s) | plain CPU (s) "
        "| reconstructed CPU (s) | ratio | CPU ms per token | plain peak (B/param) "
        "| reconstructed peak (B/param) | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_row(row, params) for row in result["rows"]),
        "",
        f"Extrapolated, not measured: the CPU time at {ASKED} x {TOKENS} calibration tokens, "
        f"on the line through the two largest sizes measured: {guesses}.",
        "",
        f"`prune_one_shot(target_params={setup['target_params']}, "
        'structure=("channel", "head"))` on a random-init Llama of '
        f"{params:,} parameters in {setup['dtype']} (hidden {model['hidden']}, "
        f"{model['layers']} layers, {model['heads']} query / {model['kv_heads']} key-value heads, "
        f"FFN {model['intermediate']}, vocabulary {model['vocab']:,} tied), without and with "
        "`reconstruct=True`; calibration: sequences x tokens, in batches of "
        f"{setup['batch']}; each configuration in a fresh process on "
        f"{counted(setup['threads'], 'thread')}; ratio: reconstructed / plain (CPU time; peak "
        "memory above the model and batches, read from the kernel's `VmHWM`). Measured by "
        f"`benchmarks/bench_reconstruction_cost.py` on {result['machine']['cpus']} CPU cores.",
    ]
    if noisy := other_work(result["machine"]["load"], result["machine"]["cpus"]):
        lines[-1] += f" {noisy} Read the CPU times: the wall times include the other programs'."
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama: seconds")
    parser.add_argument(
        "--runs", nargs="+", default=list(RUNS), help="importance:sequences,... in order"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--resume", action="store_true", help="keep the rows of --runs already in --out"
    )
    parser.add_argument("--worker", nargs=3, metavar=("IMPORTANCE", "RECONSTRUCT", "SEQUENCES"))
    args = parser.parse_args(argv)
    if args.worker:
        importance, flag, sequences = args.worker
        print(json.dumps(worker(importance, flag == "True", int(sequences), args.tiny)))
        return None
    if args.tiny:
        args.runs = ["magnitude:1,2"]
    result = measure(args)
    print(tables(result))
    return result


if __name__ == "__main__":
    main()
