"""docs/large_models.rst: its code is valid Python whose tensorplay names exist, the 8B recipe's
memory table is the one the benchmark computes, and the measured numbers it quotes are those of
``benchmarks/results/sharded_structure.json``."""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.scripts import load_script
from tests.docs.code_blocks import code_blocks

PAGE = Path(__file__).resolve().parents[2] / "docs" / "large_models.rst"


def _recipe() -> str:
    recipes = [code for language, code in code_blocks(PAGE) if "prune_8b.py" in code]
    assert len(recipes) == 1
    return recipes[0]


@pytest.mark.parametrize(
    "index", [i for i, (language, _) in enumerate(code_blocks(PAGE)) if language == "python"]
)
def test_python_blocks_parse(index: int) -> None:
    ast.parse(code_blocks(PAGE)[index][1])


def test_the_recipe_imports_what_tensorplay_has_and_sets_what_the_page_says() -> None:
    tree = ast.parse(_recipe())
    imported = [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tensorplay")
        for alias in node.names
    ]
    assert imported
    for module, name in imported:
        assert hasattr(importlib.import_module(module), name), (module, name)
    code = _recipe()
    for setting in (
        'structure="channel"',
        'masking="inplace"',
        "target_params=0.8",
        "Distillation(teacher_dtype=torch.bfloat16)",
        "fully_shard(model.lm_head",
        "fully_shard(model.model.embed_tokens",
    ):
        assert setting in code, setting


def _table_after(marker: str) -> list[tuple[str, str, str]]:
    """The rows of the first list-table after ``marker``: (first, second, third) cells."""
    text = PAGE.read_text()
    table = text[text.index(".. list-table::", text.index(marker)) :]
    rows = re.findall(r"\n   \* - (.*)\n     -(.*)\n     - (.*)", "\n" + table.split("\n\n", 2)[1])
    return [(a.strip(), b.strip(), c.strip()) for a, b, c in rows]


def test_the_recipe_memory_table_is_the_computed_one() -> None:
    memory = load_script("sharded_memory")
    items = memory.memory_per_rank(memory.LLAMA3_8B, 8)
    rows = _table_after("is the last collective")
    assert len(rows) == len(items) + 3  # the header, the items, two totals
    for item, (name, rate, gb) in zip(items, rows[1:], strict=False):
        assert name.startswith(item.item) and rate == item.rate, name
        assert gb == f"{item.bytes / 1e9:.2f}", name
    without = sum(i.bytes for i in items if not i.teacher_only) / 1e9
    everything = sum(i.bytes for i in items) / 1e9
    assert rows[-2][2] == f"**{without:.2f}**" and rows[-1][2] == f"**{everything:.2f}**"
    text = " ".join(PAGE.read_text().split())
    assert f"a rank needs {without:.2f} GB besides activations" in text
    assert f"with the bfloat16 teacher {everything:.2f} GB" in text


def test_the_page_quotes_the_committed_results() -> None:
    path = PAGE.parents[1] / "benchmarks" / "results" / "sharded_structure.json"
    rows = {row["row"]: row for row in json.loads(path.read_text())["rows"]}
    text = " ".join(PAGE.read_text().split())
    assert all(row["equal"] for row in rows.values())
    wanda = rows["oneshot-head-wanda"]["sharded"]
    assert f"{max(wanda['bytes_sent']):,} bytes in {max(wanda['collectives'])}" in text
    for name, words in (
        ("gradual-channel-magnitude", "Gradual channel steps took {two:.2f} s on the 2 ranks "
         "against {one:.2f} s in one process"),
        ("oneshot-channel-magnitude", "a first one-shot step {two:.2f} s against {one:.2f} s"),
        ("distill-channel", "sharded teacher took {two:.1f} s against {one:.1f} s"),
    ):  # fmt: skip
        row = rows[name]
        assert words.format(two=row["sharded"]["seconds"], one=row["single"]["seconds"]) in text
    distill = rows["distill-channel"]["sharded"]
    apart = rows["distill-channel-apart"]["sharded"]
    for held in (distill, apart):  # the teacher's shard alone between forwards, in both layouts
        assert f"measured: {held['exact_after'] / held['exact_of']:.3f} bytes" in text
    assert "measured: 2.000 bytes" in text
    assert f"fell from {distill['peak'] / 1e6:.0f} MB to {apart['peak'] / 1e6:.0f} MB" in text


# The recipe on 2 gloo ranks of this machine, with a tiny Llama: only what a CPU test must change.
RECIPE_ON_CPU = {
    'dist.init_process_group("nccl")': "",  # the test's ranks are in their group already
    "torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())": "",
    'torch.device("cuda")': 'torch.device("cpu")',
    "batch = batch.cuda()": "",
    "AutoConfig.from_pretrained(NAME)": "CONFIG",
    "AutoModelForCausalLM.from_pretrained(NAME, torch_dtype=torch.float32)": "PRETRAINED",
    "end_step=2000, frequency=100": "end_step=4, frequency=1",
    '"llama-8b-pruned"': "OUT",
}


def _recipe_rank(rank: int, out: Path) -> None:
    import torch
    import transformers

    code = _recipe()
    for old, new in RECIPE_ON_CPU.items():
        assert old in code, old
        code = code.replace(old, new)
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    tokens = torch.randint(0, 97, (6, 2, 8), generator=torch.Generator().manual_seed(1))
    namespace: dict[str, Any] = {
        "CONFIG": config,
        "PRETRAINED": transformers.LlamaForCausalLM(config) if rank == 0 else None,
        "loader": list(tokens[:, rank : rank + 1]),  # each rank its half of every batch
        "OUT": out / "shrunk",
    }
    exec(compile(code, "recipe", "exec"), namespace)
    model, distill = namespace["model"], namespace["distill"]
    masks = {
        name: buffer.full_tensor()  # type: ignore[union-attr]
        for name, buffer in model.named_buffers()
        if name.endswith("_mask")
    }
    torch.save(
        {
            "masks": masks,
            "kd": float(distill.last_loss),
            "report": str(namespace["pruner"].report()),
            "shrunk": str(namespace["report"]),
        },
        out / f"rank{rank}.pt",
    )


@pytest.mark.slow
@pytest.mark.distributed
def test_the_recipe_runs_on_two_cpu_ranks(tmp_path: Path) -> None:
    import torch

    from tests.core.gloo import spawn_gloo

    pytest.importorskip("transformers")
    spawn_gloo(_recipe_rank, 2, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert ranks[0]["report"] == ranks[1]["report"]
    assert sorted(ranks[0]["masks"]) == sorted(ranks[1]["masks"]) and ranks[0]["masks"]
    for name, mask in ranks[0]["masks"].items():
        assert torch.equal(mask, ranks[1]["masks"][name]), name
    pruned = sum(int((~mask).sum()) for mask in ranks[0]["masks"].values())
    assert pruned > 0 and all(rank["kd"] > 0 for rank in ranks)
    # The folder save_shrunk wrote: bfloat16, at most 80% of the parameters (the budget).
    from transformers import LlamaForCausalLM

    from tensorplay.ao.pruning import load_shrunk

    assert ranks[0]["shrunk"] == ranks[1]["shrunk"]
    shrunk = load_shrunk(LlamaForCausalLM, tmp_path / "shrunk")
    assert next(shrunk.parameters()).dtype == torch.bfloat16
    found = re.search(r"parameters: ([\d,]+) -> ([\d,]+)", ranks[0]["shrunk"])
    assert found is not None, ranks[0]["shrunk"]
    before, after = (int(number.replace(",", "")) for number in found.groups())
    assert sum(p.numel() for p in shrunk.parameters()) == after <= 0.8 * before
