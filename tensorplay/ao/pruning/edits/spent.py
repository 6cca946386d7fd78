"""A pruner spent by shrinking: the tensors :func:`~tensorplay.ao.pruning.shrink` changed.

Shrinking changes the model under any pruner made before it: every tensor its groups span loses
its mask (the pruning is made permanent) and its pruned units, and a removed block leaves the
model. Such a pruner's units, masks and shapes describe a model that is gone, so what it would
read or write through its targets (counts, reports, pruning steps, its state) would be silently
wrong. :func:`~tensorplay.ao.pruning.shrink` records each ``(module, name)`` it spans, weakly and
numbered by its call; a :class:`ShrinkWatch` made with a pruner asks whether any of its targets
was spanned since, and the pruner then raises :class:`SpentPrunerError` instead.

Example:
    >>> import torch
    >>> from torch import nn
    >>> layer = nn.Linear(2, 2)
    >>> watch = ShrinkWatch([(layer, "weight")])
    >>> watch.spanned() is None
    True
    >>> record_shrink([(layer, "weight")])
    >>> watch.spanned() == (layer, "weight"), ShrinkWatch([(layer, "weight")]).spanned()
    (True, None)
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from torch import nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.pair import Pair

__all__ = ["ShrinkWatch", "SpentPrunerError", "record_shrink"]


class SpentPrunerError(RuntimeError):
    """A pruner used after :func:`~tensorplay.ao.pruning.shrink` changed its targets: its units,
    masks and counts are those of the model before shrinking. Read its report (and save its
    state) before shrinking; build a new :class:`~tensorplay.ao.pruning.Pruner` on the shrunk
    model to prune or count it.

    Example:
        >>> issubclass(SpentPrunerError, RuntimeError)
        True
    """


class _ShrinkRecord:
    """How many times shrink ran, and per ``(module, name)`` the last run that spanned it."""

    def __init__(self) -> None:
        self.runs = 0
        self.spanned: weakref.WeakKeyDictionary[nn.Module, dict[str, int]] = (
            weakref.WeakKeyDictionary()
        )


_RECORD = _ShrinkRecord()


def record_shrink(pairs: Iterable[Pair]) -> None:
    """Record one run of shrinking over ``pairs`` (every holder of every tensor it spans)."""
    _RECORD.runs += 1
    before: list[tuple[dict[str, int], str, int | None]] = []
    for module, name in pairs:
        spanned = _RECORD.spanned.setdefault(module, {})
        before.append((spanned, name, spanned.get(name)))
        spanned[name] = _RECORD.runs

    def forget() -> None:  # a shrink taken back by its transaction spent no pruner
        for spanned, name, run in reversed(before):
            if run is None:
                spanned.pop(name, None)
            else:
                spanned[name] = run

    changes.on_undo(forget)


class ShrinkWatch:
    """Whether shrinking has spanned one of ``pairs`` since the watch was made.

    Cheap when nothing was shrunk since it last looked (one comparison), so a pruner asks at
    every step and an observing forward hook at every forward.

    Args:
        pairs: The ``(module, name)`` of every tensor watched (all holders of a tied one).
    """

    def __init__(self, pairs: Iterable[Pair]) -> None:
        self._pairs = tuple(pairs)
        self._made_at = _RECORD.runs
        self._looked_at = _RECORD.runs

    def spanned(self) -> Pair | None:
        """The first watched ``(module, name)`` that a run of shrinking since this watch was
        made spanned; ``None`` if none."""
        if _RECORD.runs == self._looked_at:
            return None
        for module, name in self._pairs:
            if _RECORD.spanned.get(module, {}).get(name, 0) > self._made_at:
                return module, name
        self._looked_at = _RECORD.runs  # none of them: the next look starts from here
        return None
