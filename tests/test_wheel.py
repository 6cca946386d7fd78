"""The built distributions hold every module of the source tree, not only the editable checkout,
and the sdist what the README's commands need.

Each test builds from a copy of the checkout with a probe subpackage added under ``tensorplay/``
and under ``callbacks/``: a subpackage nobody listed must land in the wheel too.
"""

from __future__ import annotations

import hashlib
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


def test_the_wheel_carries_the_license(built: tuple[Path, Path]) -> None:
    with zipfile.ZipFile(built[1]) as archive:
        licenses = [
            name for name in archive.namelist() if name.endswith(".dist-info/licenses/LICENSE")
        ]
        assert len(licenses) == 1
        assert archive.read(licenses[0]) == (ROOT / "LICENSE").read_bytes()


def test_every_package_in_the_wheel_has_its_init(built: tuple[Path, Path]) -> None:
    names = _wheel_names(built[1])
    folders = {str(PurePosixPath(name).parent) for name in names if name.endswith(".py")}
    assert not {f"{folder}/__init__.py" for folder in folders} - names


def test_wheel_finds_subpackages_nobody_listed(built: tuple[Path, Path]) -> None:
    names = _wheel_names(built[1])
    assert "tensorplay/ao/pruning/_wheel_probe/__init__.py" in names
    assert "tensorplay/callbacks/_wheel_probe/__init__.py" in names


@pytest.fixture(scope="session")
def unpacked_sdist(tmp_path_factory: pytest.TempPathFactory, built: tuple[Path, Path]) -> Path:
    """The sdist of the probed copy, unpacked: its top folder."""
    folder = tmp_path_factory.mktemp("sdist")
    with tarfile.open(_sdist(built[0], folder / "sdist")) as archive:
        archive.extractall(folder / "unpacked", filter="data")
    (unpacked,) = (folder / "unpacked").iterdir()
    return unpacked


def test_sdist_builds_the_same_wheel(
    tmp_path: Path, built: tuple[Path, Path], unpacked_sdist: Path
) -> None:
    wheel = _wheel(unpacked_sdist, tmp_path / "dist")
    assert _wheel_names(wheel) == _wheel_names(built[1])


# What the README's commands read from the folder they run in: pip's constraints, the example
# and its config, the test suite, the docs; and the license the metadata names.
README_NEEDS = [
    "LICENSE",
    "README.md",
    "constraints.txt",
    "examples/train.py",
    "examples/configs/gradual.yaml",
    "tests/conftest.py",
    "tests/core/data/saved_states.pt",
    "docs/conf.py",
    "docs/index.rst",
]
# MD5 of the Apache License 2.0 text as the ASF publishes it (apache.org/licenses/LICENSE-2.0.txt).
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"


def test_sdist_carries_what_the_readme_commands_need(unpacked_sdist: Path) -> None:
    missing = [path for path in README_NEEDS if not (unpacked_sdist / path).is_file()]
    assert not missing, f"not in the sdist: {missing}"
    for command_file in ("constraints.txt", "README.md"):
        assert (unpacked_sdist / command_file).read_bytes() == (ROOT / command_file).read_bytes()
    stray = [p for p in unpacked_sdist.rglob("*") if p.name == "__pycache__" or "_build" in p.parts]
    assert not stray


def test_the_license_is_the_unmodified_apache_2_text(unpacked_sdist: Path) -> None:
    text = (unpacked_sdist / "LICENSE").read_bytes()
    assert text == (ROOT / "LICENSE").read_bytes()
    assert hashlib.md5(text).hexdigest() == APACHE_2_MD5
    assert b"Apache License\n                           Version 2.0, January 2004" in text
