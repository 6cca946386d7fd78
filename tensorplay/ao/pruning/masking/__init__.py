"""How a mask is held: one protocol, one implementation per ``masking=`` value.

* :mod:`~tensorplay.ao.pruning.masking.mode`: the :class:`MaskingMode` protocol, what the pruner
  asks of a mode;
* :mod:`~tensorplay.ao.pruning.masking.reparametrized`: ``"reparametrize"``, torch's
  ``<name>_orig``/``<name>_mask``/hook;
* :mod:`~tensorplay.ao.pruning.masking.lean`: ``"inplace"``, the lean bool masks, with their
  primitives (:mod:`~tensorplay.ao.pruning.masking.lean_masks`), optimizer hooks
  (:mod:`~tensorplay.ao.pruning.masking.optimizer_hooks`) and gradient hooks
  (:mod:`~tensorplay.ao.pruning.masking.gradient_masks`);
* :mod:`~tensorplay.ao.pruning.masking.readers`: a tensor's mask whichever mode holds it.

:func:`masking_mode` is the one place a ``masking=`` string becomes a mode.

Example:
    >>> type(masking_mode("reparametrize")).__name__, type(masking_mode("inplace")).__name__
    ('ReparametrizedMasks', 'LeanMasks')
"""

from __future__ import annotations

from collections.abc import Callable

from tensorplay.ao.pruning.masking.lean import LeanMasks
from tensorplay.ao.pruning.masking.mode import MaskingMode
from tensorplay.ao.pruning.masking.readers import mask_of, saved_mask_names
from tensorplay.ao.pruning.masking.reparametrized import ReparametrizedMasks

__all__ = [
    "LeanMasks",
    "MASKING_MODES",
    "MaskingMode",
    "ReparametrizedMasks",
    "mask_of",
    "masking_mode",
    "saved_mask_names",
]

MASKING_MODES: dict[str, Callable[[], MaskingMode]] = {
    ReparametrizedMasks.name: ReparametrizedMasks,
    LeanMasks.name: LeanMasks,
}
"""Each ``masking=`` value and the mode it makes; a new mode is one more entry."""


def masking_mode(masking: str) -> MaskingMode:
    """A new mode object for the ``masking=`` value (checked by ``PrunerConfig``).

    Raises:
        ValueError: An unknown value.
    """
    make = MASKING_MODES.get(masking)
    if make is None:
        raise ValueError(
            f"Expected `masking` to be one of {sorted(MASKING_MODES)}, but got {masking!r}."
        )
    return make()
