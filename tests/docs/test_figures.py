"""Every figure the pages show exists, in the sources and in the built site; none is orphaned."""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
# `.. figure:: PATH` and `.. image:: PATH`: relative to the page, or to docs/ when it starts
# with a slash (Sphinx's rule).
IMAGE = re.compile(r"^\s*\.\. (?:figure|image):: (\S+)\s*$", re.MULTILINE)


def _pages() -> list[Path]:
    # docs/results/ holds tables the pages include (written by examples/sweep.py): their images
    # are shown too.
    return sorted(p for p in DOCS.rglob("*.rst") if "_build" not in p.parts)


def _included_images() -> dict[Path, list[str]]:
    return {page: IMAGE.findall(page.read_text(encoding="utf-8")) for page in _pages()}


def _resolve(page: Path, target: str) -> Path:
    return (DOCS / target.lstrip("/")) if target.startswith("/") else (page.parent / target)


def test_the_pages_show_the_benchmark_and_main_job_figures() -> None:
    shown = {_resolve(page, t).resolve() for page, ts in _included_images().items() for t in ts}
    figures = {p.resolve() for p in (DOCS / "figures").glob("*.png")}
    expected = {
        "global_unstructured.png",
        "lean_selection_time.png",
        "lean_selection_memory.png",
        "training_overhead.png",
        "callback_overhead.png",
        "gradual_sparsity.png",
        "gradual_layers.png",
        "large_model.png",
        "structured_speed.png",
        "width.png",
    }
    assert {p.name for p in figures} == expected
    assert figures <= shown, f"figures no page shows: {sorted(p.name for p in figures - shown)}"


@pytest.mark.parametrize("page", _pages(), ids=lambda page: str(page.relative_to(DOCS)))
def test_every_image_a_page_includes_exists(page: Path) -> None:
    for target in IMAGE.findall(page.read_text(encoding="utf-8")):
        path = _resolve(page, target)
        assert path.is_file(), f"{page.relative_to(DOCS)} shows {target}, which does not exist"
        assert path.stat().st_size > 0, path


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.sources += [value for name, value in attrs if name == "src" and value]


@pytest.mark.slow
def test_the_built_site_has_every_image_its_pages_show_and_copy_buttons(tmp_path: Path) -> None:
    pytest.importorskip("furo")
    pytest.importorskip("sphinx_copybutton")
    html = tmp_path / "html"
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", DOCS, html],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shown: dict[str, list[str]] = {}
    for page in sorted(html.glob("*.html")):
        parser = _Images()
        parser.feed(page.read_text(encoding="utf-8"))
        local = [src for src in parser.sources if not src.startswith(("http:", "https:", "data:"))]
        shown[page.name] = local
        for src in local:
            assert (page.parent / src).is_file(), f"{page.name} shows {src}, not in the build"
    # The figures of the pages that tell the speed, memory and accuracy story are there.
    assert len(shown["performance.html"]) == 6
    assert len(shown["large_models.html"]) == 2
    assert len(shown["quickstart.html"]) == 2
    assert len(shown["index.html"]) == 2  # the speed-up of a shrunk model, the selection
    assert len(shown["results.html"]) == 1  # the sweep's, written by examples/sweep.py
    assert (html / "_static" / "copybutton.js").is_file()
    assert 'src="_static/copybutton.js' in (html / "quickstart.html").read_text(encoding="utf-8")


def test_every_image_the_readme_shows_exists() -> None:
    readme = DOCS.parent / "README.md"
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", readme.read_text(encoding="utf-8"))
    assert images, "the README shows no figure"
    for target in images:
        assert (readme.parent / target).is_file(), f"README.md shows {target}, which does not exist"
