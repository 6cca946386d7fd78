"""The FSDP2 structured-pruning benchmark: its memory arithmetic against real models' counts, and
its tiny run end to end (2 gloo ranks against one process)."""

from __future__ import annotations

import doctest
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.benchmarks.scripts import load_script, run_script

transformers = pytest.importorskip("transformers")

FFN = ("gate_proj", "up_proj", "down_proj")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


@pytest.fixture(scope="module")
def memory() -> Any:
    return load_script("sharded_memory")


def test_the_examples_run(memory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sharded_memory", memory)
    results = doctest.testmod(memory, optionflags=doctest.ELLIPSIS)
    assert results.attempted >= 8 and results.failed == 0


@pytest.mark.parametrize("size", ["tiny", "bench", "8b"])
def test_parameter_counts_equal_the_llama_models(memory: Any, size: str) -> None:
    bench = load_script("bench_sharded_structure")
    shape = {"tiny": bench.TINY, "bench": bench.FULL, "8b": memory.LLAMA3_8B}[size]
    with torch.device("meta"):  # the 8B shape: counted, never allocated
        model = transformers.LlamaForCausalLM(bench._config(shape))
    assert memory.parameters(shape) == sum(p.numel() for p in model.parameters())
    linears = {
        name.rsplit(".", 1)[-1]: module.weight.numel()
        for name, module in model.model.layers.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    weights = {
        kind: sum(
            module.weight.numel()
            for name, module in model.model.layers.named_modules()
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in names
        )
        for kind, names in (("channel", FFN), ("head", ATTENTION))
    }
    assert set(linears) == set(FFN) | set(ATTENTION)
    assert memory.target_parameters(shape, "channel") == weights["channel"]
    assert memory.target_parameters(shape, "head") == weights["head"]
    assert memory.target_parameters(shape) == weights["channel"] + weights["head"]
    assert memory.layer_parameters(shape) == sum(
        p.numel() for p in model.model.layers[0].parameters()
    )


def test_memory_per_rank_adds_the_teacher_and_shrinks_with_the_ranks(memory: Any) -> None:
    shape = memory.LLAMA3_8B
    items = memory.memory_per_rank(shape, 8)
    student = {i.item: i.bytes for i in items if not i.teacher_only}
    teacher = {i.item: i.bytes for i in items if i.teacher_only}
    params = memory.parameters(shape)
    assert student["student: float32 parameters, gradients, Adam moments"] == 16 * params // 8
    assert student["lean masks (bool)"] == memory.target_parameters(shape, "channel") // 8
    assert teacher["teacher shard (bfloat16)"] == 2 * params // 8
    in_root = memory.memory_per_rank(shape, 8, "channel", embeddings_apart=False)
    gathered = {i.item: i.bytes for i in in_root}
    root = 2 * 128256 * 4096 + 4096  # the embedding, the LM head, the final norm
    layer = memory.layer_parameters(shape)
    assert gathered["teacher: gathered in a forward (bfloat16, transient)"] == 2 * (
        root + 2 * layer
    )
    assert student["unit sums and scores (float64)"] == 32 * 32 * 14336
    halved = {i.item: i.bytes for i in memory.memory_per_rank(shape, 16)}
    assert halved["lean masks (bool)"] == memory.target_parameters(shape, "channel") // 16
    heads = {i.item: i.bytes for i in memory.memory_per_rank(shape, 8, "head")}
    assert heads["lean masks (bool)"] == memory.target_parameters(shape, "head") // 8
    assert heads["unit sums and scores (float64)"] == 32 * 8 * 5 * 8


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.bytes_per_step(m.LLAMA3_8B, "layer"), "'channel' or 'head', but got 'layer'"),
        (lambda m: m.memory_per_rank(m.LLAMA3_8B, 0), "`world` to be a positive int, but got 0"),
        (lambda m: m.LlamaShape(64, 2, 128, 4, 3, 100), "heads=4, kv_heads=3, hidden=64"),
        (lambda m: m.LlamaShape(64, 0, 128, 4, 2, 100), "`layers` to be a positive int"),
    ],
    ids=["structure", "world", "groups", "layers"],
)
def test_refusals_name_the_value(memory: Any, call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(memory)


@pytest.mark.slow
@pytest.mark.distributed
def test_tiny_run_matches_one_process_and_the_computed_bytes(tmp_path: Path) -> None:
    out = run_script("bench_sharded_structure.py", "--tiny", "--out", str(tmp_path))
    results = json.loads((tmp_path / "sharded_structure.json").read_text())
    bench, memory = load_script("bench_sharded_structure"), load_script("sharded_memory")
    rows = {row["row"]: row for row in results["rows"]}
    assert list(rows) == list(bench.ROWS)
    assert all(row["equal"] for row in rows.values()), [r for r in rows if not rows[r]["equal"]]
    for name, row in rows.items():
        assert row["single"]["bytes_sent"] == [0] * len(row["single"]["bytes_sent"]), name
        assert row["single"]["masks"] and row["sharded"]["masks"] == row["single"]["masks"]
    # One all_reduce per pruning step, of the size computed from the config.
    for structure in ("channel", "head"):
        sharded = rows[f"oneshot-{structure}-magnitude"]["sharded"]
        assert sharded["collectives"] == [1]
        assert sharded["bytes_sent"] == [memory.bytes_per_step(bench.TINY, structure)]
    assert len(rows["gradual-channel-magnitude"]["sharded"]["seconds_all"][0]) == 3
    distill = rows["distill-channel"]["sharded"]
    assert distill["bytes_sent"] == [0, 0, 0]  # the teacher's copy and forward: FSDP's own
    # Each rank holds a bool mask byte per target parameter it holds, a bfloat16 teacher 2 bytes
    # per parameter it holds; about half of the model's each.
    channel = rows["oneshot-channel-magnitude"]["sharded"]
    assert channel["exact_held"] == channel["exact_of"]
    ffn = memory.target_parameters(bench.TINY, "channel")
    assert channel["exact_of"] == pytest.approx(ffn / 2, rel=0.05)
    assert distill["exact_held"] == 2 * distill["exact_of"]
    # After its forwards the teacher holds its shard alone: its root is resharded after each
    # forward (FSDP2 reshards a root after its backward only, and a teacher runs none).
    assert distill["exact_after"] == distill["exact_held"]
    apart = rows["distill-channel-apart"]["sharded"]
    assert apart["exact_held"] == 2 * apart["exact_of"]
    assert apart["exact_after"] == apart["exact_held"]
    table = (tmp_path / "sharded_structure.md").read_text()
    assert table in out
    assert "| heads by Wanda, one-shot step |" in table and "| **with the teacher** |" in table
    # The tables again from the JSON alone, as they were.
    assert (
        run_script("bench_sharded_structure.py", "--tables", "--out", str(tmp_path))
        == out[out.index(table) :]
    )
    assert (tmp_path / "sharded_structure.md").read_text() == table
