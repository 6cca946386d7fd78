"""Every module of the core imports on its own, first: no import cycle hides behind the order in
which ``tensorplay.ao.pruning/__init__.py`` happens to import its modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tensorplay

CORE = Path(tensorplay.__file__).parent

SCRIPT = """
import sys, importlib
import torch  # once: the modules are what is imported again
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "tensorplay" or m.startswith("tensorplay.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as error:
        print(f"{name}: {type(error).__name__}: {error}")
"""


def core_modules() -> list[str]:
    names = []
    for path in sorted(CORE.rglob("*.py")):
        parts = path.relative_to(CORE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.slow
def test_every_core_module_imports_first() -> None:
    modules = core_modules()
    assert "tensorplay.ao.pruning.masking.lean" in modules and len(modules) > 40
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *modules], capture_output=True, text=True, check=True
    )
    assert done.stdout == ""
