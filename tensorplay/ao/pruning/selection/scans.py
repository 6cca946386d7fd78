"""What the k-th key engine's passes write on the way: nothing, speculative or certain clears.

:func:`~.cut.find_cut` decides the cut the same way for every caller; a :class:`Scan` says how
its pass over the sampled band ``[lo, hi]`` and its pass gathering a narrowed interval read and
write, so that a caller whose masks are written on the way saves a pass:

* :class:`Scan` writes nothing: one fused pass counts below ``lo`` and gathers the band; the
  caller writes the masks at the cut afterwards (in place, under caps).
* :class:`Speculative` (out of place) writes the keep masks ``key >= lo`` in that same pass; if
  the band brackets the ``k``-th key, only its candidates at or below the cut are left to clear.
* :class:`Certain` (in place, the masks are the eligibility) first counts below ``lo``; if fewer
  than ``k`` are, all of them are certainly pruned, so a second pass clears them in the masks
  (and zeroes them in the tensors to zero) while it gathers the band. A band that then misses
  leaves a smaller selection among the units left.

Every count a scan returns is summed over the ranks; the candidates stay on their ranks.
"""

from __future__ import annotations

import math

from torch import Tensor

from tensorplay.ao.pruning.selection.passes import Band, fused_pass
from tensorplay.ao.pruning.selection.plan import Selection
from tensorplay.ao.pruning.selection.stream import count_under, write_band

__all__ = ["Certain", "Scan", "Speculative"]


class Scan:
    """Passes that write nothing (the caller writes the masks at the cut).

    Example:
        >>> import torch
        >>> from tensorplay.ao.pruning.selection.keys import AbsKeys
        >>> selection = Selection([torch.tensor([0.3, 0.1, 0.2])], [None], AbsKeys(), [])
        >>> band = Scan().band(selection, 1, 0.15, 0.25)
        >>> band.below, band.size, band.written
        (1, 1, False)
    """

    def band(self, selection: Selection, k: int, lo: float, hi: float) -> Band:
        """The pass over the sampled band: counts below ``lo`` and the candidates in ``[lo, hi]``.

        Args:
            selection: the selection.
            k: how many eligible units are pruned.
            lo: the band's lower key.
            hi: the band's upper key.

        Returns:
            The band, its counts summed over the ranks.
        """
        return _summed(selection, self._fused(selection, lo, hi, check=True, bounded=True))

    def interval(self, selection: Selection, low: float, high: float) -> Band:
        """The pass gathering ``[low, high]``, known to hold at most the cap (not bounded)."""
        return self._fused(selection, low, high, check=False, bounded=False)

    def _fused(
        self, selection: Selection, lo: float, hi: float, *, check: bool, bounded: bool
    ) -> Band:
        return fused_pass(selection, lo, hi, None, check=check, bounded=bounded)


class Speculative(Scan):
    """Passes that write the keep masks ``key >= lo`` into ``outs`` (out of place).

    Args:
        outs: the flat keep masks, written in full by each pass.
    """

    def __init__(self, outs: list[Tensor]) -> None:
        self.outs = outs

    def _fused(
        self, selection: Selection, lo: float, hi: float, *, check: bool, bounded: bool
    ) -> Band:
        band = fused_pass(selection, lo, hi, self.outs, check=check, bounded=bounded)
        band.written = True
        return band


class Certain(Scan):
    """A band pass that clears, in the caller's masks, the units certainly pruned (in place).

    Args:
        outs: the flat bool keep masks, which are also the eligibility; updated in place.
        zero: per source, a flat tensor multiplied by its new keep mask in the same pass.
    """

    def __init__(self, outs: list[Tensor], zero: list[Tensor | None]) -> None:
        self.outs = outs
        self.zero = zero

    def band(self, selection: Selection, k: int, lo: float, hi: float) -> Band:
        """Count below ``lo``; if fewer than ``k``, clear them and gather ``[lo, hi]``.

        After a clear the selection's eligibility is the masks (:attr:`Band.cleared` units
        fewer), so a band that misses leaves the rest to select among the units left.
        """
        if lo == -math.inf:  # every unit is in the band: nothing certain to clear
            return super().band(selection, k, lo, hi)
        below = selection.comm.sum([count_under(selection, lo, check=True)])[0]
        if below >= k:  # the sample put lo too high: nothing written
            return Band(below=below)
        band = write_band(selection, lo, hi, self.outs, self.zero)
        size, overflow = selection.comm.sum([band.size, band.overflow])
        band.size, band.overflow = size, bool(overflow)
        band.below = band.cleared = below
        band.written = True
        selection.eligible = list(self.outs)  # the masks now say which units are left
        return band


def _summed(selection: Selection, band: Band) -> Band:
    """``band`` with its counts summed over the ranks (its candidates stay local)."""
    below, size, overflow = selection.comm.sum([band.below, band.size, band.overflow])
    band.below, band.size, band.overflow = below, size, bool(overflow)
    return band
