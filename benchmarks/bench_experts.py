"""Expert pruning: what dropping a quarter or half of a mixture-of-experts model's experts costs.

Run (about 80 minutes on 2 shared CPU cores under a load of 5 to 8, about 25 per seed)::

    python benchmarks/bench_experts.py            # the tables of docs/experts.rst
    python benchmarks/bench_experts.py --seeds 1  # one seed: a third of the time
    python benchmarks/bench_experts.py --tiny     # one seed, a few steps: what the slow test runs

The model is a byte-level Qwen3-MoE (transformers ``Qwen3MoeConfig``: 2 layers, width 64, 4
query heads of 16 sharing 2 key/value heads, 8 experts of 64 channels per layer, 2 chosen per
token) trained from random init on the LM example's data (``examples/lm/byte_text.py``: windows
of 64 bytes of Python's help text, ``pydoc_data.topics``) for ``--steps`` AdamW steps. Then, each
on a fresh copy, ``prune_one_shot(model, batches, s, structure="expert", importance=X)`` removes
25% or 50% of the experts of every layer (``scope="layerwise"``, the default for experts) after a
calibration pass over ``--calibration`` training windows, for X in ``reap``, ``frequency``,
``magnitude`` and ``random`` (``importance="magnitude", method="random_unstructured"``: a draw
seeded by the run's seed; the pruner refuses ``"random"`` as an importance). Each pruned copy is
shrunk and scored by its perplexity per byte on the first ``--val-windows`` held-out windows
(the last 10% of the text), once as pruned and once after ``--recovery`` steps of fine-tuning
with ``Distillation`` from the dense model. Seeds (``--seeds``, 3 by default) repeat everything,
the dense training included; each cell of the table is the mean over seeds with its range
(min-max), and a line counts the seeds in which REAP scores below frequency at each ratio.
The dense model is trained 600 steps (250 leave it far from converged, so recovery mostly went
on training it); it is still not converged, so the recovered copies can end below it.

A second table measures the shrunk models against the dense one: parameters, the
``save_pretrained`` folder's size, the CPU time of a forward over 4 x 128 tokens (prefill) and of
cached greedy generation of 32 tokens at batch 1, as medians over rounds timed in turns.

Results go to ``benchmarks/results/experts.json`` and ``.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# The LM example's data and training loop; the benchmarks' harness.
sys.path.append(str(Path(__file__).resolve().parents[1] / "examples" / "lm"))
sys.path.append(str(Path(__file__).resolve().parent))

import transformers
from byte_text import load_bytes, shuffled_batches, split_windows, val_batches
from gpt_bytes import perplexity, train
from harness import counted, in_turns, machine, median_ratios, write_results

from tensorplay.ao.pruning import Distillation, prune_one_shot, shrink

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 64
BATCH = 16
LR = 2e-3
MODEL: dict[str, Any] = {
    "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 64,
    "intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2,
    "norm_topk_prob": True, "max_position_embeddings": 256, "tie_word_embeddings": False,
    "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
}  # fmt: skip
RATIOS = (0.25, 0.5)
METHODS = ("reap", "frequency", "magnitude", "random")
PRETRAIN_STEPS = 600
RECOVERY_STEPS = 150
SEEDS = 3
CALIBRATION_WINDOWS = 64
VAL_WINDOWS = 128
DISTILL = {"temperature": 2.0, "weight": 1.0}


def dense_model(seed: int, steps: int) -> nn.Module:
    """A Qwen3-MoE of :data:`MODEL` trained ``steps`` steps from the init of ``seed``."""
    torch.manual_seed(seed)
    net = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**MODEL))
    train_windows, _ = split_windows(load_bytes(), CONTEXT)
    train(net, shuffled_batches(train_windows, BATCH, seed), steps, lr=LR)  # type: ignore[arg-type]
    module: nn.Module = net
    return module.eval()


def calibration(windows: int, seed: int) -> list[Tensor]:
    """``windows`` training windows in batches of 8 (seeded), inputs only."""
    train_windows, _ = split_windows(load_bytes(), CONTEXT)
    stream = shuffled_batches(train_windows, 8, seed=12345 + seed)
    return [next(stream)[:, :-1] for _ in range(max(1, windows // 8))]


def pruned(
    base: nn.Module, batches: list[Tensor], ratio: float, method: str, seed: int, recovery: int
) -> nn.Module:
    """A shrunk copy of ``base`` without ``ratio`` of its experts (ranked by ``method``), then
    fine-tuned ``recovery`` steps with distillation from ``base`` (none if 0)."""
    net = copy.deepcopy(base)
    # Attached before pruning: the teacher is the dense model.
    distill = Distillation(**DISTILL).attach(net) if recovery else None  # type: ignore[arg-type]
    torch.manual_seed(seed)
    if method == "random":
        options: dict[str, Any] = {"importance": "magnitude", "method": "random_unstructured"}
    else:
        options = {"importance": method}
    prune_one_shot(net, batches, ratio, structure="expert", **options)
    shrink(net)
    if distill is not None:
        train_windows, _ = split_windows(load_bytes(), CONTEXT)
        batches_iter = shuffled_batches(train_windows, BATCH, 1000 + seed)
        train(net, batches_iter, recovery, distill=distill, lr=LR / 2)  # type: ignore[arg-type]
        distill.detach()
    return net.eval()


def measure_accuracy(args: argparse.Namespace) -> tuple[dict[str, Any], nn.Module]:
    """Every cell of the perplexity table, per seed; and the dense model of seed 0."""
    _, val_windows = split_windows(load_bytes(), CONTEXT)
    val = val_batches(val_windows, args.val_windows)
    dense: list[float] = []
    cells: dict[str, dict[str, list[float]]] = {}
    models: list[nn.Module] = []
    for seed in range(args.seeds):
        started = time.perf_counter()
        base = dense_model(seed, args.steps)
        models.append(base)
        dense.append(perplexity(base, val))  # type: ignore[arg-type]
        seconds = time.perf_counter() - started
        print(f"seed {seed}: dense {dense[-1]:.3f} ({seconds:.0f} s)", flush=True)
        batches = calibration(args.calibration, seed)
        for ratio in args.ratios:
            for method in METHODS:
                cell = cells.setdefault(f"{method}@{ratio}", {"oneshot": [], "recovered": []})
                for label, steps in (("oneshot", 0), ("recovered", args.recovery)):
                    net = pruned(base, batches, ratio, method, seed, steps)
                    cell[label].append(perplexity(net, val))  # type: ignore[arg-type]
                print(f"  {method} {ratio:.0%}: {cell['oneshot'][-1]:.3f} "
                      f"-> {cell['recovered'][-1]:.3f}", flush=True)  # fmt: skip
    dense_mean = statistics.mean(dense)
    rows = []
    for key, cell in cells.items():
        method, ratio = key.split("@")
        row: dict[str, Any] = {"method": method, "ratio": float(ratio)}
        for label, values in cell.items():
            row[label] = statistics.mean(values)
            row[f"{label}_min"], row[f"{label}_max"] = min(values), max(values)
            row[f"{label}_seeds"] = values
            row[f"{label}_vs_dense"] = row[label] / dense_mean
        rows.append(row)
    result = {"dense": dense_mean, "dense_seeds": dense, "rows": rows}
    result["reap_ahead"] = reap_ahead(rows)
    return result, models[0]


def seeds_ahead(first: Sequence[float], second: Sequence[float]) -> int:
    """How many seeds give ``first`` a lower perplexity than ``second`` (seed by seed).

    Example:
        >>> seeds_ahead([8.0, 9.0, 7.0], [8.5, 8.0, 7.5])
        2
    """
    if len(first) != len(second):
        raise ValueError(f"Expected as many seeds in both, but got {len(first)} and {len(second)}.")
    return sum(a < b for a, b in zip(first, second, strict=True))


def reap_ahead(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per ratio: the seeds in which REAP beats frequency, one-shot and recovered.

    Example:
        >>> rows = [
        ...     {"method": "reap", "ratio": 0.5, "oneshot_seeds": [9.0, 8.0],
        ...      "recovered_seeds": [7.0, 7.1]},
        ...     {"method": "frequency", "ratio": 0.5, "oneshot_seeds": [8.0, 8.5],
        ...      "recovered_seeds": [7.2, 7.3]},
        ... ]
        >>> reap_ahead(rows)
        [{'ratio': 0.5, 'seeds': 2, 'oneshot': 1, 'recovered': 2}]
    """
    by_cell = {(row["method"], row["ratio"]): row for row in rows}
    counts = []
    for ratio in sorted({row["ratio"] for row in rows}):
        reap, frequency = by_cell[("reap", ratio)], by_cell[("frequency", ratio)]
        count: dict[str, Any] = {"ratio": ratio, "seeds": len(reap["oneshot_seeds"])}
        for label in ("oneshot", "recovered"):
            count[label] = seeds_ahead(reap[f"{label}_seeds"], frequency[f"{label}_seeds"])
        counts.append(count)
    return counts


def spread(row: dict[str, Any], label: str) -> str:
    """The cell of ``row``'s ``label``: the mean over seeds and, with several, their range.

    Example:
        >>> spread({"oneshot": 8.5, "oneshot_min": 8.25, "oneshot_max": 8.75}, "oneshot")
        '8.500 (8.250-8.750)'
        >>> spread({"oneshot": 8.5, "oneshot_min": 8.5, "oneshot_max": 8.5}, "oneshot")
        '8.500'
    """
    low, high = row[f"{label}_min"], row[f"{label}_max"]
    mean = f"{row[label]:.3f}"
    return mean if low == high else f"{mean} ({low:.3f}-{high:.3f})"


def folder_bytes(net: nn.Module) -> int:
    """The size of ``net.save_pretrained``'s folder (safetensors and config)."""
    with tempfile.TemporaryDirectory() as folder:
        net.save_pretrained(folder)  # type: ignore[operator]
        return sum(path.stat().st_size for path in Path(folder).iterdir())


def measure_size_speed(base: nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    """Parameters, folder size and forward times of ``base`` and its shrunk copies."""
    batches = calibration(args.calibration, 0)
    nets = {"dense": base}
    for ratio in args.ratios:
        nets[f"{ratio:.0%}"] = pruned(base, batches, ratio, "reap", 0, 0)
    generator = torch.Generator().manual_seed(0)
    prefill = torch.randint(0, 256, (4, args.prefill), generator=generator)
    prompt = torch.randint(0, 256, (1, 8), generator=generator)

    def forward(net: nn.Module) -> None:
        with torch.no_grad():
            net(prefill)

    def decode(net: nn.Module) -> None:
        with torch.no_grad():
            net.generate(  # type: ignore[operator]
                prompt, max_new_tokens=args.decode, min_new_tokens=args.decode,
                do_sample=False, use_cache=True,
            )  # fmt: skip

    times = {
        "prefill": in_turns({n: partial(forward, net) for n, net in nets.items()}, args.rounds, 2),
        "decode": in_turns({n: partial(decode, net) for n, net in nets.items()}, args.rounds, 1),
    }
    ratios = {kind: median_ratios(t, "dense") for kind, t in times.items()}
    rows: list[dict[str, Any]] = []
    for name, net in nets.items():
        params = sum(p.numel() for p in net.parameters())
        rows.append({
            "model": name,
            "experts": net.config.num_experts,  # type: ignore[union-attr]
            "params": params,
            "folder_bytes": folder_bytes(net),
            "prefill_ms": 1000 * statistics.median(times["prefill"][name]),
            "decode_ms": 1000 * statistics.median(times["decode"][name]),
            "prefill_ratio": ratios["prefill"][name],
            "decode_ratio": ratios["decode"][name],
        })  # fmt: skip
    dense = rows[0]
    for row in rows:
        row["params_ratio"] = row["params"] / dense["params"]
        row["folder_ratio"] = row["folder_bytes"] / dense["folder_bytes"]
    return {"rows": rows, "prefill_tokens": [4, args.prefill], "decode_tokens": args.decode}


def tables(result: dict[str, Any]) -> str:
    """The Markdown tables, with their captions."""
    setup = result["setup"]
    lines = [
        f"Perplexity per byte of a {setup['pretrain_steps']}-step byte-level Qwen3-MoE "
        f"(2 layers, 8 experts, top-2; dense: {result['dense']:.3f}) after removing experts "
        f"one-shot (layerwise), as pruned and after {setup['recovery_steps']} steps of "
        f"distillation from the dense model; mean of {counted(setup['seeds'], 'seed')} "
        f"(min-max over seeds), ratio of the means to dense (dense per seed: "
        f"{', '.join(f'{d:.3f}' for d in result['dense_seeds'])}).",
        "",
        "| experts removed | importance | one-shot | vs dense | recovered | vs dense |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['ratio']:.0%} | {row['method']} | {spread(row, 'oneshot')} | "
            f"{row['oneshot_vs_dense']:.2f} | {spread(row, 'recovered')} | "
            f"{row['recovered_vs_dense']:.2f} |"
        )
    ahead = "; ".join(
        f"at {count['ratio']:.0%}, {count['oneshot']} of {count['seeds']} one-shot and "
        f"{count['recovered']} of {count['seeds']} recovered"
        for count in result["reap_ahead"]
    )
    lines += ["", f"Seeds in which REAP scores below frequency (lower perplexity): {ahead}."]
    speed = result["size_speed"]
    lines += [
        "",
        f"Shrunk against dense (REAP, layerwise): prefill of {speed['prefill_tokens'][0]} x "
        f"{speed['prefill_tokens'][1]} tokens, cached greedy decoding of "
        f"{speed['decode_tokens']} tokens at batch 1; CPU, medians over rounds in turns.",
        "",
        "| model | experts | params | ratio | folder KiB | ratio | prefill ms | ratio | "
        "decode ms | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in speed["rows"]:
        lines.append(
            f"| {row['model']} | {row['experts']} | {row['params']:,} | "
            f"{row['params_ratio']:.2f} | {row['folder_bytes'] / 1024:,.0f} | "
            f"{row['folder_ratio']:.2f} | {row['prefill_ms']:.1f} | {row['prefill_ratio']:.2f} | "
            f"{row['decode_ms']:.1f} | {row['decode_ratio']:.2f} |"
        )
    lines += ["", "Measured by `benchmarks/bench_experts.py` on the CPU."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few steps and windows: seconds")
    parser.add_argument("--seeds", type=int, help=f"seeds 0..N-1 (default {SEEDS}; --tiny: 1)")
    parser.add_argument("--steps", type=int, default=PRETRAIN_STEPS, help="dense training steps")
    parser.add_argument("--recovery", type=int, default=RECOVERY_STEPS, help="distillation steps")
    parser.add_argument("--calibration", type=int, default=CALIBRATION_WINDOWS, help="windows")
    parser.add_argument("--val-windows", type=int, default=VAL_WINDOWS)
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    args.ratios, args.prefill, args.decode = RATIOS, 128, 32
    if args.seeds is None:
        args.seeds = 1 if args.tiny else SEEDS
    if args.tiny:
        args.steps, args.recovery, args.calibration, args.val_windows = 4, 2, 8, 8
        args.rounds, args.prefill, args.decode = 1, 16, 4
    result, base = measure_accuracy(args)
    result["size_speed"] = measure_size_speed(base, args)
    result["setup"] = {
        "pretrain_steps": args.steps, "recovery_steps": args.recovery, "seeds": args.seeds,
        "calibration_windows": args.calibration, "val_windows": args.val_windows,
        "model": MODEL, "scope": "layerwise",
    }  # fmt: skip
    result["machine"] = machine("cpus", "threads", "load", "torch", "transformers")
    table = tables(result)
    print(table)
    write_results(args.out, "experts", result, table)
    return result


if __name__ == "__main__":
    main()
