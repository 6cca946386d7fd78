"""Every formula of the site is shown as MathML written into the page, so it renders offline."""

from __future__ import annotations

import ast
import doctest
import re
from pathlib import Path

import pytest

from tests.examples.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
mathml = load_script("mathml", ROOT / "docs" / "_ext" / "mathml.py")

# ``:math:`...``` and the indented body of ``.. math::``, in a page or a docstring.
_ROLE = re.compile(r":math:`([^`]+)`")
_BLOCK = re.compile(r"^( *)\.\. math::\n\n((?:\1 +\S.*\n|\n)+)", re.MULTILINE)


def _formulas(text: str) -> list[str]:
    blocks = [" ".join(body.split()) for _, body in _BLOCK.findall(text)]
    return _ROLE.findall(text) + blocks


def _site_text() -> dict[str, str]:
    """The pages, and the docstrings of the package that the API reference shows."""
    texts = {page.name: page.read_text(encoding="utf-8") for page in (ROOT / "docs").glob("*.rst")}
    for path in [*(ROOT / "tensorplay").rglob("*.py"), *(ROOT / "callbacks").rglob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = [
            ast.get_docstring(node, clean=True) or ""
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        texts[path.relative_to(ROOT).as_posix()] = "\n".join(docstrings)
    return texts


FORMULAS = sorted({(name, f) for name, text in _site_text().items() for f in _formulas(text)})


def test_the_site_has_formulas_of_both_kinds() -> None:
    names = {name for name, _ in FORMULAS}
    assert {"concepts.rst", "distillation.rst", "iterative.rst"} <= names
    assert any("\\frac" in formula for _, formula in FORMULAS)  # a displayed one


@pytest.mark.parametrize(("where", "latex"), FORMULAS, ids=[f"{n}:{f[:30]}" for n, f in FORMULAS])
def test_every_formula_translates_to_mathml(where: str, latex: str) -> None:
    assert mathml.to_mathml(latex, block=True).startswith("<math")


def test_a_formula_docutils_cannot_translate_names_its_command() -> None:
    with pytest.raises(mathml.MathError, match=r"\\big"):
        mathml.to_mathml(r"\big(x\big)", block=False)


def test_the_conf_renders_math_with_it_and_loads_no_script_from_a_network() -> None:
    conf = (ROOT / "docs" / "conf.py").read_text(encoding="utf-8")
    assert 'html_math_renderer = "mathml"' in conf
    assert "mathjax" not in conf.replace("docs/_ext/mathml.py", "")


def test_its_docstring_example_holds() -> None:
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    tests = [t for t in finder.find(mathml) if t.examples]
    assert tests
    for test in tests:
        runner.run(test)
    assert runner.failures == 0
