"""Global exact selection of bf16 weights on a GPU: masks equal to the CPU's, and timings.

One short script for a machine with a CUDA device (about 5 minutes on one H200; it needs
~50 GB of GPU memory at the default sizes). CI never runs it on a GPU: its tests run the same
code on the CPU at a tiny size (``--device cpu``)::

    python benchmarks/bench_cuda_bf16.py                       # check at 200M, time 1B and 7B
    python benchmarks/bench_cuda_bf16.py --check-params 50M --sizes 1B --repeats 1
    python benchmarks/bench_cuda_bf16.py --device cpu --check-params 1M --sizes 2M --width 256

The models are ``layers x nn.Linear(width, width, bias=False)`` in bf16 on the device (``--width
4096``: 60 layers make 1.01B parameters, 417 make 7.0B), weights ``normal_(0, 0.02)`` from a
seeded generator. Pruning is one global L1 call to 50%:

* **lean**: ``Pruner(model, OneShotSchedule(0.5), masking="inplace")`` (a bool mask per weight,
  the weights zeroed in place);
* **global_unstructured**: ``tensorplay.ao.pruning.global_unstructured`` (torch's
  reparametrization: a bf16 mask and the masked weight);
* **torch**: ``torch.nn.utils.prune.global_unstructured``, where its concatenations fit in the
  free memory (about 30 bytes per parameter) and below ``2**31`` units (its ``topk`` fails past
  that).

1. **Check** (``--check-params``): the same weights pruned on the device and, copied, on the CPU;
   each mask of the device must equal the CPU's exactly (both ways to prune), and the count must
   be ``round(0.5 * parameters)``. bf16 weights are heavily tied, so this checks the tie rule
   across devices too. A mismatch prints the first tensor that differs and exits 1.
2. **Time** (``--sizes``): each way on a fresh model, medians of ``--repeats`` calls after a
   warm-up, timed with ``torch.cuda.synchronize``; the peak memory above the weights per
   parameter is ``torch.cuda.max_memory_allocated`` during the call minus the memory allocated
   before it.

Expected output on a GPU (the numbers depend on the device)::

    check at 201M bf16 parameters on cuda: lean masks equal the CPU's: True;
    global_unstructured masks equal the CPU's: True; pruned 100,663,296 of 201,326,592 (exact)
    | parameters | way | time (s) | speed-up over torch | peak above the weights (B/param) |
    | 1.01B | lean | ... | ...x | ~1.1 |
    | 1.01B | global_unstructured | ... | ...x | ~5 (a 2-byte mask and masked weight) |
    | 1.01B | torch | ... | — | ~30 |
    | 7.05B | lean | ... | — | ~1.1 |
    | 7.05B | global_unstructured | ... | — | ~5 |
    | 7.05B | torch | skipped: past 2**31 units, where its topk fails | | |

The check's line must say ``True`` twice: anything else is a bug to report. Results go to
``benchmarks/results/cuda_bf16.json`` and ``.md``.
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

from harness import parse_size, size_label, write_results

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "cuda_bf16"
SPARSITY = 0.5
WAYS = ("lean", "global_unstructured", "torch")
TORCH_BYTES_PER_PARAM = 32  # what torch's concatenations take in bf16, with some room


def build(params: int, width: int, device: str, seed: int = 0) -> nn.Sequential:
    """``layers x Linear(width, width)`` of about ``params`` bf16 parameters on ``device``."""
    layers = max(1, round(params / (width * width)))
    generator = torch.Generator(device=device).manual_seed(seed)
    model = nn.Sequential(
        *[
            nn.utils.skip_init(
                nn.Linear, width, width, bias=False, device=device, dtype=torch.bfloat16
            )
            for _ in range(layers)
        ]
    )
    with torch.no_grad():
        for layer in model:
            layer.weight.normal_(0.0, 0.02, generator=generator)
    return model


def prune(way: str, model: nn.Sequential) -> None:
    """One global L1 pruning of every weight to 50%."""
    pairs = [(layer, "weight") for layer in model]
    if way == "torch":
        import torch.nn.utils.prune as torch_prune

        torch_prune.global_unstructured(pairs, torch_prune.L1Unstructured, amount=SPARSITY)
        return
    from tensorplay.ao.pruning import L1Unstructured, OneShotSchedule, Pruner, global_unstructured

    if way == "lean":
        Pruner(model, OneShotSchedule(SPARSITY), masking="inplace").step()
    else:
        global_unstructured(pairs, L1Unstructured, amount=SPARSITY)


def masks(model: nn.Sequential) -> list[torch.Tensor]:
    """Each weight's mask, as bool on the CPU."""
    return [layer.weight_mask.bool().cpu() for layer in model]


def check(params: int, width: int, device: str) -> dict[str, Any]:
    """Prune the same weights on ``device`` and on the CPU, both ways; compare the masks."""
    found: dict[str, Any] = {}
    for way in ("lean", "global_unstructured"):
        model = build(params, width, device)
        twin = build(params, width, device).cpu()
        prune(way, model)
        prune(way, twin)
        got, want = masks(model), masks(twin)
        differs = [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if not a.equal(b)]
        total = sum(mask.numel() for mask in got)
        pruned = sum(int((~mask).sum()) for mask in got)
        found[way] = {
            "equal": not differs,
            "first_difference": differs[0] if differs else None,
            "pruned": pruned,
            "params": total,
            "exact": pruned == round(SPARSITY * total),
        }
        del model, twin
        _empty_cache(device)
    return found


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _empty_cache(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _skip_reason(way: str, params: int, device: str) -> str | None:
    """Why torch cannot run at this size, if it cannot."""
    if way != "torch":
        return None
    if params >= 2**31:
        return "past 2**31 units, where its topk fails"
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        if params * TORCH_BYTES_PER_PARAM > free:
            return f"needs ~{params * TORCH_BYTES_PER_PARAM / 2**30:.0f} GiB of GPU memory"
    return None


def one_call(way: str, params: int, width: int, device: str) -> dict[str, float | None]:
    """Time one pruning of a fresh model, and its peak memory above the weights (on a GPU)."""
    model = build(params, width, device)
    total = sum(layer.weight.numel() for layer in model)
    _synchronize(device)
    if device.startswith("cuda"):
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    prune(way, model)
    _synchronize(device)
    seconds = time.perf_counter() - start
    peak = None
    if device.startswith("cuda"):
        peak = (torch.cuda.max_memory_allocated() - base) / total
    del model
    _empty_cache(device)
    return {"seconds": seconds, "peak_bytes_per_param": peak, "params": total}


def timings(way: str, params: int, width: int, device: str, repeats: int) -> dict[str, Any]:
    reason = _skip_reason(way, params, device)
    if reason is not None:
        return {"skipped": reason}
    one_call(way, min(params, 4 * width * width), width, device)  # warm-up: context, kernels
    runs = [one_call(way, params, width, device) for _ in range(repeats)]
    peaks = [r["peak_bytes_per_param"] for r in runs if r["peak_bytes_per_param"] is not None]
    return {
        "seconds": statistics.median(r["seconds"] for r in runs if r["seconds"] is not None),
        "peak_bytes_per_param": statistics.median(peaks) if peaks else None,
        "params": runs[0]["params"],
    }


def check_line(found: dict[str, Any], device: str) -> str:
    lean, reparametrized = found["lean"], found["global_unstructured"]
    return (
        f"check at {size_label(lean['params'])} bf16 parameters on {device}: lean masks equal the "
        f"CPU's: {lean['equal']}; global_unstructured masks equal the CPU's: "
        f"{reparametrized['equal']}; pruned {lean['pruned']:,} of {lean['params']:,} "
        f"({'exact' if lean['exact'] and reparametrized['exact'] else 'WRONG COUNT'})"
    )


def markdown(results: dict[str, Any]) -> str:
    lines = [
        check_line(results["check"], results["device"]),
        "",
        "| parameters | way | time (s) | speed-up over torch | peak above the weights (B/param) |",
        "|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        theirs = row.get("torch", {})
        for way in WAYS:
            result = row[way]
            if "seconds" not in result:
                lines.append(f"| {row['size']} | {way} | {result.get('skipped')} | | |")
                continue
            ratio = "—"
            if way != "torch" and "seconds" in theirs:
                ratio = f"{theirs['seconds'] / result['seconds']:.1f}x"
            peak = result["peak_bytes_per_param"]
            shown = "—" if peak is None else f"{peak:.2f}"
            lines.append(
                f"| {size_label(result['params'])} | {way} | {result['seconds']:.3f} | {ratio} "
                f"| {shown} |"
            )
    lines += ["", f"{results['device_name']}, torch {results['torch']}, bf16, amount 0.5."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu for a dry run")
    parser.add_argument("--check-params", default="200M", help="size of the CPU comparison")
    parser.add_argument("--sizes", default="1B,7B", help="sizes timed, comma-separated")
    parser.add_argument("--width", type=int, default=4096, help="in and out features of a layer")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("No CUDA device: nothing to measure (run this on a machine with a GPU).")
        return 0
    found = check(parse_size(args.check_params), args.width, args.device)
    print(check_line(found, args.device), flush=True)
    rows = []
    for text in args.sizes.split(","):
        params = parse_size(text)
        row: dict[str, Any] = {"size": size_label(params)}
        for way in WAYS:
            row[way] = timings(way, params, args.width, args.device, args.repeats)
            print(f"  {row['size']} {way}: {json.dumps(row[way])}", flush=True)
        rows.append(row)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU (dry run)"
    results = {
        "device": args.device,
        "device_name": name,
        "torch": torch.__version__,
        "check": found,
        "rows": rows,
    }
    table = markdown(results)
    write_results(args.out, NAME, results, table)
    print(table)
    good = all(way["equal"] and way["exact"] for way in found.values())
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
