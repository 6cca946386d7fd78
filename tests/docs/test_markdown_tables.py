"""The benchmarks' markdown results become reStructuredText tables, or a clear error."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module() -> ModuleType:
    path = ROOT / "docs" / "_ext" / "markdown_tables.py"
    spec = importlib.util.spec_from_file_location("markdown_tables", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


markdown_to_rst = _module().markdown_to_rst


def test_a_table_and_a_caption_translate_cell_by_cell() -> None:
    text = (
        "| run | fit (s) |\n|---|---:|\n| `dense` | 12.56 |\n| tensorplay | |\n\nAn MLP, **CPU**.\n"
    )
    assert markdown_to_rst(text) == (
        ".. list-table::\n"
        "   :header-rows: 1\n"
        "\n"
        "   * - run\n"
        "     - fit (s)\n"
        "   * - ``dense``\n"
        "     - 12.56\n"
        "   * - tensorplay\n"
        "     -\n"
        "\n"
        "An MLP, **CPU**.\n"
    )


def _included_results() -> list[Path]:
    pages = (ROOT / "docs").glob("*.rst")
    found = re.findall(
        r"optional-include:: \.\./(benchmarks/results/\S+\.md)\n   :markdown:",
        "".join(page.read_text(encoding="utf-8") for page in pages),
    )
    return [ROOT / name for name in sorted(found)]


def test_the_pages_show_every_benchmark_result_they_include_as_a_table() -> None:
    text = "".join(page.read_text(encoding="utf-8") for page in (ROOT / "docs").glob("*.rst"))
    included = re.findall(r"optional-include:: \.\./benchmarks/results/(\S+\.md)", text)
    assert sorted(included) == [p.name for p in _included_results()]  # none as literal text
    assert [p.name for p in _included_results()] == [
        "callback_overhead.md",
        "export_size.md",
        "global_unstructured.md",
        "hf_trainer_overhead.md",
        "importance_overhead.md",
        "large_model.md",
        "lean_selection.md",
        "sharded_selection.md",
        "trainer_checkpoint_size.md",
        "training_overhead.md",
    ]


@pytest.mark.parametrize("path", _included_results(), ids=lambda path: path.name)
def test_every_included_result_keeps_each_row_and_its_caption(path: Path) -> None:
    if not path.is_file():
        pytest.skip(f"{path.name} is written by its benchmark, which has not run")
    text = path.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("|") and "---" not in line]
    rst = markdown_to_rst(text)
    assert rst.count("   * - ") == len(rows)
    caption = text.rstrip().splitlines()[-1]
    assert rst.rstrip().splitlines()[-1].replace("``", "`") == caption  # ``code`` for `code`


@pytest.mark.parametrize(
    ("text", "match"),
    [
        pytest.param(
            "# A heading\n", "a plain paragraph, got the line '# A heading'", id="heading"
        ),
        pytest.param("```\ncode\n```\n", "a plain paragraph, got the line '```'", id="fence"),
        pytest.param("- a list\n", "a plain paragraph, got the line '- a list'", id="list"),
        pytest.param("| a | b |\n| 1 | 2 |\n", r"a \|---\| rule under its header", id="no-rule"),
        pytest.param(
            "| a | b |\n|---|---|\n| 1 |\n", r"2 cells in the table row '\| 1 \|'", id="short-row"
        ),
    ],
)
def test_anything_but_a_table_or_a_paragraph_is_refused(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        markdown_to_rst(text)
