"""docs/structured.rst: every Python block runs in page order, prints what the page shows, and
the two ways of loading give back the shrunk model.

The blocks are read from the .rst itself, so the page cannot drift from what is tested: a new
block fails `test_the_page_has_the_blocks_these_tests_know` until it is tested here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tensorplay.ao.pruning import CubicSchedule, load_shrunk
from tests.docs.code_blocks import code_blocks

transformers = pytest.importorskip("transformers")

PAGE = Path(__file__).resolve().parents[3] / "docs" / "structured.rst"


def test_the_page_has_the_blocks_these_tests_know() -> None:
    languages = [language for language, _ in code_blocks(PAGE)]
    assert languages == [
        *("python", "text", "python", "text", "python", "python"),
        *("python", "text"),  # pruning structure in training
        *("python", "python", "bash"),  # in a training run; the accuracy experiment
        "python",  # pruning without training
        *("python", "text"),  # experts
        *("python", "text"),  # a parameter budget
    ]


def _run(index: int, namespace: dict[str, Any]) -> None:
    language, code = code_blocks(PAGE)[index]
    assert language == "python"
    exec(compile(code, f"{PAGE.name}[{index}]", "exec"), namespace)


def test_the_blocks_run_in_order_and_print_what_the_page_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = code_blocks(PAGE)
    namespace: dict[str, Any] = {"directory": str(tmp_path)}
    torch.manual_seed(0)
    _run(0, namespace)
    printed = capsys.readouterr().out.splitlines()
    shown = blocks[1][1].splitlines()
    assert printed[:4] == shown[:4]  # the graph's summary
    assert printed[4].startswith(shown[4].removesuffix("...)"))
    _run(2, namespace)  # masks, shrinks and asserts the outputs did not change
    printed = capsys.readouterr().out.splitlines()
    shown = blocks[3][1].splitlines()
    assert printed[:3] == shown[:3] and printed[-1] == shown[-1]
    model, tokens = namespace["model"], namespace["tokens"]
    _run(4, namespace)  # save, and load with transformers alone
    same = namespace["same"]
    assert [len(layer.mlp.up_proj.weight) for layer in same.model.layers] == [64] * 4
    with torch.no_grad():
        torch.testing.assert_close(same(tokens).logits, model(tokens).logits)
    _run(5, namespace)  # load_shrunk of the same folder
    with torch.no_grad():
        torch.testing.assert_close(namespace["model"](tokens).logits, model(tokens).logits)


def test_the_training_block_prunes_exact_widths_and_prints_what_the_page_shows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocks = code_blocks(PAGE)
    namespace: dict[str, Any] = {}
    torch.manual_seed(0)
    _run(6, namespace)  # trains, prunes, shrinks and asserts the outputs did not change
    assert capsys.readouterr().out.splitlines() == blocks[7][1].splitlines()
    pruner = namespace["pruner"]
    assert [(step, count) for step, _, count in pruner.history] == [
        (s, 32) for s in (10, 20, 30, 40)
    ]


def _training_namespace(tmp_path: Path) -> dict[str, Any]:
    from tests.callbacks.hf_trainer_helpers import Tokens, training_args
    from tests.hf_models import tiny_llama

    return {
        "model": tiny_llama().train(),
        "args": training_args(tmp_path / "out", max_steps=6),
        "data": Tokens(),
        "Trainer": transformers.Trainer,
        "directory": str(tmp_path / "saved"),
    }


@pytest.mark.slow
def test_the_trainer_block_shrinks_and_saves_what_plain_transformers_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.callbacks.shrink_helpers import logits_of

    namespace = _training_namespace(tmp_path)
    _run(8, namespace)
    model = namespace["model"]
    assert model.config.intermediate_size == 24  # half of every block's 48 channels
    assert float(capsys.readouterr().out.split()[-1]) < 0.9
    same = transformers.AutoModelForCausalLM.from_pretrained(namespace["directory"])
    torch.testing.assert_close(logits_of(same), logits_of(model))


@pytest.mark.slow
def test_the_lightning_block_shrinks_and_its_checkpoint_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.callbacks.shrink_helpers import LitLlama, logits_of

    monkeypatch.chdir(tmp_path)  # Lightning's logs
    language, code = code_blocks(PAGE)[9]
    assert language == "python" and "steps = 1000\n" in code
    module = LitLlama()
    namespace: dict[str, Any] = {
        "module": module,
        "LitLlama": LitLlama,
        "CubicSchedule": CubicSchedule,
        "directory": str(tmp_path),
    }
    exec(compile(code.replace("steps = 1000\n", "steps = 6\n"), PAGE.name, "exec"), namespace)
    loaded = namespace["module"]
    assert loaded is not module
    heads = [layer.self_attn.k_proj.out_features for layer in module.model.model.layers]
    assert sum(heads) < 3 * 16  # key/value heads of 8 went
    assert [layer.self_attn.k_proj.out_features for layer in loaded.model.model.layers] == heads
    torch.testing.assert_close(logits_of(loaded), logits_of(module))
    same = load_shrunk(transformers.AutoModelForCausalLM, tmp_path)
    torch.testing.assert_close(logits_of(same), logits_of(module.model))


def test_the_experts_block_prunes_shrinks_and_loads_as_the_page_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = code_blocks(PAGE)
    namespace: dict[str, Any] = {"directory": str(tmp_path)}
    torch.manual_seed(0)
    _run(12, namespace)  # prunes by REAP, shrinks, asserts the outputs did not change, saves
    printed = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert printed == blocks[13][1].splitlines()
    model, same, tokens = namespace["model"], namespace["same"], namespace["tokens"]
    assert [layer.mlp.gate.weight.shape[0] for layer in same.model.layers] == [4, 4]
    with torch.no_grad():
        torch.testing.assert_close(same(tokens).logits, model(tokens).logits)


def test_the_budget_block_lands_under_the_budget_and_loads_as_the_page_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = code_blocks(PAGE)
    namespace: dict[str, Any] = {"directory": str(tmp_path)}
    torch.manual_seed(0)
    _run(14, namespace)  # prunes to 80% of the parameters per layer, shrinks, saves, loads
    printed = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert printed == blocks[15][1].splitlines()
    before, budget, after = map(int, printed[0].split())
    assert budget == int(0.8 * before)
    assert budget - 3 * 96 < after <= budget  # within one FFN channel per layer
    model, same, batches = namespace["model"], namespace["same"], namespace["batches"]
    with torch.no_grad():
        torch.testing.assert_close(same(batches[0]).logits, model(batches[0]).logits)


def test_the_reconstruction_block_prunes_shrinks_and_saves_what_plain_transformers_loads(
    tmp_path: Path,
) -> None:
    from tests.hf_models import VOCAB, tiny_llama

    generator = torch.Generator().manual_seed(0)
    batches = [
        {
            "input_ids": torch.randint(1, VOCAB, (4, 16), generator=generator),
            "attention_mask": torch.ones(4, 16, dtype=torch.long),
        }
        for _ in range(4)
    ]
    namespace: dict[str, Any] = {
        "model": tiny_llama(),
        "batches": batches,
        "directory": str(tmp_path),
    }
    _run(11, namespace)
    model = namespace["model"]
    assert model.config.intermediate_size == 48 - round(0.35 * 48)  # every layer as wide
    assert namespace["report"].parameters_after < namespace["report"].parameters_before
    same = transformers.AutoModelForCausalLM.from_pretrained(namespace["directory"])
    tokens = batches[0]["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(same(tokens).logits, model(tokens).logits)
