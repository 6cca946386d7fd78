"""Every page's Python blocks run as written, in order, as one script, and print what it shows.

A reader copies a page's blocks one after the other into a file: later blocks use the names of
earlier ones, and nothing else is defined for them. Each page runs so, in a fresh interpreter
(:mod:`tests.docs.page_script`); a block that stops it fails the test with the page, the block
and its line. The ``:class: output`` block after a Python block and every number a
``print(...)  # ...`` comment claims are compared with what was printed. Blocks that need
several processes or a GPU say so in their caption (``Needs ...``) and are left out.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from tests.docs.code_blocks import blocks
from tests.docs.page_script import mismatches, run_page, runnable

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(page for page in DOCS.glob("*.rst") if runnable(page))

# Pages whose blocks train long enough to belong in the slow tier (``-m slow``).
SLOW = {"callback.rst", "shrinking_llms.rst"}


def _tail(log: str, lines: int = 40) -> str:
    return "\n".join(log.splitlines()[-lines:])


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=[pytest.mark.slow] if p.name in SLOW else []) for p in PAGES],
    ids=[page.name for page in PAGES],
)
def test_the_page_runs_as_one_script_and_prints_what_it_shows(page: Path, tmp_path: Path) -> None:
    run = run_page(page, tmp_path)
    assert run.returncode == 0, f"docs/{page.name} stopped:\n{_tail(run.log)}"
    found = mismatches(run)
    assert not found, "\n\n".join(found)


def test_the_pages_that_run_include_the_tutorials() -> None:
    names = {page.name for page in PAGES}
    assert {"quickstart.rst", "structured.rst", "distillation.rst", "concepts.rst"} <= names
    assert names >= SLOW


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.rst")), ids=lambda page: page.name)
def test_a_block_left_out_says_what_it_needs_and_outputs_follow_python(page: Path) -> None:
    found = blocks(page)
    for index, block in enumerate(found):
        if block.needs is not None:
            assert re.search(r"\b(GPUs?|processes)\b", block.needs), (page.name, block.line)
        if block.is_output:
            assert index > 0 and found[index - 1].language == "python", (page.name, block.line)
            assert found[index - 1].needs is None, (page.name, block.line)


def _page(folder: Path, text: str) -> Path:
    page = folder / "page.rst"
    page.write_text(textwrap.dedent(text))
    return page


def test_a_failing_block_is_named_with_its_page_and_line(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """\
        Title
        =====

        .. code-block:: python

           x = 1

        .. code-block:: python
           :caption: Needs two processes: torchrun --nproc-per-node 2 this.py

           raise SystemExit("left out")

        .. code-block:: python

           print(x)
           print(y)
        """,
    )
    run = run_page(page, tmp_path)
    assert run.returncode == 1
    assert "FAILED: docs/page.rst, block 2 (line 15)" in run.log
    assert f'File "{page}", line 16' in run.log and "NameError: name 'y'" in run.log
    assert run.printed == {0: "", 2: "1\n"}


def test_output_and_claims_are_compared_with_what_was_printed(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """\
        .. code-block:: python

           print(0.25)  # 0.25
           print(3)  # 4 (the claim is wrong)

        .. code-block:: python

           for i in range(3):
               print(i)

        .. code-block:: text
           :class: output

           0
           2
        """,
    )
    run = run_page(page, tmp_path)
    assert run.returncode == 0
    found = mismatches(run)
    assert len(found) == 2
    assert found[0].startswith("docs/page.rst, block 0 (line 3) claims '4'")
    assert found[1].startswith("docs/page.rst, block 1 (line 8) printed")


def test_doctest_blocks_share_the_namespace_and_fail_on_other_output(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        """\
        .. code-block:: python

           x = 2

        .. code-block:: python

           >>> y = x + 1
           >>> y
           3

        .. code-block:: python

           print(y * 2)  # 6

        .. code-block:: python

           >>> y
           4
        """,
    )
    run = run_page(page, tmp_path)
    assert run.returncode == 1 and "FAILED: docs/page.rst, block 3 (line 17)" in run.log
    assert "Expected:\n    4\nGot:\n    3" in run.log
    assert run.printed[2] == "6\n"  # a name a session defines is the script's
