"""Removing units physically: slicing parameters, resizing modules, dropping whole blocks.

:func:`plan_cuts` turns keep flags per unit into the kept indices of every parameter (one
parameter may lose units along several dimensions: a convolution's filters and its input
channels; a fused expert tensor, each expert's own channels) and checks that every module holding
a parameter that shrinks can be resized; nothing
changes until :func:`apply_cuts`, which gives each parameter a new, smaller ``nn.Parameter`` under
every name that reaches it (tied weights stay tied) and resizes the modules
(:mod:`~tensorplay.ao.pruning.structured.shrinking.resize`). :func:`remove_blocks` takes whole
residual blocks out of their ``nn.ModuleList`` and renumbers the ``layer_idx`` the KV cache is
indexed by.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
    >>> mlp = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> group = UnitGroup("0", "channel", 3, (Slice("0.weight", 0), Slice("0.bias", 0),
    ...                                      Slice("2.weight", 1)))
    >>> apply_cuts(plan_cuts(mlp, [(group, torch.tensor([True, False, True]))]))
    >>> mlp
    Sequential(
      (0): Linear(in_features=4, out_features=2, bias=True)
      (1): ReLU()
      (2): Linear(in_features=2, out_features=2, bias=True)
    )
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.parity.aliases import ParameterTable
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup
from tensorplay.ao.pruning.structured.shrinking.resize import resize, resizer_for

__all__ = ["Cut", "apply_cuts", "plan_cuts", "remove_blocks"]

Pair = tuple[nn.Module, str]


@dataclass(frozen=True)
class Cut:
    """What one parameter keeps.

    Args:
        name: The parameter's canonical qualified name.
        pairs: Every ``(module, name)`` holding it.
        kept: Per dimension that loses units, the kept indices (increasing).
        per_expert: Per dimension whose units are each expert's own (a fused expert tensor's
            channels), the kept indices of each expert: one row per index along dim 0, every
            row as long (the experts of one tensor keep one width), increasing.
    """

    name: str
    pairs: tuple[Pair, ...]
    kept: dict[int, Tensor]
    per_expert: dict[int, Tensor] = field(default_factory=dict)


def plan_cuts(
    model: nn.Module,
    keeps: Sequence[tuple[UnitGroup, Tensor]],
    *,
    table: ParameterTable | None = None,
) -> list[Cut]:
    """The cuts that keep, in each group, the units flagged ``True``; nothing is changed
    (``table``: ``model``'s parameters, where they were read already).

    Raises:
        ValueError: A group of whole-tensor slices (layers are removed with
            :func:`remove_blocks`), experts of one fused tensor that would keep different
            widths, or a module holding a shrinking parameter that cannot be resized, naming it.
    """
    aliases = (ParameterTable.of(model) if table is None else table).aliases
    flags: dict[str, dict[int, Tensor]] = {}
    experts: dict[str, dict[int, Tensor]] = {}  # per tensor and dim, one row of flags per expert
    for group, keep in keeps:
        dropped = ~keep.to(device="cpu", dtype=torch.bool)
        for piece in group.slices:
            if piece.dim is None:
                raise ValueError(
                    f"Expected groups whose units are index ranges, but group {group.name!r} "
                    f"spans all of {piece.parameter!r}: whole blocks are removed, not cut."
                )
            tied = aliases[piece.parameter]
            shape = tied.parameter.shape
            if piece.expert is None:
                along = flags.setdefault(tied.name, {}).setdefault(
                    piece.dim, torch.ones(shape[piece.dim], dtype=torch.bool, device="cpu")
                )
            else:
                along = experts.setdefault(tied.name, {}).setdefault(
                    piece.dim,
                    torch.ones(shape[0], shape[piece.dim], dtype=torch.bool, device="cpu"),
                )[piece.expert]
            section = along.narrow(0, piece.offset, group.size * piece.width)
            section.view(group.size, piece.width)[dropped] = False
    cuts = []
    for name in dict.fromkeys([*flags, *experts]):
        dims = flags.get(name, {})
        kept = {dim: flag.nonzero().flatten() for dim, flag in dims.items() if not flag.all()}
        per_expert = {
            dim: _per_expert(name, dim, rows)
            for dim, rows in experts.get(name, {}).items()
            if not rows.all()
        }
        if kept or per_expert:
            cuts.append(Cut(name, aliases[name].pairs, kept, per_expert))
    _check_resizable(model, cuts)
    return cuts


def _per_expert(name: str, dim: int, rows: Tensor) -> Tensor:
    """The kept indices of each expert (a row of ``rows`` each), one width for all.

    Raises:
        ValueError: Experts that keep different widths, naming the tensor: one fused tensor
            holds one width (:mod:`~tensorplay.ao.pruning.structured.shrinking.expert_widths`
            evens them out first).
    """
    counts = rows.sum(dim=1)
    if not bool((counts == counts[0]).all()):
        raise ValueError(
            f"Expected every expert of {name!r} to keep the same number of indices along dim "
            f"{dim} (one fused tensor holds one width), but they keep {counts.tolist()}."
        )
    return rows.nonzero()[:, 1].view(rows.shape[0], int(counts[0]))


def _check_resizable(model: nn.Module, cuts: Sequence[Cut]) -> None:
    names = {id(module): name for name, module in model.named_modules(remove_duplicate=False)}
    for cut in cuts:
        for module, _ in cut.pairs:
            if isinstance(module, nn.Embedding) and 0 in cut.kept:
                raise ValueError(
                    f"Expected an Embedding to lose columns (the residual stream's channels), but "
                    f"the rows (the vocabulary) of {names.get(id(module), '?')!r} holding "
                    f"{cut.name!r} shrink: a vocabulary is not a structure shrink removes."
                )
            if resizer_for(module) is None:
                raise ValueError(
                    f"Expected every module whose parameters shrink to be one shrink can resize "
                    f"(Linear, Conv1d/2d/3d, ConvTranspose1d/2d/3d with one group, BatchNorm, "
                    f"InstanceNorm, GroupNorm of one channel per group, Hugging Face Conv1D, "
                    f"mixture-of-experts routers and experts, Embedding, LayerNorm, RMSNorm), "
                    f"but {names.get(id(module), '?')!r} holding {cut.name!r} is of type "
                    f"{type(module).__name__}."
                )


def apply_cuts(cuts: Sequence[Cut]) -> None:
    """Slice every parameter of ``cuts`` and resize the modules holding them.

    Each parameter becomes a new ``nn.Parameter`` (same dtype, device and ``requires_grad``,
    no gradient) registered under every pair that held the old one.

    Raises:
        ValueError: A parameter held under a mask (its ``_orig``): masks are made permanent
            first.
    """
    kept_by_module: dict[int, tuple[nn.Module, dict[str, dict[int, Tensor]]]] = {}
    for cut in cuts:
        module, name = cut.pairs[0]
        old = module._parameters.get(name)
        if old is None:
            raise ValueError(
                f"Expected {cut.name!r} to be a plain parameter, but it is held under a mask: "
                "make the pruning permanent first."
            )
        data = old.detach()
        # Each expert's own indices first: they count the experts as they were.
        for dim, indices in sorted(cut.per_expert.items()):
            data = _gather_per_expert(data, dim, indices.to(data.device))
        for dim, indices in sorted(cut.kept.items()):
            data = data.index_select(dim, indices.to(data.device))
        new = nn.Parameter(data, requires_grad=old.requires_grad)
        for holder, local in cut.pairs:
            holder._parameters[local] = new
            entry = kept_by_module.setdefault(id(holder), (holder, {}))
            entry[1][local] = {**cut.per_expert, **cut.kept}
    for module, kept in kept_by_module.values():
        resize(module, kept)


def _gather_per_expert(data: Tensor, dim: int, indices: Tensor) -> Tensor:
    """``data`` keeping, along ``dim``, the indices of row ``e`` of ``indices`` in expert ``e``
    (index ``e`` along dim 0).

    Example:
        >>> data = torch.arange(8).view(2, 4)  # 2 experts of 4
        >>> _gather_per_expert(data, 1, torch.tensor([[0, 3], [1, 2]])).tolist()
        [[0, 3], [5, 6]]
    """
    shape = [1] * data.dim()
    shape[0], shape[dim] = indices.shape
    size = list(data.shape)
    size[dim] = indices.shape[1]
    return data.gather(dim, indices.view(shape).expand(size))


def remove_blocks(blocks: nn.ModuleList, dropped: Sequence[int]) -> None:
    """Take the blocks at ``dropped`` out of ``blocks`` (in place) and renumber the int
    ``layer_idx`` attributes of the remaining blocks' modules to their new positions.

    Example:
        >>> from torch import nn
        >>> blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))
        >>> for index, block in enumerate(blocks):
        ...     block.layer_idx = index
        >>> remove_blocks(blocks, [1])
        >>> len(blocks), [block.layer_idx for block in blocks]
        (2, [0, 1])
    """
    for index in sorted(set(dropped), reverse=True):
        del blocks[index]
    for index, block in enumerate(blocks):
        for module in block.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                setattr(module, "layer_idx", index)  # noqa: B010  (an int, not a submodule)
