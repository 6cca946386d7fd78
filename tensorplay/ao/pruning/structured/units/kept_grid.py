"""What a model's masks keep, read as a grid per tensor: the count a search plans with.

Structured masks keep whole index ranges: a tensor masked by channels, heads, hidden channels or
layers keeps, along each dimension, the indices some kept element lies on, and the elements it
keeps after :func:`~tensorplay.ao.pruning.shrink` are the product of those extents (zero for a
tensor masked whole: a removed layer's; a fused expert tensor's experts each as wide as the
widest). :func:`read_kept_grid` reads the model's masks once into a :class:`KeptGrid`: the
extents of every tensor (tied ones once, a tensor without a mask whole), the blocks masked whole,
their sum (:attr:`KeptGrid.count`), what one more unit of a group would remove from them
(:meth:`KeptGrid.price`) and how many units of each group remove a number of elements
(:meth:`KeptGrid.units_for`): the planner of a search (:mod:`~tensorplay.ao.pruning.pruner.search`)
sizes each kind's share with it, on the model as the kinds before left it. The count is the
shrunk model's where every group keeps at least one unit; the search still counts each candidate
by shrinking it.

Example:
    >>> import torch
    >>> from torch import Tensor, nn
    >>> from tensorplay.ao.pruning.parity.methods import custom_from_mask
    >>> layer = nn.Linear(4, 3)  # 12 weights and 3 biases
    >>> mask = torch.ones(3, 4)
    >>> mask[1] = 0  # one output row
    >>> _ = custom_from_mask(layer, "weight", mask)
    >>> grid = read_kept_grid(layer)
    >>> grid.extents["weight"], grid.count  # 2 rows of 4, and 3 biases
    ((2, 4), 11)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from torch import Tensor, nn

from tensorplay.ao.pruning.masking.held_tensors import kept_elements, read_kept
from tensorplay.ao.pruning.parity.aliases import ParameterTable, TiedParameter, alias_map
from tensorplay.ao.pruning.structured.dependency.blocks import find_blocks
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup, expert_width_step

__all__ = ["KeptGrid", "masked_blocks", "read_kept_grid"]


@dataclass(frozen=True)
class KeptGrid:
    """What a model's masks keep, read once (:func:`read_kept_grid`).

    Args:
        extents: Per tensor (its canonical name, tied ones once), the indices kept along each
            dimension.
        canonical: Each parameter name's canonical one.
        dropped: The blocks whose every parameter is masked whole (:func:`masked_blocks`).
        element_sizes: Each tensor's bytes per element, by name.

    Example:
        >>> grid = KeptGrid({"weight": (3, 2), "bias": (3,)}, {}, ())
        >>> grid.count
        9
    """

    extents: Mapping[str, tuple[int, ...]]
    canonical: Mapping[str, str]
    dropped: tuple[str, ...]
    element_sizes: Mapping[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        """The elements the kept grids hold, summed over the tensors (tied ones once)."""
        return sum(math.prod(extents) for extents in self.extents.values())

    def price(self, group: UnitGroup) -> int:
        """The elements one unit of ``group`` removes from the grids (a whole tensor slice: all
        it keeps; a slice along a dimension: its width times the other dimensions' kept
        extents; one expert's slice: that expert's part).

        Example:
            >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
            >>> row = UnitGroup("fc", "channel", 3, (Slice("weight", 0), Slice("bias", 0)))
            >>> KeptGrid({"weight": (3, 2), "bias": (3,)}, {}, ()).price(row)
            3
        """
        price = 0
        for name, piece in group.distinct_slices(self.canonical):
            kept = self.extents[name]
            if piece.dim is None:
                price += math.prod(kept)
                continue
            others = [size for dim, size in enumerate(kept) if dim != piece.dim]
            if piece.expert is not None:
                others = [size for dim, size in enumerate(kept) if dim not in (0, piece.dim)]
            price += piece.width * math.prod(others)
        return price

    def live_groups(self, kind: str, groups: Sequence[UnitGroup]) -> list[UnitGroup]:
        """The ``groups`` of ``kind`` outside the :attr:`dropped` blocks (the hidden group
        without its slices there).

        Example:
            >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
            >>> rows = [UnitGroup(f"h.{i}.fc", "channel", 3, (Slice(f"h.{i}.fc.weight", 0),))
            ...         for i in range(2)]
            >>> [g.name for g in KeptGrid({}, {}, ("h.0",)).live_groups("channel", rows)]
            ['h.1.fc']
        """
        inside = tuple(f"{block}." for block in self.dropped)
        if kind == "hidden":
            (group,) = groups
            kept = tuple(piece for piece in group.slices if not piece.parameter.startswith(inside))
            return [UnitGroup(group.name, group.kind, group.size, kept, group.min_kept)]
        return [group for group in groups if not group.name.startswith(inside)]

    def expert_step(self, groups: Sequence[UnitGroup]) -> int:
        """The multiple of units each of ``groups`` keeps after shrinking: for an expert's
        channels, the expert kernel's 16-byte rows (8 channels in bfloat16); 1 for any other
        group (:func:`~tensorplay.ao.pruning.structured.dependency.unit_groups.expert_width_step`).

        Example:
            >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
            >>> expert = UnitGroup("e[0]", "channel", 16, (Slice("down", 2, expert=0),))
            >>> KeptGrid({}, {}, (), {"down": 2}).expert_step([expert])
            8
        """
        return max((expert_width_step(group, self.element_sizes) for group in groups), default=1)

    def units_for(
        self,
        kind: str,
        groups: Sequence[UnitGroup],
        need: int,
        *,
        at_least: bool,
        step: int = 1,
    ) -> tuple[int, int]:
        """The units per group (every group of ``groups`` as many; the blocks, for layers, as
        one group), a multiple of ``step`` (the multiple the kind's pruner prunes in), that
        remove ``need`` elements at their :meth:`price` in these grids, and the units a group
        holds: the fewest that remove at least as many (``at_least``: a search candidate's last
        kind, which lands on the budget), else the nearest count (a kind before leaves the rest
        to the next).

        Raises:
            ValueError: Groups of different sizes (a model whose layers differ), or units that
                free nothing.

        Example:
            >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
            >>> row = UnitGroup("fc", "channel", 3, (Slice("weight", 0), Slice("bias", 0)))
            >>> grid = KeptGrid({"weight": (3, 2), "bias": (3,)}, {}, ())
            >>> grid.units_for("channel", [row], 5, at_least=True), grid.units_for(
            ...     "channel", [row], 5, at_least=False)
            ((2, 3), (2, 3))
        """
        sizes = {group.size for group in groups}
        if len(sizes) != 1:
            raise ValueError(
                f"Expected {kind!r} groups of one size to prune as many units of each, but got "
                f"sizes {sorted(sizes)}."
            )
        priced = Fraction(sum(self.price(group) for group in groups))
        size = sizes.pop()
        if kind == "layer":  # one group of blocks: a layer at the blocks' mean price
            priced, size = priced / len(groups), len(groups)
        if need <= 0:
            return 0, size
        if priced == 0:
            raise ValueError(f"Expected {kind!r} units that free parameters, but none left does.")
        if at_least:
            return math.ceil(need / priced / step) * step, size
        return math.floor(need / priced / step + Fraction(1, 2)) * step, size


def read_kept_grid(model: nn.Module, experts: Collection[str] = ()) -> KeptGrid:
    """The grids ``model``'s masks keep, each tensor's mask read once: per tensor the indices
    some kept element lies on along each dimension (all of them without a mask; zeros for a
    tensor masked whole). A fused expert tensor named in ``experts`` (dim 0 indexes its experts)
    keeps its experts that keep something and, along each other dimension, as many indices as
    its widest expert: what shrinking leaves, each expert padded to the widest.

    Example:
        >>> grid = read_kept_grid(nn.Linear(2, 3))
        >>> grid.extents, grid.count, grid.dropped
        ({'weight': (3, 2), 'bias': (3,)}, 9, ())
    """
    table = ParameterTable.of(model)
    aliases = table.aliases
    reads = {name: read_kept(tied) for name, tied in aliases.items() if name == tied.name}
    extents = {
        name: _grid(kept, tuple(table.shapes[name]), name in experts)
        if masked
        else tuple(table.shapes[name])
        for name, (kept, masked) in reads.items()
    }
    found = find_blocks(model)
    names = found.block_names() if found is not None else []
    dropped = _dropped(names, aliases, lambda tied: reads[tied.name][0])
    return KeptGrid(extents, table.canonical, tuple(dropped), table.element_sizes)


def _grid(kept: Tensor, shape: tuple[int, ...], expert: bool) -> tuple[int, ...]:
    """The extents of one masked tensor's ``kept`` elements (see :func:`read_kept_grid`)."""
    if not bool(kept.any()):
        return tuple(0 for _ in shape)
    if not expert:
        return _extents(kept)
    alive = kept.flatten(1).any(dim=1)
    widths = [
        max(_extents(kept[index])[dim] for index in alive.nonzero().flatten().tolist())
        for dim in range(kept.dim() - 1)
    ]
    return (int(alive.sum()), *widths)


def _extents(mask: Tensor) -> tuple[int, ...]:
    """Along each dimension of ``mask``, the indices some kept element lies on."""
    if mask.dim() == 1:
        return (int(mask.sum()),)
    return tuple(
        int(mask.any(dim=[d for d in range(mask.dim()) if d != dim]).sum())
        for dim in range(mask.dim())
    )


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
    return _dropped(found.block_names(), aliases, kept_elements)


def _dropped(
    blocks: Collection[str],
    aliases: Mapping[str, TiedParameter],
    kept: Callable[[TiedParameter], Tensor],
) -> list[str]:
    """The ``blocks`` that hold parameters and keep none of their elements (``kept``)."""
    dropped = []
    for name in blocks:
        held = [tied for param, tied in aliases.items() if param.startswith(f"{name}.")]
        if held and not any(bool(kept(tied).any()) for tied in held):
            dropped.append(name)
    return dropped
