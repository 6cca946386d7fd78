"""Signed scores as non-negative keys of the same order, exactly.

The selection compares non-negative keys (:mod:`~tensorplay.ao.pruning.selection.keys`), and
``l1_unstructured`` ranks by ``|score|``; a signed score (movement) must be ranked by its value.
:func:`ordered` maps each value to the float integer of its order-preserving bit pattern
(negative values flipped, positive ones offset by half the range): non-negative, exact (a 32-bit
pattern is a float64 integer, a 16-bit one a float32 integer: 8 or 4 bytes per unit while a
pruning step ranks), equal values to equal keys (``-0.0`` and ``+0.0`` alike), and ``|key|``
ordered as the values.

Example:
    >>> import torch
    >>> keys = ordered(torch.tensor([-2.0, -0.0, 0.0, 1.5, -1e-30]))
    >>> keys.argsort().tolist(), bool((keys >= 0).all()), bool(keys[1] == keys[2])
    ([0, 4, 1, 2, 3], True, True)
"""

from __future__ import annotations

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import local_part
from tensorplay.ao.pruning.selection.shards import placed_like

__all__ = ["ordered"]

# (bits, the integer dtype of their pattern, the key dtype that holds every pattern exactly)
_LAYOUTS = {
    torch.bfloat16: (16, torch.int16, torch.float32),
    torch.float16: (16, torch.int16, torch.float32),
    torch.float32: (32, torch.int32, torch.float64),
}


def ordered(scores: Tensor) -> Tensor:
    """Non-negative keys ordered as ``scores`` (placed like them; see the module): float32 keys
    for 16-bit scores (a bfloat16 accumulator), float64 for float32 ones."""
    values = local_part(scores).detach()
    if values.dtype not in _LAYOUTS:
        values = values.to(torch.float32)
    width, integer, key = _LAYOUTS[values.dtype]
    values = values + 0.0  # -0.0 -> +0.0
    bits = values.view(integer).to(torch.int64)
    low = (1 << width) - 1
    keys = torch.where(bits >= 0, bits + (1 << (width - 1)), low - (bits & low))
    return placed_like(keys.to(key), scores)
