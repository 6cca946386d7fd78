"""The markdown results (benchmarks', examples') become reStructuredText tables, or an error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.examples.scripts import docs_markdown_tables

ROOT = Path(__file__).resolve().parents[2]


markdown_to_rst = docs_markdown_tables().markdown_to_rst


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


# A benchmark's result (../benchmarks/results/) or an example's (results/, beside the pages).
_RESULT = r"(\.\./benchmarks/results/\S+\.md|results/\S+\.md)"


def _pages_text() -> str:
    return "".join(page.read_text(encoding="utf-8") for page in (ROOT / "docs").glob("*.rst"))


def _included_results() -> list[Path]:
    found = re.findall(rf"optional-include:: {_RESULT}\n   :markdown:", _pages_text())
    return sorted((ROOT / "docs" / name).resolve() for name in found)


def test_the_pages_show_every_result_they_include_as_a_table() -> None:
    included = re.findall(rf"optional-include:: {_RESULT}", _pages_text())
    resolved = sorted((ROOT / "docs" / name).resolve() for name in included)
    assert resolved == _included_results()  # none as literal text
    assert [p.relative_to(ROOT).as_posix() for p in _included_results()] == [
        "benchmarks/results/budget_reconstruction.md",
        "benchmarks/results/callback_overhead.md",
        "benchmarks/results/experts.md",
        "benchmarks/results/export_size.md",
        "benchmarks/results/global_unstructured.md",
        "benchmarks/results/hf_trainer_overhead.md",
        "benchmarks/results/importance_overhead.md",
        "benchmarks/results/large_model.md",
        "benchmarks/results/latency.md",
        "benchmarks/results/lean_selection.md",
        "benchmarks/results/reconstruction.md",
        "benchmarks/results/reconstruction_cost.md",
        "benchmarks/results/sharded_selection.md",
        "benchmarks/results/sharded_structure.md",
        "benchmarks/results/structured_overhead.md",
        "benchmarks/results/structured_peer.md",
        "benchmarks/results/structured_speed.md",
        "benchmarks/results/trainer_checkpoint_size.md",
        "benchmarks/results/training_overhead.md",
        "benchmarks/results/width.md",
        "benchmarks/results/width_seeds.md",
        "docs/results/distillation.md",
        "docs/results/distillation_channel.md",
        "docs/results/distillation_trainer.md",
        "docs/results/structured.md",
    ]


@pytest.mark.parametrize("path", _included_results(), ids=lambda path: path.name)
def test_every_included_result_keeps_each_row_and_its_caption(path: Path) -> None:
    if not path.is_file():
        pytest.skip(f"{path.name} is written by its script, which has not run")
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
