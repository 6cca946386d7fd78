"""Reading a mask whatever holds it: the one question every caller asks of both formats.

A tensor ``module.<name>`` is masked either by the reparametrization (``<name>_orig``, a float
``<name>_mask`` buffer and a forward pre-hook: :mod:`~tensorplay.ao.pruning.reparametrization`)
or by a lean mask (a bool ``<name>_mask`` beside the plain parameter:
:mod:`~tensorplay.ao.pruning.masking.lean_masks`). The two cannot both hold one tensor: a lean
mask is only recognised where there is no ``<name>_orig``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.methods import l1_unstructured
    >>> layer = l1_unstructured(nn.Linear(2, 2), "weight", amount=1)
    >>> mask_of(layer, "weight") is layer.weight_mask, mask_of(layer, "bias")
    (True, None)
    >>> saved_mask_names({"w_orig": torch.ones(1), "w_mask": torch.ones(1), "b": torch.ones(1)})
    ['w']
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from tensorplay.ao.pruning.masking.lean_masks import lean_mask, lean_names
from tensorplay.ao.pruning.reparametrization import pruned_parts, reparametrized_names

__all__ = ["mask_of", "saved_mask_names"]


def mask_of(module: nn.Module, name: str) -> Tensor | None:
    """The mask of ``module.<name>`` in either format (0/``False``: pruned), else ``None``.

    Example:
        >>> from torch import nn
        >>> mask_of(nn.Linear(2, 2), "weight") is None
        True
    """
    parts = pruned_parts(module, name)
    if parts is not None:
        return parts.mask
    return lean_mask(module, name)


def saved_mask_names(state_dict: Mapping[str, object]) -> list[str]:
    """Every tensor name ``state_dict`` saves with a mask, in either format: reparametrized
    (``<name>_orig`` and ``<name>_mask``) first, then lean (a bool ``<name>_mask`` beside
    ``<name>``), each in key order.

    Example:
        >>> import torch
        >>> saved_mask_names({"fc.weight": torch.zeros(2), "fc.weight_mask": torch.ones(2).bool()})
        ['fc.weight']
    """
    return reparametrized_names(state_dict) + lean_names(state_dict)
