"""A tensor's mask read or dropped whatever holds it, for code that removes units physically.

Shrinking reads which elements of a tensor are kept before it cuts, and drops the masks of the
tensors it cuts. The tensors come as
:class:`~tensorplay.ao.pruning.parity.aliases.TiedParameter`: one parameter with every
``(module, name)`` that holds it, each of which may hold it under a reparametrization
(``<name>_orig``, ``<name>_mask``, a forward pre-hook) or a lean mask, or under none.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.aliases import alias_map
    >>> from tensorplay.ao.pruning.parity.methods import l1_unstructured
    >>> layer = l1_unstructured(nn.Linear(2, 2), "weight", amount=2)
    >>> tied = alias_map(layer)["weight"]
    >>> int(kept_elements(tied).sum())
    2
    >>> drop_masks([tied])
    >>> hasattr(layer, "weight_mask"), int((layer.weight != 0).sum())
    (False, 2)
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from tensorplay.ao.pruning.masking.lean_masks import apply_masks, lean_mask, remove_mask
from tensorplay.ao.pruning.masking.readers import masked_values
from tensorplay.ao.pruning.parity.aliases import TiedParameter
from tensorplay.ao.pruning.parity.reparametrization import pruned_parts

__all__ = ["drop_masks", "kept_elements", "read_kept"]


def kept_elements(tied: TiedParameter) -> Tensor:
    """``True`` where an element of ``tied`` is kept: its mask where a holder masks it, else
    where its value is not zero.

    Args:
        tied: The parameter and its holders.

    Returns:
        A bool tensor of the parameter's shape.
    """
    return read_kept(tied)[0]


def read_kept(tied: TiedParameter) -> tuple[Tensor, bool]:
    """:func:`kept_elements` of ``tied``, and whether a holder masks it (either mode).

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.parity.aliases import alias_map
        >>> kept, masked = read_kept(alias_map(nn.Linear(2, 2))["weight"])
        >>> kept.all().item(), masked
        (True, False)
    """
    with torch.no_grad():
        for module, local in tied.pairs:
            found = masked_values(module, local)
            if found is not None:
                return found[1] != 0, True
        return tied.parameter != 0, False


def drop_masks(tensors: Iterable[TiedParameter]) -> None:
    """Drop the masks of ``tensors`` in either mode, from every holder, keeping the masked
    values (pruned elements hold ``+0.0``); a tensor without a mask is left as it is.

    Args:
        tensors: The parameters, each with its holders (one entry per parameter).
    """
    for tied in tensors:
        masked = False
        for module, local in tied.pairs:
            parts = pruned_parts(module, local)
            if parts is not None:
                parts.hook.remove(module)
                del module._forward_pre_hooks[parts.key]
                masked = True
            elif (mask := lean_mask(module, local)) is not None:
                apply_masks([module._parameters[local]], [mask])  # type: ignore[list-item]
                remove_mask([(module, local)])
                masked = True
        if masked:
            module, local = tied.pairs[0]
            with torch.no_grad():
                module._parameters[local].add_(0.0)  # type: ignore[union-attr]  # -0.0 -> +0.0
