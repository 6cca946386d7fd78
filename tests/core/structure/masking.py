"""Masking structured units in a model the three ways a pruner can: the oracle for shrinking.

``mask_units(model, keeps, mode)`` masks, for each ``(group, keep)``, the units flagged
``False``: every slice they span. ``"zeros"`` multiplies the parameters by the masks (no mask is
kept), ``"reparametrize"`` applies ``custom_from_mask`` to each parameter (``<name>_orig``,
``<name>_mask``, a forward pre-hook), ``"inplace"`` installs a lean bool ``<name>_mask`` and zeroes
the parameter. A parameter spanned by several groups gets one mask, the product of theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import custom_from_mask
from tensorplay.ao.pruning.masking.lean_masks import apply_masks, install_mask
from tensorplay.ao.pruning.parity.aliases import alias_map
from tensorplay.ao.pruning.structured.dependency.unit_groups import (
    UnitGroup,
    expand_keep,
    shapes_of,
)

Mode = Literal["zeros", "reparametrize", "inplace"]
MODES: tuple[Mode, ...] = ("zeros", "reparametrize", "inplace")


def mask_units(model: nn.Module, keeps: Sequence[tuple[UnitGroup, Tensor]], mode: Mode) -> None:
    shapes = shapes_of(model)
    masks: dict[str, Tensor] = {}
    for group, keep in keeps:
        for name, mask in expand_keep(group, keep, shapes).items():
            masks[name] = masks[name] & mask if name in masks else mask
    aliases = alias_map(model)
    for name, mask in masks.items():
        tied = aliases[name]
        if mode == "zeros":
            with torch.no_grad():
                tied.parameter.mul_(mask)
        elif mode == "reparametrize":
            for module, local in tied.pairs:
                custom_from_mask(module, local, mask)
        else:
            install_mask(tied.pairs, mask)
            apply_masks([tied.parameter], [mask])


def every_other(group: UnitGroup, start: int = 0) -> Tensor:
    """Keep flags dropping units ``start, start + 2, ...`` (at least one unit stays)."""
    keep = (torch.arange(group.size) - start) % 2 != 0
    if not keep.any():
        keep[-1] = True
    return keep
