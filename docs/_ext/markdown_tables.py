"""The benchmarks' markdown results as reStructuredText: pipe tables and plain paragraphs.

``benchmarks/results/*.md`` hold a table (or two) and a caption, written by the scripts; the
docs show them as tables (``.. optional-include:: FILE.md`` with ``:markdown:``) rather than as
monospaced text. Only what those files use is understood: a pipe table with its header and
``|---|`` rule, and paragraphs with ```code``` and ``**bold**``; anything else is an error
naming the line, so a new construct cannot be shown wrong.
"""

from __future__ import annotations

import re

__all__ = ["markdown_to_rst"]

_CODE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
_RULE = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")


def markdown_to_rst(text: str) -> str:
    """Translate ``text`` (pipe tables and paragraphs) into reStructuredText.

    Example:
        >>> print(markdown_to_rst("| a | b |\\n|---|---|\\n| `x` | 2 |\\n\\nSome **note**."))
        .. list-table::
           :header-rows: 1
        <BLANKLINE>
           * - a
             - b
           * - ``x``
             - 2
        <BLANKLINE>
        Some **note**.
        <BLANKLINE>

    Raises:
        ValueError: On a construct other than a pipe table or a paragraph (a heading, a list, a
            code fence), or a table whose rows do not all have the header's number of cells.
    """
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip():
            blocks[-1].append(line.rstrip())
        elif blocks[-1]:
            blocks.append([])
    out: list[str] = []
    for block in (b for b in blocks if b):
        out += _table(block) if block[0].startswith("|") else _paragraph(block)
        out.append("")
    return "\n".join(out)


def _cells(line: str) -> list[str]:
    return [_inline(cell.strip()) for cell in line.strip().strip("|").split("|")]


def _table(lines: list[str]) -> list[str]:
    if len(lines) < 2 or not _RULE.match(lines[1].replace(" ", "")):
        raise ValueError(f"Expected a pipe table with a |---| rule under its header, got {lines}")
    header = _cells(lines[0])
    rows = [header] + [_cells(line) for line in lines[2:]]
    for line, row in zip([lines[0], *lines[2:]], rows, strict=True):
        if len(row) != len(header) or not line.startswith("|"):
            raise ValueError(f"Expected {len(header)} cells in the table row {line!r}")
    out = [".. list-table::", "   :header-rows: 1", ""]
    for row in rows:
        out += [f"   * - {row[0]}".rstrip()] + [f"     - {cell}".rstrip() for cell in row[1:]]
    return out


def _paragraph(lines: list[str]) -> list[str]:
    for line in lines:
        if re.match(r"^\s*(#|```|[-*+] |\d+\. |>)", line):
            raise ValueError(f"Expected a table or a plain paragraph, got the line {line!r}")
    return [_inline(line) for line in lines]


def _inline(text: str) -> str:
    return _CODE.sub(r"``\1``", text)
