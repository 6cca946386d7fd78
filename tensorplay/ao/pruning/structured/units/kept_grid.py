"""What a model's masks keep, read as a grid per tensor: the count a search plans with.

Structured masks keep whole index ranges: a tensor masked by channels, heads, hidden channels or
layers keeps, along each dimension, the indices some kept element lies on, and the elements it
keeps after :func:`~tensorplay.ao.pruning.shrink` are the product of those extents (zero for a
tensor masked whole: a removed layer's; a fused expert tensor's experts each as wide as the
widest). :func:`kept_extents` reads the extents of every
tensor (tied ones once, a tensor without a mask whole), :func:`kept_count` their sum, and
:func:`unit_price` what one more unit of a group would remove from them: the planner of a search
(:mod:`~tensorplay.ao.pruning.pruner.search`) sizes each kind's share with it, on the model as the
kinds before left it. The count is the shrunk model's where every group keeps at least one unit;
the search still counts each candidate by shrinking it.

Example:
    >>> import torch
    >>> from torch import Tensor, nn
    >>> from tensorplay.ao.pruning.parity.methods import custom_from_mask
    >>> layer = nn.Linear(4, 3)  # 12 weights and 3 biases
    >>> mask = torch.ones(3, 4)
    >>> mask[1] = 0  # one output row
    >>> _ = custom_from_mask(layer, "weight", mask)
    >>> kept_extents(layer)["weight"], kept_count(layer)  # 2 rows of 4, and 3 biases
    ((2, 4), 11)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.masking.held_tensors import kept_elements
from tensorplay.ao.pruning.masking.readers import masked_values
from tensorplay.ao.pruning.parity.aliases import TiedParameter, alias_map
from tensorplay.ao.pruning.structured.dependency.blocks import find_blocks
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup

__all__ = ["kept_count", "kept_extents", "masked_blocks", "unit_price"]


def kept_extents(model: nn.Module, experts: Collection[str] = ()) -> dict[str, tuple[int, ...]]:
    """Per tensor of ``model`` (its canonical name, tied ones once), the indices kept along each
    dimension: those some element its mask keeps lies on (all of them without a mask; zeros for a
    tensor masked whole). A fused expert tensor named in ``experts`` (dim 0 indexes its experts)
    keeps its experts that keep something and, along each other dimension, as many indices as
    its widest expert: what shrinking leaves, each expert padded to the widest.

    Example:
        >>> kept_extents(nn.Linear(2, 3))
        {'weight': (3, 2), 'bias': (3,)}
    """
    found: dict[str, tuple[int, ...]] = {}
    with torch.no_grad():
        for name, tied in alias_map(model).items():
            if name != tied.name:  # a tied parameter once, under its canonical name
                continue
            mask = None
            for module, local in tied.pairs:
                held = masked_values(module, local)
                if held is not None:
                    mask = held[1] != 0
                    break
            shape = tuple(tied.parameter.shape)
            if mask is None:
                found[name] = shape
            elif not bool(mask.any()):
                found[name] = tuple(0 for _ in shape)
            elif name in experts:
                kept = mask.flatten(1).any(dim=1)
                widths = [
                    max(_extents(mask[index])[dim] for index in kept.nonzero().flatten().tolist())
                    for dim in range(mask.dim() - 1)
                ]
                found[name] = (int(kept.sum()), *widths)
            else:
                found[name] = _extents(mask)
    return found


def _extents(mask: Tensor) -> tuple[int, ...]:
    """Along each dimension of ``mask``, the indices some kept element lies on."""
    if mask.dim() == 1:
        return (int(mask.sum()),)
    return tuple(
        int(mask.any(dim=[d for d in range(mask.dim()) if d != dim]).sum())
        for dim in range(mask.dim())
    )


def kept_count(model: nn.Module, experts: Collection[str] = ()) -> int:
    """The elements the kept grids hold, summed over the tensors (tied ones once; ``experts``
    as :func:`kept_extents`).

    Example:
        >>> kept_count(nn.Linear(2, 3))
        9
    """
    return sum(math.prod(extents) for extents in kept_extents(model, experts).values())


def unit_price(
    group: UnitGroup, extents: Mapping[str, tuple[int, ...]], aliases: Mapping[str, str]
) -> int:
    """The elements one unit of ``group`` removes from the grids ``extents`` (a whole tensor
    slice: all it keeps; a slice along a dimension: its width times the other dimensions' kept
    extents; one expert's slice: that expert's part); ``aliases`` maps each name to its
    canonical one.

    Example:
        >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
        >>> row = UnitGroup("fc", "channel", 3, (Slice("weight", 0), Slice("bias", 0)))
        >>> unit_price(row, {"weight": (3, 2), "bias": (3,)}, {})
        3
    """
    seen: set[tuple[str, int | None, int, int | None]] = set()
    price = 0
    for piece in group.slices:
        name = aliases.get(piece.parameter, piece.parameter)
        key = (name, piece.dim, piece.offset, piece.expert)
        if key in seen:
            continue
        seen.add(key)
        kept = extents[name]
        if piece.dim is None:
            price += math.prod(kept)
            continue
        others = [size for dim, size in enumerate(kept) if dim != piece.dim]
        if piece.expert is not None:
            others = [size for dim, size in enumerate(kept) if dim not in (0, piece.dim)]
        price += piece.width * math.prod(others)
    return price


def masked_blocks(
    model: nn.Module, aliases: Mapping[str, TiedParameter] | None = None
) -> list[str]:
    """The blocks of ``model`` (a Hugging Face model of a known family) whose every parameter
    is masked whole: pruned layers, which :func:`~tensorplay.ao.pruning.shrink` removes
    (``aliases``: :func:`~tensorplay.ao.pruning.parity.aliases.alias_map` of ``model``, if
    read already).

    Example:
        >>> masked_blocks(nn.Linear(2, 2))  # no blocks
        []
    """
    found = find_blocks(model)
    if found is None:
        return []
    aliases = alias_map(model) if aliases is None else aliases
    dropped = []
    for name in found.block_names():
        held = [tied for param, tied in aliases.items() if param.startswith(f"{name}.")]
        if held and not any(bool(kept_elements(tied).any()) for tied in held):
            dropped.append(name)
    return dropped
