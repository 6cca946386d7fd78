"""Import an example script (not a package) as a module of a name of our choosing, and the
docs' markdown table translation the examples' results go through."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
LM = ROOT / "examples/lm"


def load_script(name: str, path: Path) -> ModuleType:
    """Import ``path`` as ``name`` (``examples/train.py`` already owns the name ``train``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # doctest looks a function's module up there
    spec.loader.exec_module(module)
    return module


@functools.cache
def docs_markdown_tables() -> ModuleType:
    """The docs' extension that turns markdown results into reStructuredText tables."""
    return load_script("markdown_tables", ROOT / "docs/_ext/markdown_tables.py")


def markdown_to_rst(text: str) -> str:
    """``text`` as the docs render it (``docs/_ext/markdown_tables.py``)."""
    rst: str = docs_markdown_tables().markdown_to_rst(text)
    return rst
