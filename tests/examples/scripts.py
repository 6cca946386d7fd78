"""Import an example script (not a package) as a module of a name of our choosing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

LM = Path(__file__).resolve().parents[2] / "examples/lm"


def load_script(name: str, path: Path) -> ModuleType:
    """Import ``path`` as ``name`` (``examples/train.py`` already owns the name ``train``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # doctest looks a function's module up there
    spec.loader.exec_module(module)
    return module
