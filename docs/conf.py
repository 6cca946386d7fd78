"""Sphinx configuration: ``sphinx-build -W -b html docs docs/_build/html`` builds the site."""

from __future__ import annotations

import sys
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.directives.other import Include

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the docs build also works without installing the package

project = "tensorplay"
author = "the tensorplay authors"
copyright = "2026, the tensorplay authors"
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style docstrings
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_typehints = "description"  # types live in the annotations; show them with the arguments
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
# results/ holds tables that pages include, not pages of their own.
exclude_patterns = ["_build", "results"]
templates_path: list[str] = []
html_theme = "alabaster"
html_static_path: list[str] = []
html_theme_options = {"description": "Exact, fast pruning for PyTorch and Lightning"}


class OptionalInclude(Include):
    """``.. optional-include:: PATH``: the file when it exists, else the directive's content.

    The benchmark and sweep tables are written by running code (``benchmarks/``,
    ``examples/sweep.py``); the docs must also build, with ``-W``, before either has run.
    """

    has_content = True

    def run(self) -> list[nodes.Node]:
        _, path = self.env.relfn2path(self.arguments[0])
        self.env.note_dependency(path)
        if Path(path).is_file():
            included = list(super().run())
            for node in included:  # a `:literal:` table is plain text, not code to highlight
                if isinstance(node, nodes.literal_block):
                    node["language"] = "text"
            return included
        note = nodes.note()
        self.state.nested_parse(self.content, self.content_offset, note)
        return [note]


def setup(app: Sphinx) -> dict[str, bool]:
    app.add_directive("optional-include", OptionalInclude)
    return {"parallel_read_safe": True}
