"""Layer collapse is never silent: a global pruning step that empties a whole target warns.

Ranking all targets together (``scope="global"``) prunes wherever the scores are lowest, and a
small layer whose weights are small everywhere (an output layer of a few units) can lose every
weight: the layer then no longer passes its input on, the best-known failure of global magnitude
pruning. The pruner keeps its selection (it is exact and what was asked), but the first time a
target is 100% pruned it warns, naming the target and the two fixes: a floor for every target
(``min_density``) or leaving the layer dense (``keep_dense=["last"]``). The functional
``global_unstructured`` keeps torch's masks and warns the same way for each tensor a call
empties (:func:`warn_emptied`, with the fixes a call has).

A group of structured units (a module's channels or heads) always keeps one unit, so there the
warning comes the first time a global step leaves it 10% of its units or fewer
(the unit space's ``collapse_share``), naming the group and the
fixes: ``min_density``, or ``scope="layerwise"`` (every group pruned to the target on its own).

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

import torch
from torch import Tensor

from tensorplay.ao.pruning.frames import user_stacklevel

__all__ = ["CollapseWatch", "keeps_any", "warn_emptied"]

# A mask's first elements are read first: one with a kept unit among them (nearly every mask)
# needs no pass over the rest.
_HEAD = 1 << 16


class CollapseWatch:
    """Warns once per group the first time a pruning step leaves none of its units (or, for a
    space whose groups always keep one, at most ``share`` of them)."""

    def __init__(self) -> None:
        self._warned: set[str] = set()

    def check(
        self,
        names: Sequence[str],
        numels: Sequence[int],
        before: Sequence[int],
        after: Sequence[int],
        step: int,
        share: float = 0.0,
    ) -> None:
        """Warn for each group that ``step`` took to at most ``share`` of its units kept (0:
        emptied; ``after`` pruned of ``numel``, from ``before``), unless it was warned about
        already.

        Example:
            >>> import warnings
            >>> with warnings.catch_warnings(record=True) as caught:
            ...     warnings.simplefilter("always")
            ...     CollapseWatch().check(["mlp"], [32], [0], [29], step=3, share=0.1)
            >>> print(str(caught[0].message)[:72])
            Global pruning at step 3 left 3 of the 32 units of group 'mlp' (9.38% ke
        """
        rows = zip(names, numels, before, after, strict=True)
        for name, numel, was, now in rows:
            floor = share * numel
            if numel - now > floor or numel - was <= floor or name in self._warned:
                continue
            self._warned.add(name)
            if share == 0:
                warn_emptied(f"Global pruning at step {step}", repr(name), numel, _PRUNER_FIX)
            else:
                warnings.warn(
                    _nearly(name, numel, now, step), UserWarning, stacklevel=user_stacklevel()
                )


_PRUNER_FIX = (
    "Keep a share of every target with min_density=0.05 (say), or leave the last layer dense "
    "with keep_dense=['last'] (or exclude this tensor)."
)


def warn_emptied(cause: str, name: str, numel: int, fix: str, where: str = "") -> None:
    """Warn, at the user's line, that ``cause`` pruned all ``numel`` units of the tensor
    ``name`` (found at ``where``, if given) and so collapsed its layer, and how to avoid it
    (``fix``).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_emptied("This call", "'out.weight'", 40, "Prune less.")
        >>> print(str(caught[0].message)[:66])
        This call pruned all 40 units of 'out.weight': 'out.weight' is 100
    """
    message = (
        f"{cause} pruned all {numel} units of {where or name}: {name} is 100% pruned, and its "
        f"layer no longer passes its input on (layer collapse). {fix}"
    )
    warnings.warn(message, UserWarning, stacklevel=user_stacklevel())


def keeps_any(mask: Tensor) -> bool:
    """Whether ``mask`` (``bool``, or ``0``/``1`` in a floating-point dtype) keeps a unit.

    Reads no more than it must and allocates nothing the size of the mask; a mask with no
    elements (nothing to empty) or on the meta device (nothing to read) counts as keeping.

    Example:
        >>> keeps_any(torch.tensor([0.0, 1.0])), keeps_any(torch.zeros(3, dtype=torch.bool))
        (True, False)
    """
    if mask.numel() == 0 or mask.device.type == "meta":
        return True
    if not mask.is_contiguous():
        return _any(mask)
    flat = mask.view(-1)
    return _any(flat[:_HEAD]) or (flat.numel() > _HEAD and _any(flat[_HEAD:]))


def _any(values: Tensor) -> bool:
    # amax of a float mask reads it in place; Tensor.any on a float tensor allocates a bool copy.
    if values.dtype == torch.bool:
        return bool(values.any())
    return bool(values.amax() != 0)


def _nearly(name: str, numel: int, pruned: int, step: int) -> str:
    kept = numel - pruned
    return (
        f"Global pruning at step {step} left {kept} of the {numel} units of group {name!r} "
        f"({100 * kept / numel:.2f}% kept): the group is nearly gone, and its layer barely passes "
        "its input on (layer collapse). Keep a share of every group with min_density=0.25 (say), "
        "or prune each group to the target on its own with scope='layerwise'."
    )
