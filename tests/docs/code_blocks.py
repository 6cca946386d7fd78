"""The code blocks of a documentation page, read from its ``.rst`` source so tests run exactly
what the page shows."""

from __future__ import annotations

import textwrap
from pathlib import Path


def code_blocks(path: Path) -> list[tuple[str, str]]:
    """``(language, code)`` of every ``.. code-block::`` directive, in page order."""
    lines = path.read_text().splitlines()
    blocks: list[tuple[str, str]] = []
    for index, line in enumerate(lines):
        if not line.startswith(".. code-block::"):
            continue
        language = line.split("::", 1)[1].strip()
        body: list[str] = []
        for following in lines[index + 1 :]:
            if following and not following.startswith(" "):
                break
            body.append(following)
        blocks.append((language, textwrap.dedent("\n".join(body)).strip() + "\n"))
    return blocks
