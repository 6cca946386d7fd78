"""Sphinx configuration: ``sphinx-build -W -b html docs docs/_build/html`` builds the site."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.directives.other import Include

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the docs build also works without installing the package
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from markdown_tables import markdown_to_rst  # noqa: E402

project = "tensorplay"
author = "the tensorplay authors"
copyright = "2026, the tensorplay authors"
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style docstrings
    "mathml",  # docs/_ext/mathml.py: formulas as MathML in the page, shown without a network
    "sphinx.ext.viewcode",
    "sphinx_copybutton",  # a copy button on every code block
]
html_math_renderer = "mathml"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_typehints = "description"  # types live in the annotations; show them with the arguments
autodoc_typehints_description_target = "all"  # every argument typed, documented or not
autodoc_typehints_format = "short"  # Tensor, not torch.Tensor, in the signatures and descriptions
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
# results/ holds tables that pages include, not pages of their own.
exclude_patterns = ["_build", "results"]
templates_path: list[str] = []

# Furo: light and dark (it follows the reader's system setting, with a toggle), search, a page
# layout that folds the sidebars away on narrow screens. custom.css widens the text column so
# that no code block of these pages is cut off at the right on a laptop-sized window.
html_theme = "furo"
html_title = "tensorplay"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {
    "light_css_variables": {"color-brand-primary": "#c0392b", "color-brand-content": "#b03a2e"},
    "dark_css_variables": {"color-brand-primary": "#ff7b6b", "color-brand-content": "#ff8f80"},
}
pygments_style = "friendly"
pygments_dark_style = "monokai"

# The copy button copies the command, not the prompt (``$ ``, ``>>> ``, ``... ``), nor the output.
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = True
copybutton_exclude = ".linenos, .gp, .go"


class OptionalInclude(Include):
    """``.. optional-include:: PATH``: the file when it exists, else the directive's content.

    The benchmark and sweep tables are written by running code (``benchmarks/``,
    ``examples/sweep.py``); the docs must also build, with ``-W``, before either has run. With
    ``:markdown:`` the file is a benchmark's markdown (pipe tables and paragraphs), shown as
    tables.
    """

    has_content = True
    option_spec: ClassVar = {**Include.option_spec, "markdown": directives.flag}

    def run(self) -> list[nodes.Node]:
        _, path = self.env.relfn2path(self.arguments[0])
        self.env.note_dependency(path)
        if Path(path).is_file() and "markdown" in self.options:
            rst = markdown_to_rst(Path(path).read_text(encoding="utf-8"))
            container = nodes.container(classes=["benchmark-results"])
            self.state.nested_parse(StringList(rst.splitlines(), source=path), 0, container)
            return [container]
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
