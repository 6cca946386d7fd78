"""Exact global selection over sharded tensors: 2 and 4 processes against one (CPU, gloo).

Run (about a minute on a 2-core machine)::

    python benchmarks/bench_sharded_selection.py                       # 20M units; 1, 2, 4
    python benchmarks/bench_sharded_selection.py --size 50M --processes 1,2,4 --repeats 3
    python benchmarks/bench_sharded_selection.py --quick               # 200K units

The same scores (``--sources`` fp32 matrices of about ``--size`` units in all, each generated
block of rows by block of rows from its own seeds, so a rank makes only its own rows) are
selected on by :func:`tensorplay.ao.pruning.selection.clear.clear_lowest` with global L1 keys:

* **1 process**: the full tensors, no process group (the reference);
* **n processes** (spawned, ``gloo`` over TCP on this machine): each rank holds a contiguous
  block of rows of every matrix (as FSDP2's ``Shard(0)`` does; uneven when the rows do not
  divide) with its bool keep masks, and passes them with their
  :class:`~tensorplay.ao.pruning.selection.sharding.ShardLayout` and the group.

Two calls each: the **first** clears 50% of the units, the **second** (iterative) 50% of the
rest. Reported per call: the time (the slowest rank, between two barriers), the bytes each rank
received through collectives and how many collectives it ran (from the returned
``SelectionCost``), the passes over the units, and whether the masks equal the one-process
masks (per matrix: the count and the sum of the global flat indices of the cleared units, summed
over the ranks). Each rank runs ``max(1, cpus // n)`` torch threads. With more processes than
cores the ranks share them: the time then shows the protocol's cost, not a speed-up. Results go
to ``benchmarks/results/sharded_selection.json`` and ``.md``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import how_often, machine, median_of_runs, parse_size, write_results

RESULTS = Path(__file__).resolve().parent / "results"
ROWS_PER_BLOCK = 64
SEED = 1234


def _shapes(size: int, sources: int) -> list[tuple[int, int]]:
    """``sources`` matrices of about ``size`` units in all, of a few different widths."""
    widths = [512, 1024, 768, 2048]
    shapes = []
    for index in range(sources):
        cols = widths[index % len(widths)]
        shapes.append((max(1, round(size / sources / cols)), cols))
    return shapes


def _rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """The rows ``[start, stop)`` of ``rank``: ``torch.chunk``'s split, as ``Shard(0)`` does."""
    per_rank = -(-rows // world)
    start = min(rank * per_rank, rows)
    return start, min(start + per_rank, rows)


def _local_scores(source: int, shape: tuple[int, int], start: int, stop: int) -> torch.Tensor:
    """Rows ``[start, stop)`` of matrix ``source``: each block of rows from its own seed."""
    rows, cols = shape
    out = torch.empty(stop - start, cols)
    first, last = start // ROWS_PER_BLOCK, -(-stop // ROWS_PER_BLOCK)
    for block in range(first, last):
        lo, hi = block * ROWS_PER_BLOCK, min((block + 1) * ROWS_PER_BLOCK, rows)
        generator = torch.Generator().manual_seed(SEED + 1_000_003 * source + block)
        values = torch.randn(hi - lo, cols, generator=generator)
        a, b = max(lo, start), min(hi, stop)
        if a < b:
            out[a - start : b - start] = values[a - lo : b - lo]
    return out


def _signature(keep: list[torch.Tensor], offsets: list[int]) -> list[list[int]]:
    """Per matrix: the number of cleared units and the sum of their global flat indices."""
    out = []
    for mask, offset in zip(keep, offsets, strict=True):
        cleared = torch.nonzero(~mask.reshape(-1)).view(-1)
        out.append([cleared.numel(), int(cleared.sum()) + offset * cleared.numel()])
    return out


def run_rank(rank: int, world: int, port: int, args: dict[str, Any], out: str) -> None:
    """One rank (or, with ``world == 1``, the one-process reference): build, select, report."""
    import torch.distributed as dist

    from tensorplay.ao.pruning.selection import AbsKeys
    from tensorplay.ao.pruning.selection.clear import clear_lowest
    from tensorplay.ao.pruning.selection.sharding import ShardLayout

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    group = None
    if world > 1:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}"
        )
        group = dist.group.WORLD
    shapes = _shapes(args["size"], args["sources"])
    total = sum(r * c for r, c in shapes)
    scores, layouts, offsets = [], [], []
    for source, (rows, cols) in enumerate(shapes):
        start, stop = _rows(rows, rank, world)
        scores.append(_local_scores(source, (rows, cols), start, stop))
        layouts.append(ShardLayout(numel=rows * cols, offset=start * cols))
        offsets.append(start * cols)
    keys = AbsKeys()
    # Warm-up on a stand-in: starts threads and the group's connections.
    small = [torch.randn(1000)]
    clear_lowest(
        small,
        [torch.ones(1000, dtype=torch.bool)],
        world,
        keys,
        shards=[ShardLayout(numel=1000 * world, offset=1000 * rank)],
        group=group,
    )
    calls = []
    keep = [torch.ones(s.shape, dtype=torch.bool) for s in scores]
    eligible = total
    for _ in ("first", "second"):
        k = round(0.5 * eligible)
        if group is not None:
            dist.barrier(group)
        start_time = time.perf_counter()
        cost = clear_lowest(scores, keep, k, keys, shards=layouts, group=group, n_eligible=eligible)
        seconds = time.perf_counter() - start_time
        if group is not None:
            dist.barrier(group)
        signature = torch.tensor(_signature(keep, offsets), dtype=torch.int64)
        numbers = torch.tensor(
            [seconds, cost.bytes_communicated, cost.collectives], dtype=torch.float64
        )
        if group is not None:
            dist.all_reduce(signature, group=group)
            slowest = numbers.clone()
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
            numbers = slowest
        calls.append(
            {
                "seconds": float(numbers[0]),
                "bytes_communicated": int(numbers[1]),  # the rank that received most
                "collectives": int(numbers[2]),
                "passes": cost.passes,
                "signature": signature.tolist(),
            }
        )
        eligible -= k
    if rank == 0:
        Path(out).write_text(json.dumps({"params": total, "calls": calls}))
    if group is not None:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def measure(world: int, args: dict[str, Any]) -> dict[str, Any]:
    """Run ``world`` processes once; return rank 0's report."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "result.json")
        if world == 1:
            run_rank(0, 1, 0, args, out)
        else:
            mp.start_processes(
                run_rank,
                args=(world, _free_port(), args, out),
                nprocs=world,
                join=True,
                start_method="spawn",
            )
        return json.loads(Path(out).read_text())  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = {"size": args.size, "sources": args.sources}
    rows = []
    reference: list[Any] | None = None
    for world in args.processes:
        reports = [measure(world, settings) for _ in range(args.repeats)]
        calls = []
        for index, call in enumerate(("first", "second")):
            runs = [report["calls"][index] for report in reports]
            firsts = ("bytes_communicated", "collectives", "passes", "signature")
            calls.append({"call": call, **median_of_runs(runs, firsts=firsts)})
        signatures = [call["signature"] for call in calls]
        if reference is None:
            reference = signatures
        row = {
            "processes": world,
            "params": reports[0]["params"],
            "calls": calls,
            "identical": signatures == reference,
        }
        rows.append(row)
        for call in calls:
            print(
                f"  {world} process(es) {call['call']:<6} {call['seconds']:.3f}s "
                f"{call['bytes_communicated']} B in {call['collectives']} collectives, "
                f"{call['passes']} passes, identical: {row['identical']}",
                flush=True,
            )
    return {
        "machine": machine("cpus", "platform", "python", "torch"),
        "sources": args.sources,
        "repeats": args.repeats,
        "rows": rows,
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| processes | call | time (s) | vs 1 process | bytes received per rank "
        "| of the scores | collectives | passes | masks equal 1 process |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    single = {c["call"]: c["seconds"] for c in results["rows"][0]["calls"]}
    for row in results["rows"]:
        for call in row["calls"]:
            fraction = call["bytes_communicated"] / (4 * row["params"])
            lines.append(
                f"| {row['processes']} | {call['call']} | {call['seconds']:.3f} "
                f"| {call['seconds'] / single[call['call']]:.2f}x | {call['bytes_communicated']:,} "
                f"| {fraction:.2e} | {call['collectives']} | {call['passes']} "
                f"| {'yes' if row['identical'] else 'NO'} |"
            )
    machine = results["machine"]
    params = results["rows"][0]["params"]
    lines += [
        "",
        f"{params / 1e6:.1f}M fp32 units in {results['sources']} matrices, rows sharded over "
        f"the ranks; global L1; first call: 50% cleared, second: 50% of the rest. "
        f"{how_often(results['repeats'])}; time of the slowest rank; bytes: the most any rank "
        f"received; 'of the scores': those bytes over the 4 bytes/unit of all scores. "
        f"{machine['cpus']} CPUs (ranks beyond that share cores), gloo, torch "
        f"{machine['torch']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="20M", help="units in all, e.g. 20M")
    parser.add_argument("--sources", type=int, default=8, help="matrices")
    parser.add_argument("--processes", default="1,2,4", help="comma-separated; 1 comes first")
    parser.add_argument("--repeats", type=int, default=1, help="runs per process count")
    parser.add_argument("--quick", action="store_true", help="200K units, 1 and 2 processes")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.quick:
        args.size, args.processes = "200K", "1,2"
    args.size = parse_size(args.size)
    args.processes = sorted({int(p) for p in args.processes.split(",")} | {1})
    results = run(args)
    table = markdown(results)
    write_results(args.out, "sharded_selection", results, table)
    print(table)


if __name__ == "__main__":
    main()
