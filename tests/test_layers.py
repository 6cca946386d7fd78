"""The library's layers, held to its imports: no cycle, nothing imported upward, no private names.

``LAYERS`` is the order the design page (``docs/design.rst``) describes, lowest first: a module
may import modules of its own layer and of the layers below, never above. Every import counts,
also one inside a function or under ``TYPE_CHECKING``: each is a dependency a reader follows.
Between modules there is no cycle at all, inside a layer too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
P = "tensorplay.ao.pruning"
C = "tensorplay.callbacks"

#: Lowest first. A package is one concept; see docs/design.rst for what each owns.
LAYERS: list[tuple[str, ...]] = [
    ("tensorplay", "tensorplay.ao", "tensorplay.moved", f"{P}.pair", f"{P}.frames", f"{P}.imports"),
    (f"{P}.selection",),
    (f"{P}.edits",),
    (f"{P}.parity",),
    (f"{P}.targets",),
    (f"{P}.masking",),
    (f"{P}.calibration",),
    (f"{P}.importance",),
    (f"{P}.distillation",),
    (f"{P}.structured",),
    (f"{P}.pruner",),
    (f"{P}.saving",),
    (P, "tensorplay.report"),
    (f"{C}.core",),
    (f"{C}.lightning", f"{C}.transformers"),
    (C,),
]


def module_files() -> dict[str, Path]:
    """Every library module by its import name (``callbacks/`` is ``tensorplay.callbacks``)."""
    modules = {}
    for folder in ("tensorplay", "callbacks"):
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[0] == "callbacks":
                parts.insert(0, "tensorplay")
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = module_files()


def imports(name: str) -> Iterator[tuple[str, int, str]]:
    """``(module imported, line, name taken)`` for every import of a library module in ``name``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                prefix = parts[: len(parts) - node.level + 1]
                base = ".".join([*prefix, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                target = full if full in MODULES else base
                if target in MODULES and target != name:
                    yield target, node.lineno, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and alias.name != name:
                    yield alias.name, node.lineno, ""


def layer_of(name: str) -> int:
    """The index of the layer whose longest prefix holds ``name``."""
    best, length = -1, -1
    for index, layer in enumerate(LAYERS):
        for prefix in layer:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > length:
                best, length = index, len(prefix)
    assert best >= 0, f"{name} is in no layer: add its package to LAYERS and docs/design.rst"
    return best


def test_every_module_is_in_a_layer() -> None:
    assert len(MODULES) > 150
    for name in MODULES:
        layer_of(name)


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = [
        f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}"
        for name in MODULES
        for target, line, _ in imports(name)
        if layer_of(target) > layer_of(name)
    ]
    assert upward == []


def test_no_module_imports_another_modules_private_names() -> None:
    private = [
        f"{MODULES[name].relative_to(ROOT)}:{line} takes {taken} from {target}"
        for name in MODULES
        for target, line, taken in imports(name)
        if re.match(r"_[^_]", taken) and MODULES[name].name != "__init__.py"
    ]
    assert private == []


def cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph = {name: sorted({target for target, _, _ in imports(name)}) for name in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_no_import_cycle() -> None:
    assert cycles() == []


def test_the_top_of_the_pruning_package_holds_a_few_modules_beside_its_packages() -> None:
    top = sorted(p.name for p in (ROOT / "tensorplay/ao/pruning").glob("*.py"))
    assert top[0] == "__init__.py" and len(top) - 1 <= 8, top


def test_the_design_page_lists_the_layers_in_this_order() -> None:
    page = (ROOT / "docs" / "design.rst").read_text()
    listed = re.findall(r"^\s*\d+\.\s+``([\w.]+)``", page, flags=re.MULTILINE)
    packages = [prefix for layer in LAYERS[1:12] for prefix in layer]
    assert listed == [name.removeprefix(f"{P}.") for name in packages]
