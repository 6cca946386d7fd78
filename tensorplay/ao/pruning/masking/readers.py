"""Reading a mask whatever holds it: the one question every caller asks of both formats.

A tensor ``module.<name>`` is masked either by the reparametrization (``<name>_orig``, a float
``<name>_mask`` buffer and a forward pre-hook:
:mod:`~tensorplay.ao.pruning.parity.reparametrization`) or by a lean mask (a bool ``<name>_mask``
beside the plain parameter: :mod:`~tensorplay.ao.pruning.masking.lean_masks`). The two cannot both
hold one tensor: a lean mask is only recognised where there is no ``<name>_orig``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.methods import l1_unstructured
    >>> layer = l1_unstructured(nn.Linear(2, 2), "weight", amount=1)
    >>> mask_of(layer, "weight") is layer.weight_mask, mask_of(layer, "bias")
    (True, None)
    >>> saved_mask_names({"w_orig": torch.ones(1), "w_mask": torch.ones(1), "b": torch.ones(1)})
    ['w']
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from tensorplay.ao.pruning.masking.lean_masks import (
    MASK_SUFFIX,
    lean_mask,
    lean_names,
    pruned_zero_counts,
)
from tensorplay.ao.pruning.parity.reparametrization import (
    count_pruned,
    pruned_parts,
    reparametrized_names,
)

__all__ = ["mask_of", "masked_values", "pruned_count_of", "saved_mask_keys", "saved_mask_names"]


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


def pruned_count_of(module: nn.Module, name: str) -> int | None:
    """The pruned units of a masked ``module.<name>`` as the model computes with them: the
    zeros of a reparametrized mask (the forward multiplies by it), the units of a lean mask
    whose weights are zero (a weight trained back is not pruned); ``None`` if not masked.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.masking.lean_masks import install_mask
        >>> layer = nn.Linear(2, 1, bias=False)
        >>> install_mask([(layer, "weight")], torch.tensor([[False, True]]))
        >>> pruned_count_of(layer, "weight")  # the pruned weight was never zeroed
        0
    """
    parts = pruned_parts(module, name)
    if parts is not None:
        return count_pruned(parts)
    mask = lean_mask(module, name)
    if mask is None:
        return None
    return pruned_zero_counts([module._parameters[name]], [mask])[0]  # type: ignore[list-item]


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


def masked_values(module: nn.Module, name: str) -> tuple[Tensor, Tensor] | None:
    """``(values, mask)`` of a masked ``module.<name>``: the values its mask applies to (the
    ``<name>_orig`` parameter, or the lean parameter itself) and the mask; else ``None``.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.parity.methods import identity
        >>> layer = identity(nn.Linear(2, 2), "weight")
        >>> values, mask = masked_values(layer, "weight")
        >>> values is layer.weight_orig, mask is layer.weight_mask
        (True, True)
    """
    parts = pruned_parts(module, name)
    if parts is not None:
        return parts.orig, parts.mask
    mask = lean_mask(module, name)
    if mask is None:
        return None
    return module._parameters[name], mask  # type: ignore[return-value]


def saved_mask_keys(state_dict: Mapping[str, object]) -> dict[str, tuple[str, str]]:
    """Per name ``state_dict`` saves with a mask (:func:`saved_mask_names`), the keys of its
    values and of its mask: ``(<name>_orig, <name>_mask)`` or, lean, ``(<name>, <name>_mask)``.

    Example:
        >>> import torch
        >>> saved_mask_keys({"w_orig": torch.ones(1), "w_mask": torch.ones(1)})
        {'w': ('w_orig', 'w_mask')}
    """
    keys = {name: (name + "_orig", name + MASK_SUFFIX) for name in reparametrized_names(state_dict)}
    keys.update({name: (name, name + MASK_SUFFIX) for name in lean_names(state_dict)})
    return keys
