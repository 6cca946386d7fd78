"""No two modules of the library share a file name: a reader never has to ask which one."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_two_library_modules_share_a_file_name() -> None:
    names = Counter(
        path.name
        for folder in ("tensorplay", "callbacks")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "__init__.py"
    )
    assert [name for name, count in names.items() if count > 1] == []
