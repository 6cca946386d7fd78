"""Signed scores as non-negative keys of the same order, exactly.

The selection compares non-negative keys (:mod:`~tensorplay.ao.pruning.selection.keys`), and
``l1_unstructured`` ranks by ``|score|``; a signed score (movement) must be ranked by its value.
:func:`ordered` maps each float32 value to the float64 integer of its order-preserving bit
pattern (negative values flipped, positive ones offset by ``2**31``): non-negative, exact (every
32-bit integer is a float64), equal values to equal keys (``-0.0`` and ``+0.0`` alike), and
``|key|`` ordered as the values. Any ``bfloat16``/``float16``/``float32`` score maps exactly.

Example:
    >>> import torch
    >>> keys = ordered(torch.tensor([-2.0, -0.0, 0.0, 1.5, -1e-30]))
    >>> keys.argsort().tolist(), bool((keys >= 0).all()), bool(keys[1] == keys[2])
    ([0, 4, 1, 2, 3], True, True)
"""

from __future__ import annotations

import torch
from torch import Tensor

from tensorplay.ao.pruning.importance.placed import like, piece

__all__ = ["ordered"]

_SIGN = 1 << 31
_LOW_32 = (1 << 32) - 1


def ordered(scores: Tensor) -> Tensor:
    """Non-negative float64 keys ordered as ``scores`` (placed like them; see the module)."""
    values = piece(scores).detach().to(torch.float32) + 0.0  # -0.0 -> +0.0
    bits = values.view(torch.int32).to(torch.int64)
    keys = torch.where(bits >= 0, bits + _SIGN, _LOW_32 - (bits & _LOW_32))
    return like(keys.to(torch.float64), scores)
