"""The core (``tensorplay/``) needs torch alone: no Lightning, no torchmetrics."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tensorplay

FRAMEWORKS = (
    "lightning",
    "lightning_fabric",
    "lightning_utilities",
    "pytorch_lightning",
    "torchmetrics",
)
CORE = Path(tensorplay.__file__).resolve().parent

# Runs in a fresh interpreter where importing any framework fails, as on a torch-only install.
SCRIPT = textwrap.dedent(
    """
    import importlib, pkgutil, sys

    BLOCKED = {blocked!r}

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{{name}} is blocked in this test")
            return None

    sys.meta_path.insert(0, Block())
    for name in BLOCKED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
        else:
            raise SystemExit(f"{{name}} was not blocked")

    import torch
    import tensorplay
    import tensorplay.ao.pruning as prune

    for info in pkgutil.walk_packages(tensorplay.__path__, "tensorplay."):
        if info.name.startswith("tensorplay.callbacks"):
            continue  # the Lightning integration, outside the core
        importlib.import_module(info.name)

    import copy
    import torch.nn.utils.prune as torch_prune

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    twin = copy.deepcopy(net)
    for lib, model in ((prune, net), (torch_prune, twin)):
        torch.manual_seed(1)
        lib.l1_unstructured(model[0], "weight", amount=0.5)
        lib.ln_structured(model[0], "weight", amount=1, n=2, dim=0)
        lib.random_unstructured(model[1], "bias", amount=1)
        lib.remove(model[1], "bias")
    x = torch.randn(3, 4)
    net(x).sum().backward()
    assert torch.equal(net[0].weight_mask, twin[0].weight_mask), net[0].weight_mask
    assert torch.equal(net(x), twin(x))
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("core ok without", ", ".join(sorted(BLOCKED)))
    """
)


@pytest.mark.slow
def test_core_imports_and_prunes_without_frameworks() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(blocked=set(FRAMEWORKS))],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "core ok without" in result.stdout


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_core_file_imports_a_framework() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 5, files  # the scan did find the core
    offenders = {
        str(path.relative_to(CORE)): sorted(_imported_roots(path) & set(FRAMEWORKS))
        for path in files
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_static_check_would_catch_an_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import torch\ndef f():\n    from lightning.pytorch import Trainer\n")
    assert _imported_roots(sample) & set(FRAMEWORKS) == {"lightning"}
