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

from tests.docs.code_blocks import code_blocks

transformers = pytest.importorskip("transformers")

PAGE = Path(__file__).resolve().parents[3] / "docs" / "structured.rst"


def test_the_page_has_the_blocks_these_tests_know() -> None:
    languages = [language for language, _ in code_blocks(PAGE)]
    assert languages == ["python", "text", "python", "text", "python", "python", "python", "text"]


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
