"""The ``>>>`` examples of the docs pages run and print what the pages say."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = sorted(p for p in DOCS.glob("*.rst") if ">>>" in p.read_text(encoding="utf-8"))


def test_the_concepts_page_has_examples() -> None:
    assert DOCS / "concepts.rst" in PAGES


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_page_examples(page: Path) -> None:
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    failed, tried = doctest.testfile(str(page), module_relative=False, optionflags=flags)
    assert tried > 0 and failed == 0
