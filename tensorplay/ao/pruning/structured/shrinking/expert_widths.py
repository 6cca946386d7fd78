"""One width for the experts of a fused tensor: what shrinking an expert's channels needs.

A mixture-of-experts layer holds its experts in fused 3-D tensors (``gate_up_proj`` of shape
``(num_experts, 2 * inter, hidden)``), so every expert of a layer has the same FFN width. Where
the pruned channels leave experts of one layer with different widths (``scope="global"`` ranks
every expert's channels together), each expert keeps as many channels as the widest: an expert
with fewer keeps some of its pruned channels, chosen first by index, and they stay all zero. A
channel whose gate row, up row and down column are zero adds exactly zero to the expert's
output (``act(0) * 0``), so the shrunk model still computes what the masked one computed; the
:class:`~tensorplay.ao.pruning.structured.shrinking.shrink_report.ShrinkReport` counts them
(``padded_units``). Layers whose widths then differ are recorded per layer and load with
:func:`~tensorplay.ao.pruning.load_shrunk`.

The width is also rounded up to a multiple of 16 bytes (4 channels in ``float32``, 8 in
``bfloat16``; never past the width before): transformers' default experts kernel
(``grouped_mm``) refuses fused tensors whose rows are not 16-byte aligned, so an odd width
would shrink a model that cannot run.

Example:
    >>> import torch
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
    >>> groups = [
    ...     UnitGroup(f"mlp.experts[{e}]", "channel", 4, (Slice("mlp.experts.down", 2, expert=e),))
    ...     for e in (0, 1)
    ... ]
    >>> keeps = [(groups[0], torch.tensor([True, True, True, False])),
    ...          (groups[1], torch.tensor([False, True, False, False]))]
    >>> evened, padded = even_expert_widths(keeps, {"mlp.experts.down": 8})  # float64
    >>> [keep.int().tolist() for _, keep in evened], padded  # 3 wide, then 4 (32 bytes)
    ([[1, 1, 1, 1], [1, 1, 1, 1]], 4)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup, expert_width_step
from tensorplay.ao.pruning.structured.shrinking.shrink_report import GroupWidth

__all__ = ["even_expert_widths", "fold_expert_rows"]

_EXPERT = re.compile(r"^(?P<module>.+)\[(?P<expert>\d+)\]$")


def _fused(group: UnitGroup) -> tuple[tuple[str, int], ...]:
    """The ``(tensor, dim)`` pairs the group's expert slices lie along (empty: no expert's)."""
    return tuple(
        sorted({(p.parameter, p.dim) for p in group.slices if p.expert is not None and p.dim})
    )


def even_expert_widths(
    keeps: Sequence[tuple[UnitGroup, Tensor]], element_sizes: Mapping[str, int]
) -> tuple[list[tuple[UnitGroup, Tensor]], int]:
    """``keeps`` (each group's keep flags) with the experts of each fused tensor kept to one
    width (see the module docstring), and how many pruned channels that keeps.

    Args:
        keeps: Each group with one keep flag per unit.
        element_sizes: The bytes per element of each fused tensor, by name.
    """
    widest: dict[tuple[tuple[str, int], ...], int] = {}
    for group, keep in keeps:
        fused = _fused(group)
        if fused:
            widest[fused] = max(widest.get(fused, 0), int(keep.sum()))
    for fused, width in widest.items():
        group = next(group for group, _ in keeps if _fused(group) == fused)
        step = expert_width_step(group, element_sizes)
        widest[fused] = min(-(-width // step) * step, group.size)
    evened: list[tuple[UnitGroup, Tensor]] = []
    padded = 0
    for group, keep in keeps:
        fused = _fused(group)
        missing = widest[fused] - int(keep.sum()) if fused else 0
        if missing:
            keep = keep.clone()
            keep[torch.nonzero(~keep).flatten()[:missing]] = True
            padded += missing
        evened.append((group, keep))
    return evened, padded


def fold_expert_rows(
    rows: Sequence[GroupWidth], keeps: Sequence[tuple[UnitGroup, Tensor]]
) -> list[GroupWidth]:
    """``rows`` with the rows of a fused tensor's experts (``"<module>[e]"``) folded into one
    row per module, at the first one's place: every expert's width before and after (one for
    all, after :func:`even_expert_widths`).

    Example:
        >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
        >>> groups = [UnitGroup(f"e[{i}]", "channel", 4, (Slice("w", 2, expert=i),))
        ...           for i in (0, 1)]
        >>> keeps = [(group, torch.tensor([True, True, False, False])) for group in groups]
        >>> rows = [GroupWidth(group.name, "channel", 4, 2) for group in groups]
        >>> fold_expert_rows(rows, keeps)
        [GroupWidth(name='e', kind='channel', before=4, after=2)]
    """
    experts = {group.name: keep for group, keep in keeps if _fused(group)}
    folded: list[GroupWidth] = []
    seen: set[str] = set()
    for row in rows:
        found = _EXPERT.match(row.name)
        if row.name not in experts or found is None:
            folded.append(row)
            continue
        module = found["module"]
        if module not in seen:
            seen.add(module)
            folded.append(GroupWidth(module, row.kind, row.before, int(experts[row.name].sum())))
    return folded
