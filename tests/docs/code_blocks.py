"""The code blocks of a documentation page, read from its ``.rst`` source so tests run exactly
what the page shows.

Two options of ``.. code-block::`` mean something to the tests, and each is also what a reader
sees or needs:

* ``:caption: Needs ...`` (e.g. ``Needs 8 GPUs: torchrun --nproc-per-node 8 prune_8b.py``): a
  block that cannot run in one process on a CPU. The caption is shown above the block, and the
  test that runs the page as a script skips the block.
* ``:class: output``: a ``text`` block showing what the Python block before it prints; the test
  compares the printed text with it (``...`` stands for any text: a whole line of it for any
  lines).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "blocks", "code_blocks"]

_OPTION = re.compile(r"^ +:([\w-]+):(.*)$")


@dataclass(frozen=True)
class Block:
    """One ``.. code-block::`` of a page.

    Attributes:
        language: The directive's argument (``python``, ``text``, ``bash``...).
        code: The block's text, dedented, with a final newline.
        line: The 1-based line of the page on which the block's text starts.
        options: The directive's options (``caption``, ``class``...), by name.
    """

    language: str
    code: str
    line: int
    options: dict[str, str] = field(default_factory=dict)

    @property
    def needs(self) -> str | None:
        """What the block needs beyond one process on a CPU (its caption), or None."""
        caption = self.options.get("caption", "")
        return caption if caption.startswith("Needs ") else None

    @property
    def is_output(self) -> bool:
        """Whether the block shows what the Python block before it prints."""
        return "output" in self.options.get("class", "").split()

    @property
    def is_doctest(self) -> bool:
        """Whether the block is a session of ``>>>`` examples rather than a script."""
        return self.code.lstrip().startswith(">>>")


def blocks(path: Path) -> list[Block]:
    """Every ``.. code-block::`` directive of ``path`` at the start of a line, in page order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    for index, line in enumerate(lines):
        if not line.startswith(".. code-block::"):
            continue
        options: dict[str, str] = {}
        start = index + 1
        while start < len(lines) and (option := _OPTION.match(lines[start])):
            options[option.group(1)] = option.group(2).strip()
            start += 1
        body: list[str] = []
        for following in lines[start:]:
            if following and not following.startswith(" "):
                break
            body.append(following)
        while body and not body[0].strip():
            body.pop(0)
            start += 1
        code = textwrap.dedent("\n".join(body)).strip() + "\n"
        found.append(Block(line.split("::", 1)[1].strip(), code, start + 1, options))
    return found


def code_blocks(path: Path) -> list[tuple[str, str]]:
    """``(language, code)`` of every ``.. code-block::`` directive, in page order."""
    return [(block.language, block.code) for block in blocks(path)]
