"""Shrinking a sharded run: memory and time of gathering on rank 0, against shrinking in place.

Run (about two minutes on a 2-core machine)::

    python benchmarks/bench_gathered_shrink.py           # a ~124M-parameter Llama, fp32
    python benchmarks/bench_gathered_shrink.py --tiny    # a few MB, seconds

The same Llama-style model (hidden 768, 12 layers, FFN 2048, 12 heads, 4 KV heads, vocabulary
32,000; random weights, float32) has half of every layer's FFN channels masked
(``structure="channel"``, ``scope="layerwise"``, lean masks), then:

* **2 processes** (gloo on this machine, ``fully_shard`` per decoder layer and at the root, built
  on the meta device so no rank ever holds the whole model before the step measured):
  :func:`~tensorplay.ao.pruning.save_shrunk` gathers the model on rank 0 to the CPU, shrinks
  the copy there and writes the folder;
* **1 process**: :func:`~tensorplay.ao.pruning.shrink` on the unsharded model, in place, then
  ``save_pretrained`` (the reference).

Reported per rank: the peak resident memory during the step above the resident memory just
before it (``harness.PeakMemory``: the kernel's ``VmHWM`` on Linux), in MB and
in bytes per parameter of the model, and the seconds the step took (the slowest rank). The
2-process folder is checked to equal the 1-process one (same keys and shapes). CPU timings on a
shared machine: read the memory columns, not the seconds. Results go to
``benchmarks/results/gathered_shrink.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import PeakMemory, machine, write_results

RESULTS = Path(__file__).resolve().parent / "results"
FULL = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
}


def _config(sizes: dict[str, int]) -> Any:
    import transformers

    return transformers.LlamaConfig(**sizes, tie_word_embeddings=False)


def _build(sizes: dict[str, int], shard: bool) -> Any:
    """The model with random weights; sharded ones built on meta, then each rank's shards."""
    import transformers
    from torch.distributed.fsdp import fully_shard

    config = _config(sizes)
    if not shard:
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(config)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(torch.distributed.get_rank())
    with torch.no_grad():
        for param in model.parameters():
            param.to_local().normal_(0.0, 0.02, generator=generator)
    return model


def _prune(model: Any) -> None:
    from tensorplay.ao.pruning import Pruner
    from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule

    pruner = Pruner(
        model, OneShotSchedule(0.5), structure="channel", scope="layerwise", masking="inplace"
    )
    pruner.step(0)


def run_rank(rank: int, world: int, port: int, sizes: dict[str, int], out: str) -> None:
    """One rank (``world == 1``: the one-process reference): build, prune, shrink, measure."""
    import torch.distributed as dist

    from tensorplay.ao.pruning import save_shrunk, shrink

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}"
        )
    model = _build(sizes, shard=world > 1)
    params = sum(p.numel() for p in _build_meta_counts(sizes))
    _prune(model)
    folder = Path(out) / f"shrunk-{world}"
    if world > 1:
        dist.barrier()
    with PeakMemory() as memory:
        start = time.perf_counter()
        if world > 1:
            save_shrunk(model, folder)
        else:
            shrink(model)
            model.save_pretrained(folder)
        seconds = time.perf_counter() - start
    peak = memory.peak - memory.before
    record = {"rank": rank, "seconds": seconds, "peak_bytes": peak, "params": params}
    (Path(out) / f"rank{rank}-of-{world}.json").write_text(json.dumps(record))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def _build_meta_counts(sizes: dict[str, int]) -> list[torch.Tensor]:
    import transformers

    with torch.device("meta"):
        return list(transformers.LlamaForCausalLM(_config(sizes)).parameters())


def _spawn(world: int, sizes: dict[str, int], out: str) -> list[dict[str, Any]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(run_rank, args=(world, port, sizes, out), nprocs=world, start_method="spawn")
    return [json.loads((Path(out) / f"rank{r}-of-{world}.json").read_text()) for r in range(world)]


def _same_folder(a: Path, b: Path) -> bool:
    from safetensors import safe_open

    def shapes(folder: Path) -> dict[str, tuple[int, ...]]:
        with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
            return {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}  # noqa: SIM118

    return shapes(a) == shapes(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a few MB model, seconds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sizes = TINY if args.tiny else FULL
    with tempfile.TemporaryDirectory() as work:
        one = _spawn(1, sizes, work)
        two = _spawn(2, sizes, work)
        same = _same_folder(Path(work) / "shrunk-1", Path(work) / "shrunk-2")
    params = one[0]["params"]
    rows = [("1 process: shrink in place", one[0])] + [
        (f"2 processes, rank {r['rank']}: gather on rank 0", r) for r in two
    ]
    lines = [
        f"Shrinking half of the FFN channels of a {params:,}-parameter Llama (float32), "
        "peak resident memory above the moment before, per process:",
        "",
        "| run | peak above before (MB) | bytes / parameter | seconds (CPU) |",
        "|---|---|---|---|",
    ]
    for label, row in rows:
        lines.append(
            f"| {label} | {row['peak_bytes'] / 1e6:.0f} | {row['peak_bytes'] / params:.2f} | "
            f"{row['seconds']:.2f} |"
        )
    lines += ["", f"2-process folder equals the 1-process folder (keys, shapes): {same}", ""]
    table = "\n".join(lines)
    print(table)
    results = {
        "machine": machine("cpus", "load", "memory_gib", "torch", "transformers"),
        "sizes": sizes,
        "params": params,
        "one_process": one,
        "two_processes": two,
        "same_folder": same,
    }
    write_results(args.out, "gathered_shrink", results, table)


if __name__ == "__main__":
    main()
