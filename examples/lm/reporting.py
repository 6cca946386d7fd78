"""An experiment's report: mean ± std over seeds, and its results written as JSON and Markdown.

``distill.py``, ``distill_trainer.py``, ``structured.py`` and ``importance.py`` each run seeds of
a few configurations, print a Markdown table of the scores and write the numbers beside it.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["mean_std", "write_results"]


def mean_std(values: Sequence[float], digits: int = 2) -> str:
    """A table cell: the mean of ``values`` ± their sample standard deviation (0 for one value).

    Example:
        >>> mean_std([1.0, 2.0, 3.0]), mean_std([1.23456], digits=3)
        ('2.00 ± 1.00', '1.235 ± 0.000')
    """
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} ± {std:.{digits}f}"


def write_results(out: Path, result: Any, table: str | None = None) -> None:
    """Write ``result`` as JSON to ``out`` and ``table`` (Markdown) beside it, ``.md``.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     write_results(Path(folder) / "runs" / "demo.json", {"cells": [1.5]}, "| a |\\n")
        ...     sorted(path.name for path in (Path(folder) / "runs").iterdir())
        ['demo.json', 'demo.md']
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if table is not None:
        out.with_suffix(".md").write_text(table)
