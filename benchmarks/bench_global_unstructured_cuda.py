"""``global_unstructured`` on a GPU: tensorplay against ``torch.nn.utils.prune`` (fp32).

Run on a machine with a CUDA device (it prints a note and exits 0 without one)::

    python benchmarks/bench_global_unstructured_cuda.py                  # 50M, 200M, 1B
    python benchmarks/bench_global_unstructured_cuda.py --sizes 50M --repeats 3 --no-torch

For each size: the first call and a second (iterative) call, medians of ``--repeats`` runs on
fresh models, timed with ``torch.cuda.synchronize``; the extra memory is
``torch.cuda.max_memory_allocated`` during the call minus the memory allocated before it, per
parameter; the read pass is one ``sum`` over every weight. torch is skipped where its
concatenations would not fit (about 47 bytes/param) or past 2**31 elements, where its ``topk``
fails. Results go to ``benchmarks/results/global_unstructured_cuda.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import parse_size, write_results

RESULTS = Path(__file__).resolve().parent / "results"


def build(params: int) -> list[nn.Linear]:
    d = 1024 if params < 500e6 else 2048
    layers = []
    for i in range(max(1, round(params / (4 * d * d)))):
        shape = (4 * d, d) if i % 2 == 0 else (d, 4 * d)
        layer = nn.utils.skip_init(nn.Linear, shape[1], shape[0], bias=False, device="cuda")
        with torch.no_grad():
            layer.weight.normal_()
        layers.append(layer)
    return layers


def one_run(library: str, params: int, call: str) -> dict[str, float]:
    import torch.nn.utils.prune as torch_prune

    import tensorplay.ao.pruning as tp_prune

    prune: Any = tp_prune if library == "tensorplay" else torch_prune
    torch.manual_seed(0)
    layers = build(params)
    pairs = [(layer, "weight") for layer in layers]
    total = sum(layer.weight.numel() for layer in layers)
    if call == "second":
        prune.global_unstructured(pairs, prune.L1Unstructured, amount=0.5)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for layer in layers:
        layer.weight.sum()
    torch.cuda.synchronize()
    read = time.perf_counter() - start
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    prune.global_unstructured(pairs, prune.L1Unstructured, amount=0.5)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    extra = (torch.cuda.max_memory_allocated() - base) / total
    del layers, pairs
    torch.cuda.empty_cache()
    return {"seconds": seconds, "extra_bytes_per_param": extra, "read_pass_seconds": read}


def measure(library: str, params: int, call: str, repeats: int) -> dict[str, Any]:
    one_run(library, min(params, 10_000_000), call)  # warm-up: CUDA context, kernels
    runs = [one_run(library, params, call) for _ in range(repeats)]
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="50M,200M,1B")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-torch", dest="torch", action="store_false")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("No CUDA device: nothing to measure (run this on a machine with a GPU).")
        return
    free, _ = torch.cuda.mem_get_info()
    rows = []
    for text in args.sizes.split(","):
        params = parse_size(text)
        for call in ("first", "second"):
            row: dict[str, Any] = {"size": text, "call": call}
            row["tensorplay"] = measure("tensorplay", params, call, args.repeats)
            fits = params * 60 < free and params < 2**31
            if args.torch and fits:
                row["torch"] = measure("torch", params, call, args.repeats)
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = [
        f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, fp32, amount 0.5",
        "",
        "| params | call | torch (s) | tensorplay (s) | speed-up | torch extra B/param "
        "| tensorplay extra B/param | read pass (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ours, theirs = row["tensorplay"], row.get("torch")
        t_time = f"{theirs['seconds']:.3f}" if theirs else "—"
        ratio = f"{theirs['seconds'] / ours['seconds']:.1f}x" if theirs else "—"
        t_mem = f"{theirs['extra_bytes_per_param']:.1f}" if theirs else "—"
        lines.append(
            f"| {row['size']} | {row['call']} | {t_time} | {ours['seconds']:.3f} | {ratio} "
            f"| {t_mem} | {ours['extra_bytes_per_param']:.2f} | {ours['read_pass_seconds']:.4f} |"
        )
    table = "\n".join(lines) + "\n"
    write_results(args.out, "global_unstructured_cuda", rows, table)
    print(table)


if __name__ == "__main__":
    main()
