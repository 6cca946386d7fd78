"""Structured pruning and distillation under FSDP2: 2 gloo processes against 1 (CPU), and the
memory per rank of an 8B model on 8 ranks.

Run (about 30 minutes on a loaded 2-core machine; ``--tiny`` about 2)::

    python benchmarks/bench_sharded_structure.py                # the 125M Llama, 3 repeats
    python benchmarks/bench_sharded_structure.py --tiny         # a 0.2M Llama, 1 repeat
    python benchmarks/bench_sharded_structure.py --rows oneshot-channel-magnitude --repeats 1
    python benchmarks/bench_sharded_structure.py --tables       # the .md again, from the JSON

The same randomly initialised fp32 ``LlamaForCausalLM`` (``--tiny``: a small one) is pruned with
``masking="inplace"``:

* **1 process**: the plain model (the reference);
* **2 processes** (spawned, ``gloo`` on this machine): ``fully_shard`` on every decoder layer and
  on the root, over a 1-D mesh of the 2 ranks; each rank trains on its half of the batch (FSDP2
  averages the gradients, so the weights follow the one process's).

Rows (each in fresh processes, ``--repeats`` times; medians reported):

* ``oneshot-<structure>-<importance>``: a ``Pruner`` with ``OneShotSchedule(0.5, step=1)``,
  attached to AdamW; one training step (which gathers Taylor's gradients or Wanda's activation
  norms), then the pruning step, timed;
* ``gradual-channel-magnitude``: ``LinearSchedule(0.5, end_step=3, frequency=1)``, 4 AdamW
  steps, a pruning step after each of steps 1, 2 and 3, each timed;
* ``distill-channel``: ``Distillation(teacher_dtype=torch.bfloat16)`` attached (a sharded copy of
  the sharded student on 2 ranks, a dense copy on 1), channels pruned once to 50%, then 3 AdamW
  steps of task + KD loss, each timed; ``distill-channel-apart``: the same with a ``fully_shard``
  of their own on the embedding and the LM head (the root holds only the final norm).

Columns: the time per pruning step (per training step for ``distill``) on the slowest rank,
between two barriers; the **bytes tensorplay exchanges per pruning step**: the sum of
``numel * element_size`` of the tensor each rank passes to a ``torch.distributed`` collective
called from a ``tensorplay`` module (``all_reduce``, ``all_gather``, ``all_gather_into_tensor``,
``broadcast``, ``reduce_scatter_tensor``, ``all_to_all_single``), the most any rank sent (FSDP's
own gathers and reductions of the weights are not tensorplay's and are not counted), beside the
fp32 bytes of the targets; the memory per rank, read from the kernel (``VmRSS``, and ``VmHWM``
reset through ``/proc/self/clear_refs`` before each block; a sampling thread where that file is
missing): **held**: what the first pruning step left resident (the masks, made then), or the
teacher's copy (``distill``); the **peak** of a pruning step (or training step) above the resident
memory before it. Resident memory is what the process touched: freed blocks glibc keeps count
until returned, and pages of the weights that were never touched do not. Exact counts beside
them: the bytes of the masks and of the teacher's parameters each rank holds. **masks equal**:
every mask, gathered whole after the run, hashed (SHA-256 of its bytes) and compared with the
one process's; for ``distill`` also the KD term of the first step (the mean of the ranks' halves
against the one process's whole batch, ``rel=1e-3``: the bfloat16 teacher's matmuls on another
batch size).

Then the memory per rank of a Llama-3-8B shape on 8 ranks (:mod:`sharded_memory`), with and
without the teacher, and the same computation for the measured model on 2 ranks beside what was
measured. Results go to ``benchmarks/results/sharded_structure.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import PeakMemory, extra_mb, machine, other_work, write_results
from sharded_memory import (
    LLAMA3_8B,
    LlamaShape,
    bytes_per_step,
    memory_per_rank,
    parameters,
    target_parameters,
)

RESULTS = Path(__file__).resolve().parent / "results"
FULL = LlamaShape(hidden=768, layers=12, intermediate=2048, heads=12, kv_heads=4, vocab=32000)
TINY = LlamaShape(hidden=64, layers=2, intermediate=128, heads=4, kv_heads=2, vocab=1000)
SEQUENCE = {False: 64, True: 16}  # tokens per sequence; 1 sequence per rank, 2 on one process
SPARSITY = 0.5
ROWS = (
    "oneshot-channel-magnitude",
    "oneshot-channel-taylor",
    "oneshot-head-magnitude",
    "oneshot-head-wanda",
    "gradual-channel-magnitude",
    "distill-channel",
    "distill-channel-apart",
)
# What each row measures, as its table names it.
LABELS = {
    "oneshot-channel-magnitude": "FFN channels by magnitude, one-shot step",
    "oneshot-channel-taylor": "FFN channels by Taylor, one-shot step",
    "oneshot-head-magnitude": "heads by magnitude, one-shot step",
    "oneshot-head-wanda": "heads by Wanda, one-shot step",
    "gradual-channel-magnitude": "FFN channels by magnitude, a later gradual step",
    "distill-channel": "a training step with the teacher",
    "distill-channel-apart": "a training step with the teacher, embedding and LM head apart",
}
COLLECTIVES = {  # what tensorplay could call, and the argument it sends
    "all_reduce": "tensor",
    "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "broadcast": "tensor",
    "reduce_scatter_tensor": "input",
    "all_to_all_single": "input",
}
WORLD = 2


@dataclass
class SentBytes:
    """The bytes this process passes to ``torch.distributed`` collectives called from a
    ``tensorplay`` module while ``counting``, and how many such calls."""

    counting: bool = False
    bytes: int = 0
    calls: int = 0
    by_caller: dict[str, int] = field(default_factory=dict)  # every call's bytes, by module

    def install(self) -> None:
        """Wrap each collective of :data:`COLLECTIVES` in ``torch.distributed``."""
        import inspect

        import torch.distributed as dist

        for name, argument in COLLECTIVES.items():
            original = getattr(dist, name)
            signature = inspect.signature(original)
            setattr(dist, name, self._counted(original, signature, argument))

    def _counted(
        self, original: Callable[..., Any], signature: Any, argument: str
    ) -> Callable[..., Any]:
        name = original.__name__

        def counted(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if self.counting and caller.startswith("tensorplay"):
                sent = signature.bind(*args, **kwargs).arguments[argument]
                size = sent.numel() * sent.element_size()
                self.bytes += size
                self.calls += 1
                key = f"{caller}.{name}"
                self.by_caller[key] = self.by_caller.get(key, 0) + size
            return original(*args, **kwargs)

        return counted

    def take(self) -> tuple[int, int]:
        """The bytes and calls counted since the last take; counting starts again from 0."""
        taken = (self.bytes, self.calls)
        self.bytes = self.calls = 0
        return taken


def _config(shape: LlamaShape) -> Any:
    import transformers

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    return transformers.LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )


def build_model(shape: LlamaShape) -> nn.Module:
    """The benchmark's ``LlamaForCausalLM`` of ``shape``: fp32, seeded random init, train mode."""
    import transformers

    torch.manual_seed(0)
    model: nn.Module = transformers.LlamaForCausalLM(_config(shape)).train()
    return model


def _shard(model: nn.Module, apart: bool) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.model.layers:  # type: ignore[union-attr]
        fully_shard(layer, mesh=mesh)
    if apart:  # the root then holds only the final norm
        fully_shard(model.model.embed_tokens, mesh=mesh)  # type: ignore[union-attr,arg-type]
        fully_shard(model.lm_head, mesh=mesh)  # type: ignore[arg-type]
    fully_shard(model, mesh=mesh)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # type: ignore[no-any-return]


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # type: ignore[no-any-return]


def _masks(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        f"{name}.{buffer}": mask
        for name, module in model.named_modules()
        for buffer, mask in module.named_buffers(recurse=False)
        if buffer.endswith("_mask")
    }


def _digests(model: nn.Module) -> dict[str, list[Any]]:
    """Per mask, gathered whole (a collective under FSDP2): SHA-256 of its bytes, units pruned."""
    out = {}
    for key, mask in sorted(_masks(model).items()):
        full = _full(mask).detach().to(torch.bool).contiguous()
        out[key] = [hashlib.sha256(full.numpy().tobytes()).hexdigest(), int((~full).sum())]
    return out


class Rank:
    """One rank of a row (or, with ``world == 1``, the one-process reference)."""

    def __init__(self, rank: int, world: int, tiny: bool, apart: bool = False) -> None:
        import torch.distributed as dist

        self.rank, self.world = rank, world
        self.dist = dist if world > 1 else None
        self.shape = TINY if tiny else FULL
        self.sent = SentBytes()
        self.sent.install()
        self.held: list[int] = []  # the resident memory each timed call left
        self.model = build_model(self.shape)
        if world > 1:
            _shard(self.model, apart)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        generator = torch.Generator().manual_seed(7)
        tokens = torch.randint(0, self.shape.vocab, (8, WORLD, SEQUENCE[tiny]), generator=generator)
        self.tokens = tokens if world == 1 else tokens[:, rank : rank + 1]

    def barrier(self) -> None:
        if self.dist is not None:
            self.dist.barrier()

    def train(self, step: int, extra: Callable[[], torch.Tensor] | None = None) -> None:
        """One AdamW step on this rank's part of batch ``step`` (plus ``extra()``'s loss)."""
        self.optimizer.zero_grad()
        batch = self.tokens[step]
        loss = self.model(batch, labels=batch).loss
        if extra is not None:
            loss = loss + extra()
        loss.backward()
        self.optimizer.step()

    def timed(self, call: Callable[[], object]) -> tuple[float, int, int, int]:
        """``call()`` between barriers: seconds, bytes tensorplay sent and its collectives, and
        the peak resident bytes above those before it."""
        self.barrier()
        with PeakMemory() as memory:
            self.sent.counting = True
            start = time.perf_counter()
            call()
            seconds = time.perf_counter() - start
            self.sent.counting = False
        self.barrier()
        sent, calls = self.sent.take()
        self.held.append(memory.after - memory.before)
        return seconds, sent, calls, memory.peak - memory.before

    def local_params(self) -> int:
        return sum(_local(p).numel() for p in self.model.parameters())


def _pruner(rank: Rank, schedule: Any, structure: Any, importance: str) -> Any:
    from tensorplay.ao.pruning import Pruner

    pruner = Pruner(
        rank.model, schedule, masking="inplace", structure=structure, importance=importance
    )
    pruner.attach(rank.optimizer)
    return pruner


def prune_row(rank: Rank, kind: str, structure: str, importance: str) -> dict[str, Any]:
    """A one-shot or gradual row: build and attach the pruner, train, and time every pruning
    step (the first makes the masks: what it leaves resident is the row's held memory)."""
    from tensorplay.ao.pruning import LinearSchedule, OneShotSchedule

    if kind == "oneshot":
        schedule: Any = OneShotSchedule(SPARSITY, step=1)
        steps = 2
    else:
        schedule = LinearSchedule(SPARSITY, end_step=3, frequency=1)
        steps = 4
    pruner = _pruner(rank, schedule, structure, importance)
    timings = []
    for step in range(steps):
        rank.train(step)
        if schedule(step) > 0 and schedule.should_prune(step):
            timings.append(rank.timed(functools.partial(pruner.step, step)))
        else:
            pruner.step(step)
    masks = _masks(rank.model).values()
    return {
        "timings": timings,
        "held": rank.held[0],  # the masks, made at the first pruning step
        "exact_held": sum(_local(m).numel() * _local(m).element_size() for m in masks),
        "exact_of": sum(_local(rank.model.get_parameter(t)).numel() for t in pruner.targets),
        "targets": sum(rank.model.get_parameter(t).numel() for t in pruner.targets),
    }


def _bytes(model: nn.Module | None) -> int:
    """The bytes of ``model``'s parameters this rank holds (local shards, or whole tensors)."""
    if model is None:
        raise ValueError("Expected a teacher, but got None.")
    return sum(_local(p).numel() * _local(p).element_size() for p in model.parameters())


def distill_row(rank: Rank) -> dict[str, Any]:
    """The teacher copied (held memory), channels pruned once, 3 timed steps of task + KD."""
    from tensorplay.ao.pruning import Distillation, OneShotSchedule

    rank.train(len(rank.tokens) - 1)  # AdamW makes its moments: not in the timed steps
    with PeakMemory() as built:
        distill = Distillation(teacher_dtype=torch.bfloat16).attach(rank.model)
    copied = _bytes(distill.teacher)
    pruner = _pruner(rank, OneShotSchedule(SPARSITY), "channel", "magnitude")
    pruner.step(0)
    timings, kd = [], []
    for step in range(3):
        timings.append(rank.timed(functools.partial(rank.train, step, distill.loss)))
        kd.append(float(distill.last_loss))  # type: ignore[arg-type]
    return {
        "timings": timings,
        "held": built.after - built.before,
        "exact_held": copied,
        # FSDP2 leaves a root it ran forward but not backward gathered: the teacher's root
        # (embedding, LM head, final norm) stays whole between steps.
        "exact_after": _bytes(distill.teacher),
        "exact_of": rank.local_params(),
        "targets": sum(p.numel() for p in rank.model.parameters()),
        "kd": kd[0],
    }


def run_rank(rank_index: int, world: int, init: str, row: str, tiny: bool, out: str) -> None:
    """One rank of ``row``: measure, reduce over the ranks (the slowest, the most), report."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    import torch.distributed as dist

    if world > 1:
        dist.init_process_group("gloo", rank=rank_index, world_size=world, init_method=init)
    rank = Rank(rank_index, world, tiny, apart=row.endswith("-apart"))
    kind, structure, *rest = row.split("-")
    found = distill_row(rank) if kind == "distill" else prune_row(rank, kind, structure, rest[0])
    # Per timed step: seconds, bytes, calls, peak; then held, exact held, its parameters, KD.
    numbers = [value for timing in found["timings"] for value in timing]
    numbers += [found.get("exact_after", 0), found["held"], found["exact_held"], found["exact_of"]]
    numbers += [found.get("kd", 0.0)]
    most = torch.tensor(numbers, dtype=torch.float64)
    if world > 1:
        kd = torch.tensor([found.get("kd", 0.0)], dtype=torch.float64)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        dist.all_reduce(kd)
        most[-1] = kd[0] / world  # the mean of the ranks' halves: the whole batch's term
    digests = _digests(rank.model)
    if rank_index == 0:
        values = most.tolist()
        steps = [values[i : i + 4] for i in range(0, 4 * len(found["timings"]), 4)]
        report = {
            "row": row,
            "processes": world,
            "params": sum(p.numel() for p in rank.model.parameters()),
            "targets": found["targets"],
            "seconds": [s[0] for s in steps],
            "bytes_sent": [int(s[1]) for s in steps],
            "collectives": [int(s[2]) for s in steps],
            "peak": [int(s[3]) for s in steps],
            "exact_after": int(values[-5]),
            "held": int(values[-4]),
            "exact_held": int(values[-3]),
            "exact_of": int(values[-2]),
            "kd": values[-1] if kind == "distill" else None,
            "masks": digests,
            "by_caller": rank.sent.by_caller,  # rank 0's, every counted call of the run
        }
        Path(out).write_text(json.dumps(report))
    if world > 1:
        dist.barrier()  # no rank tears down while a peer's last collective is in flight
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads may outlive the group: never finalize the interpreter


def measure(row: str, world: int, tiny: bool) -> dict[str, Any]:
    """Run ``row`` once on ``world`` fresh processes; rank 0's report."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "result.json")
        init = f"file://{Path(folder) / f'rendezvous-{uuid.uuid4().hex}'}"
        mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
            run_rank,
            args=(world, init, row, tiny, out),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        return json.loads(Path(out).read_text())  # type: ignore[no-any-return]


def summarize(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeats of one row on one process count as one: medians over the runs of each run's
    median step; the counts of the first run (every run sends and holds the same)."""
    first = reports[0]
    return {
        "processes": first["processes"],
        "params": first["params"],
        "targets": first["targets"],
        "seconds": statistics.median(statistics.median(r["seconds"]) for r in reports),
        "seconds_all": [r["seconds"] for r in reports],
        "bytes_sent": first["bytes_sent"],
        "collectives": first["collectives"],
        "peak": statistics.median(statistics.median(r["peak"]) for r in reports),
        "held": statistics.median(r["held"] for r in reports),
        "exact_held": first["exact_held"],
        "exact_after": first["exact_after"],
        "exact_of": first["exact_of"],
        "kd": first["kd"],
        "masks": first["masks"],
        "by_caller": first["by_caller"],
        "same_every_run": all(r["masks"] == first["masks"] for r in reports),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for row in args.rows:
        single, sharded = (
            summarize([measure(row, world, args.tiny) for _ in range(args.repeats)])
            for world in (1, WORLD)
        )
        equal = single["masks"] == sharded["masks"] and sharded["same_every_run"]
        if row.startswith("distill"):
            equal = equal and abs(sharded["kd"] - single["kd"]) <= 1e-3 * abs(single["kd"])
        rows.append({"row": row, "single": single, "sharded": sharded, "equal": equal})
        print(
            f"  {row}: {single['seconds']:.3f}s -> {sharded['seconds']:.3f}s, "
            f"{max(sharded['bytes_sent'])} B sent, equal: {equal}",
            flush=True,
        )
    shape = TINY if args.tiny else FULL
    return {
        "machine": machine("cpus", "load", "platform", "python", "torch", "transformers"),
        "shape": vars(shape),
        "processes": WORLD,
        "repeats": args.repeats,
        "rows": rows,
        "analytic": analytic(shape),
    }


def analytic(shape: LlamaShape) -> dict[str, Any]:
    """The memory per rank of Llama-3-8B on 8 ranks, and of the measured model on 2."""
    return {
        "8b": {
            "params": parameters(LLAMA3_8B),
            "targets": target_parameters(LLAMA3_8B, "channel"),
            "items": [vars(item) for item in memory_per_rank(LLAMA3_8B, 8)],
            "items_in_root": [
                vars(item) for item in memory_per_rank(LLAMA3_8B, 8, "channel", False)
            ],
            "bytes_per_step": {s: bytes_per_step(LLAMA3_8B, s) for s in ("channel", "head")},
        },
        "measured_model": {
            "params": parameters(shape),
            "channel_targets": target_parameters(shape, "channel"),
            # The benchmark's layout: the embedding and the LM head in the root.
            "items": [vars(item) for item in memory_per_rank(shape, WORLD, "channel", False)],
            "items_apart": [vars(item) for item in memory_per_rank(shape, WORLD)],
            "bytes_per_step": {s: bytes_per_step(shape, s) for s in ("channel", "head")},
        },
    }


def _prune_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| step | time 1 process (s) | time 2 ranks (s) | 2 ranks / 1 | bytes per step "
        "| of the targets' fp32 | held MB (1 / 2 ranks) | step peak MB (1 / 2 ranks) "
        "| masks equal 1 process |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        one, two = row["single"], row["sharded"]
        sent = max(two["bytes_sent"])
        fraction = "" if row["row"].startswith("distill") else f"{sent / (4 * two['targets']):.1e}"
        lines.append(
            f"| {LABELS[row['row']]} | {one['seconds']:.3f} | {two['seconds']:.3f} "
            f"| {two['seconds'] / one['seconds']:.2f}x | {sent:,} | {fraction} "
            f"| {extra_mb(one['held'])} / {extra_mb(two['held'])} "
            f"| {extra_mb(one['peak'])} / {extra_mb(two['peak'])} "
            f"| {'yes' if row['equal'] else 'NO'} |"
        )
    return lines


def _memory_table(apart: list[dict[str, Any]], in_root: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| per rank | embedding, LM head apart | GB | in the root | GB |",
        "|---|---|---|---|---|",
    ]
    for item, other in zip(apart, in_root, strict=True):
        mark = " (with the teacher only)" if item["teacher_only"] else ""
        lines.append(
            f"| {item['item']}{mark} | {item['rate']} | {item['bytes'] / 1e9:.2f} "
            f"| {other['rate']} | {other['bytes'] / 1e9:.2f} |"
        )
    for label, teacher in (("without the teacher", False), ("with the teacher", True)):
        totals = [
            sum(i["bytes"] for i in items if teacher or not i["teacher_only"]) / 1e9
            for items in (apart, in_root)
        ]
        lines.append(f"| **{label}** | | **{totals[0]:.2f}** | | **{totals[1]:.2f}** |")
    return lines


def _check_lines(results: dict[str, Any]) -> list[str]:
    """Computed against measured, per rank of the measured model on 2 ranks."""
    rows = {row["row"]: row["sharded"] for row in results["rows"]}
    model = results["analytic"]["measured_model"]
    items = {item["item"]: item["bytes"] for item in model["items"]}
    lines = ["| on each of 2 ranks | computed | measured (exact) | measured (resident) |"]
    lines.append("|---|---|---|---|")
    for name, row, item in (
        ("masks, B/weight of a masked tensor", "oneshot-channel-magnitude", "lean masks (bool)"),
        ("teacher, B/param", "distill-channel", "teacher shard (bfloat16)"),
    ):
        if row not in rows:
            continue
        got = rows[row]
        of = model["channel_targets"] if "masks" in name else model["params"]
        lines.append(
            f"| {name} | {items[item] / (of / WORLD):.3f} | "
            f"{got['exact_held'] / got['exact_of']:.3f} | {got['held'] / got['exact_of']:.3f} |"
        )
    for row, label in (
        ("distill-channel", "teacher after its forwards, B/param"),
        (
            "distill-channel-apart",
            "teacher after its forwards, embedding and LM head apart, B/param",
        ),
    ):  # its root resharded after each forward: the shard alone
        if row in rows:
            got = rows[row]
            computed = items["teacher shard (bfloat16)"]
            lines.append(
                f"| {label} | {computed / (model['params'] / WORLD):.3f} | "
                f"{got['exact_after'] / got['exact_of']:.3f} | |"
            )
    for structure in ("channel", "head"):
        row = f"oneshot-{structure}-magnitude"
        if row in rows:
            lines.append(
                f"| all_reduce per {structure} step, bytes | "
                f"{model['bytes_per_step'][structure]:,} | {max(rows[row]['bytes_sent']):,} | |"
            )
    return lines


def markdown(results: dict[str, Any]) -> str:
    shape = results["shape"]
    params = results["rows"][0]["single"]["params"]
    machine_record = results["machine"]
    eight = results["analytic"]["8b"]
    lines = _prune_table(results)
    noisy = other_work(machine_record["load"], machine_record["cpus"])
    lines += [
        "",
        f"CPU timings on {machine_record['cpus']} cores (gloo), torch "
        f"{machine_record['torch']}: a fp32 "
        f"`LlamaForCausalLM` of {params / 1e6:.1f}M parameters (hidden {shape['hidden']}, "
        f"{shape['layers']} layers, FFN {shape['intermediate']}, {shape['heads']} heads, "
        f"{shape['kv_heads']} key/value heads, vocabulary {shape['vocab']}), `fully_shard` per "
        f"decoder layer and root on 2 ranks against the plain model in 1 process, "
        f'`masking="inplace"`, AdamW. Medians of {results["repeats"]} runs in fresh processes; '
        "time of the slowest rank per pruning step (per training step in the rows with the "
        "teacher); bytes: what tensorplay passed to collectives per pruning step, the "
        "most any rank sent; held: resident memory the first pruning step (the masks) or the "
        "bfloat16 teacher's copy added; step peak: resident peak of a step above the memory "
        "before it; none: the step left no more resident memory than there was before it (the "
        "process reused memory it had freed). Resident memory undercounts what reuses memory "
        "the process freed before (gradients, gathered weights): the exact bytes are below. "
        "Masks are made for the tensors a step prunes units of." + (f" {noisy}" if noisy else ""),
        "",
        "Computed against measured (the model above on 2 ranks):",
        "",
        *_check_lines(results),
        "",
        *_memory_table(eight["items"], eight["items_in_root"]),
        "",
        f"Above: Llama-3-8B ({eight['params'] / 1e9:.2f}B parameters, "
        f'{eight["targets"] / 1e9:.2f}B in the FFNs, `structure="channel"`) on 8 ranks, '
        "computed per rank, the embedding and the LM head with a `fully_shard` of their own "
        "or in the root's; activations not counted: "
        f"{eight['bytes_per_step']['channel']:,} bytes all-reduced per channel step, "
        f"{eight['bytes_per_step']['head']:,} per head step.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a 0.2M model, 1 repeat")
    parser.add_argument("--repeats", type=int, default=None, help="fresh runs per row (3)")
    parser.add_argument(
        "--rows", default=",".join(ROWS), help="comma-separated, of: " + ", ".join(ROWS)
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    parser.add_argument(
        "--tables",
        action="store_true",
        help="measure nothing: recompute the memory tables and rewrite the .md from the JSON",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.tables:
        results = json.loads((args.out / "sharded_structure.json").read_text())
        results["analytic"] = analytic(LlamaShape(**results["shape"]))
        table = markdown(results)
        write_results(args.out, "sharded_structure", results, table)
        print(table)
        return
    args.rows = args.rows.split(",")
    unknown = [row for row in args.rows if row not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; expected some of {list(ROWS)}")
    if args.repeats is None:
        args.repeats = 1 if args.tiny else 3
    results = run(args)
    table = markdown(results)
    write_results(args.out, "sharded_structure", results, table)
    print(table)


if __name__ == "__main__":
    main()
