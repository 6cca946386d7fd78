"""Layer collapse is never silent: a global pruning step that empties a whole target warns.

Ranking all targets together (``scope="global"``) prunes wherever the scores are lowest, and a
small layer whose weights are small everywhere (an output layer of a few units) can lose every
weight: the layer then no longer passes its input on, the best-known failure of global magnitude
pruning. The pruner keeps its selection (it is exact and what was asked), but the first time a
target is 100% pruned it warns, naming the target and the two fixes: a floor for every target
(``min_density``) or leaving the layer dense (``keep_dense=["last"]``). The functional
``global_unstructured`` keeps torch's behaviour and never warns.

Example:
    >>> import warnings
    >>> watch = CollapseWatch()
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     watch.check(["out.weight", "fc.weight"], [4, 8], [0, 0], [4, 3], step=7)
    ...     watch.check(["out.weight", "fc.weight"], [4, 8], [0, 0], [4, 3], step=8)
    >>> len(caught), "'out.weight' is 100% pruned" in str(caught[0].message)
    (1, True)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from tensorplay.ao.pruning.frames import user_stacklevel

__all__ = ["CollapseWatch"]


class CollapseWatch:
    """Warns once per target the first time a pruning step leaves none of its units."""

    def __init__(self) -> None:
        self._warned: set[str] = set()

    def check(
        self,
        names: Sequence[str],
        numels: Sequence[int],
        before: Sequence[int],
        after: Sequence[int],
        step: int,
    ) -> None:
        """Warn for each target that ``step`` emptied (``after`` equal to its ``numel``, from
        fewer ``before``), unless it was warned about already."""
        rows = zip(names, numels, before, after, strict=True)
        for name, numel, was, now in rows:
            if now < numel or was == numel or name in self._warned:
                continue
            self._warned.add(name)
            warnings.warn(
                f"Global pruning at step {step} pruned all {numel} units of {name!r}: "
                f"{name!r} is 100% pruned, and its layer no longer passes its input on (layer "
                "collapse). Keep a share of every target with min_density=0.05 (say), or leave "
                "the last layer dense with keep_dense=['last'] (or exclude this tensor).",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
