"""Math as MathML, written into the page when it is built: it renders without a network.

Sphinx's default HTML math renderer, MathJax, is a script fetched from a CDN when the page is
opened; offline the reader sees the raw LaTeX. This renderer converts each ``:math:`` role and
``.. math::`` block with docutils' LaTeX-to-MathML translator, and browsers display MathML
natively. docutils knows most of LaTeX's math but not all of it (``\\big``: write ``\\bigl`` and
``\\bigr``; ``\\dots``: write ``\\ldots``); a formula it cannot translate is a build warning that
names the page and the formula, so ``sphinx-build -W`` fails rather than show it raw.
"""

from __future__ import annotations

from docutils import nodes
from docutils.utils.math import MathError
from docutils.utils.math.latex2mathml import tex2mathml
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.math import get_node_equation_number
from sphinx.writers.html5 import HTML5Translator

__all__ = ["to_mathml", "setup"]

logger = logging.getLogger(__name__)


def to_mathml(latex: str, *, block: bool) -> str:
    """The MathML of ``latex``, a ``<math>`` element (``display="block"`` if ``block``).

    Example:
        >>> print(to_mathml("T^2", block=False))
        <math xmlns="http://www.w3.org/1998/Math/MathML">
          <msup>
            <mi>T</mi>
            <mn>2</mn>
          </msup>
        </math>

    Raises:
        docutils.utils.math.MathError: On LaTeX that docutils cannot translate, naming the
            command.
    """
    return str(tex2mathml(latex, as_block=block)).strip()


def _convert(translator: HTML5Translator, node: nodes.Element, block: bool) -> str:
    latex = node.astext()
    try:
        return to_mathml(latex, block=block)
    except MathError as error:
        logger.warning("cannot show the formula %r as MathML: %s", latex, error, location=node)
        return translator.encode(latex)


def visit_math(translator: HTML5Translator, node: nodes.math) -> None:
    """An inline formula: a ``<span class="math">`` holding its MathML."""
    translator.body.append(translator.starttag(node, "span", "", CLASS="math notranslate"))
    translator.body.append(_convert(translator, node, block=False) + "</span>")
    raise nodes.SkipNode


def visit_displaymath(translator: HTML5Translator, node: nodes.math_block) -> None:
    """A displayed formula: a ``<div class="math">`` holding its MathML, numbered if labelled."""
    translator.body.append(translator.starttag(node, "div", CLASS="math notranslate"))
    if node.get("number"):
        number = get_node_equation_number(translator, node)
        translator.body.append(f'<span class="eqno">({number})')
        translator.add_permalink_ref(node, "Link to this equation")
        translator.body.append("</span>")
    translator.body.append(_convert(translator, node, block=True) + "</div>\n")
    raise nodes.SkipNode


def setup(app: Sphinx) -> dict[str, bool]:
    """Register the renderer; ``html_math_renderer = "mathml"`` in ``conf.py`` chooses it."""
    app.add_html_math_renderer(
        "mathml", inline_renderers=(visit_math, None), block_renderers=(visit_displaymath, None)
    )
    return {"parallel_read_safe": True, "parallel_write_safe": True}
