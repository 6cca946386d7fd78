"""Selection under per-source caps: no source gives up more than its cap of units.

The result equals the greedy rule: take units lowest key first (tie rule of
:mod:`tensorplay.ao.pruning.selection`), skipping the units of a source that has reached its cap,
until ``k`` are taken. It is computed with a few uncapped selections:

1. select ``k`` among the sources not yet settled;
2. every source that gave more than its cap is settled at its cap: its ``cap`` lowest units. In
   the greedy order it reaches its cap too, since skipping units only raises the threshold, and
   the units it then gives are its lowest;
3. the rest of ``k`` is selected among the other sources; repeat until no source is over.

Each round settles at least one source, so there are at most as many rounds as sources.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection.keys import KeySpec
from tensorplay.ao.pruning.selection.masks import keep_masks

__all__ = ["SubsetKeys", "capped_keep_masks", "settle_caps"]

R = TypeVar("R")
#: ``(sources, k) -> keep factors`` of those sources: ``0`` for the ``k`` selected units.
SelectFn = Callable[[list[int], int], list[R]]


class SubsetKeys(KeySpec):
    """The keys of some sources of a selection, as they are in the whole selection.

    Generated keys (:class:`~.keys.UniformKeys`) depend on the source index; selecting among
    a subset must see the same keys as the whole selection.

    Args:
        keys: the keys of the whole selection.
        sources: the index in the whole selection of each source of the subset.

    Example:
        >>> from tensorplay.ao.pruning.selection.keys import UniformKeys
        >>> keys = UniformKeys(seed=3)
        >>> whole = keys.chunk_keys(2, 0, torch.zeros(4), torch.empty(4))
        >>> part = SubsetKeys(keys, [2]).chunk_keys(0, 0, torch.zeros(4), torch.empty(4))
        >>> bool(torch.equal(whole, part))
        True
    """

    def __init__(self, keys: KeySpec, sources: Sequence[int]) -> None:
        self.keys = keys
        self.sources = list(sources)
        self.dtype = keys.dtype
        self.reads_scores = keys.reads_scores

    def chunk_keys(self, source: int, start: int, scores: Tensor, out: Tensor) -> Tensor:
        """The whole selection's keys of the chunk (see :meth:`KeySpec.chunk_keys`)."""
        return self.keys.chunk_keys(self.sources[source], start, scores, out)

    def sample_keys(self, scores: Tensor, index: Tensor) -> Tensor:
        """The whole selection's keys (see :meth:`KeySpec.sample_keys`)."""
        return self.keys.sample_keys(scores, index)


def settle_caps(
    select: SelectFn[R],
    k: int,
    caps: Sequence[int],
    given: Callable[[R], int] | None = None,
) -> dict[int, R]:
    """The keep factors of a capped selection of ``k`` units, by source (rounds in the module
    docstring); a source absent from the result gives no unit.

    Args:
        select: the uncapped selection among some sources: one result per source.
        k: how many units to select, at most the sum of the caps (each cap at most the source's
            eligible units).
        caps: the most units each source may give.
        given: how many units a source's result selects (default: the zeros of a keep factor).

    Raises:
        ValueError: ``k`` is negative or over the sum of the caps.

    Example:
        >>> scores = [torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 0.6])]
        >>> def select(sources, k):
        ...     masks = keep_masks([scores[i] for i in sources], [None] * len(sources), k,
        ...                        AbsKeys(), [torch.uint8] * len(sources))
        ...     return masks
        >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
        >>> {i: keep.tolist() for i, keep in settle_caps(select, 3, [1, 2]).items()}
        {0: [0, 1, 1], 1: [0, 0]}
    """
    if not 0 <= k <= sum(caps):
        raise ValueError(
            f"Expected `k` to be between 0 and the sum of the caps, {sum(caps)}, but got {k}."
        )
    count: Callable[[R], int] = given if given is not None else _zeros  # type: ignore[assignment]
    settled: dict[int, R] = {}
    active = [i for i, cap in enumerate(caps) if cap > 0]
    remaining = k
    while remaining > 0:
        trial = select(active, remaining)
        over = [i for i, result in zip(active, trial, strict=True) if count(result) > caps[i]]
        if not over:
            settled.update(zip(active, trial, strict=True))
            break
        for i in over:
            settled[i] = select([i], caps[i])[0]
            remaining -= caps[i]
        active = [i for i in active if i not in over]
    return settled


def capped_keep_masks(
    scores: Sequence[Tensor],
    eligible: Sequence[Tensor | None],
    k: int,
    caps: Sequence[int],
    keys: KeySpec,
    *,
    labels: Sequence[str] | None = None,
) -> list[Tensor]:
    """:func:`~.masks.keep_masks` (``uint8`` keep factors) with at most ``caps[i]`` units
    selected from source ``i``: the greedy result of the module docstring.

    Args:
        scores: the sources' scores.
        eligible: per source, its earlier mask (``1``: eligible) or ``None``.
        k: how many units to select, at most the sum of the caps.
        caps: per source, the most units it may give (at most its eligible units).
        keys: how keys follow from scores.
        labels: names of the sources for error messages.

    Example:
        >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
        >>> masks = capped_keep_masks(
        ...     [torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 0.6])], [None, None], 3,
        ...     caps=[1, 5], keys=AbsKeys(),
        ... )
        >>> [mask.tolist() for mask in masks]
        [[0, 1, 1], [0, 0]]
    """
    names = list(labels) if labels else [f"source {i}" for i in range(len(scores))]

    def select(sources: list[int], count: int) -> list[Tensor]:
        return keep_masks(
            [scores[i] for i in sources],
            [eligible[i] for i in sources],
            count,
            SubsetKeys(keys, sources),
            [torch.uint8] * len(sources),
            labels=[names[i] for i in sources],
        )

    settled = settle_caps(select, k, caps)
    return [
        settled[i] if i in settled else torch.ones(s.shape, dtype=torch.uint8, device=s.device)
        for i, s in enumerate(scores)
    ]


def _zeros(keep: Tensor) -> int:
    """The units a keep factor selects (its zeros)."""
    return keep.numel() - int(torch.count_nonzero(keep))
