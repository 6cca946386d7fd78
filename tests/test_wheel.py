"""The built distributions hold every module of the source tree, not only the editable checkout.

Each test builds from a copy of the checkout with a probe subpackage added under ``tensorplay/``
and under ``callbacks/``: a subpackage nobody listed must land in the wheel too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"tensorplay": "tensorplay", "callbacks": "tensorplay/callbacks"}
PROBES = ("tensorplay/ao/pruning/_wheel_probe", "callbacks/_wheel_probe")
UNCOPIED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*_cache", ".hypothesis"
)


def _tree_with_probes(folder: Path) -> Path:
    """Copy the checkout to ``folder`` and add an unlisted subpackage to each source root."""
    tree = folder / "tree"
    shutil.copytree(ROOT, tree, ignore=UNCOPIED)
    for probe in PROBES:
        (tree / probe).mkdir()
        (tree / probe / "__init__.py").write_text('"""A subpackage that nobody listed."""\n')
    return tree


def _wheel(source: Path, out: Path) -> Path:
    """Build the wheel of ``source`` into ``out`` with the installed setuptools; its path."""
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, str(source), "-w", str(out)], check=True, capture_output=True)
    (wheel,) = out.glob("tensorplay-*.whl")
    return wheel


def _sdist(source: Path, out: Path) -> Path:
    """Build the sdist of ``source`` into ``out`` through the PEP 517 hook; its path."""
    hook = "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])"
    subprocess.run(
        [sys.executable, "-c", hook, str(out)], cwd=source, check=True, capture_output=True
    )
    (sdist,) = out.glob("tensorplay-*.tar.gz")
    return sdist


def _wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist()) - {
            name for name in archive.namelist() if "dist-info" in name
        }


def _expected(tree: Path) -> set[str]:
    """Every ``.py`` file and ``py.typed`` of the source roots, at its path in the wheel."""
    names = set()
    for source, installed in SOURCES.items():
        for path in (tree / source).rglob("*"):
            if path.suffix == ".py" or path.name == "py.typed":
                relative = PurePosixPath(path.relative_to(tree / source).as_posix())
                names.add(str(PurePosixPath(installed) / relative))
    return names


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The probed copy of the checkout and its wheel."""
    folder = tmp_path_factory.mktemp("wheel")
    tree = _tree_with_probes(folder)
    return tree, _wheel(tree, folder / "dist")


def test_wheel_holds_every_module_and_py_typed(built: tuple[Path, Path]) -> None:
    tree, wheel = built
    missing = _expected(tree) - _wheel_names(wheel)
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert "tensorplay/py.typed" in _wheel_names(wheel)


def test_every_package_in_the_wheel_has_its_init(built: tuple[Path, Path]) -> None:
    names = _wheel_names(built[1])
    folders = {str(PurePosixPath(name).parent) for name in names if name.endswith(".py")}
    assert not {f"{folder}/__init__.py" for folder in folders} - names


def test_wheel_finds_subpackages_nobody_listed(built: tuple[Path, Path]) -> None:
    names = _wheel_names(built[1])
    assert "tensorplay/ao/pruning/_wheel_probe/__init__.py" in names
    assert "tensorplay/callbacks/_wheel_probe/__init__.py" in names


def test_sdist_builds_the_same_wheel(tmp_path: Path, built: tuple[Path, Path]) -> None:
    tree, wheel = built
    sdist = _sdist(tree, tmp_path / "sdist")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    assert _wheel_names(_wheel(unpacked, tmp_path / "dist")) == _wheel_names(wheel)
