"""What :func:`~tensorplay.ao.pruning.shrink` reads from the model, read once.

Shrinking first reads the model into a :class:`Reading`: its parameters (one
:class:`~tensorplay.ao.pruning.parity.aliases.ParameterTable`: every name, its tied holders, its
shape), its Hugging Face blocks, the groups to shrink and the groups known but left out, the
channels tracing left out, and which elements of every tensor the decision reads are kept.
Planning, refusing and applying then ask the reading, not the model, for all of that
(:mod:`~tensorplay.ao.pruning.structured.shrinking.shrink`). Reading changes nothing.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
    >>> mlp = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> with torch.no_grad():
    ...     _ = mlp[0].weight[1].zero_(), mlp[0].bias[1].zero_()
    >>> group = UnitGroup("0", "channel", 3, (Slice("0.weight", 0), Slice("0.bias", 0),
    ...                                      Slice("2.weight", 1)))
    >>> reading = read_model(mlp, [group], None)
    >>> reading.tensors, reading.kept["0.bias"].tolist(), reading.table.count
    (['0.weight', '0.bias', '2.weight'], [True, False, True], 23)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from tensorplay.ao.pruning.masking.held_tensors import read_kept
from tensorplay.ao.pruning.parity.aliases import ParameterTable
from tensorplay.ao.pruning.selection.sharding import first_sharded
from tensorplay.ao.pruning.structured.dependency.blocks import FoundBlocks, find_blocks
from tensorplay.ao.pruning.structured.dependency.recorded import recorded_groups
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup, check_groups
from tensorplay.ao.pruning.structured.shrinking.hf_config import check_config
from tensorplay.ao.pruning.structured.shrinking.left_masked import (
    OVERLAP_FIX,
    RECORDED_FIX,
    untraced_tensors,
)
from tensorplay.ao.pruning.structured.shrinking.shrink_groups import default_groups

__all__ = ["Reading", "read_model"]


@dataclass(frozen=True)
class Reading:
    """A model as :func:`~tensorplay.ao.pruning.shrink` reads it, before it decides anything.

    Args:
        table: Every parameter name with its tied holders, shapes and sizes.
        blocks: The Hugging Face blocks found (``None``: none).
        chosen: The groups to shrink.
        unshrunk: The known groups not shrunk that span a tensor the chosen ones span, each
            with how to shrink it (the end of a refusal's error).
        untraced: Tracing's reason per module whose channels it left out without
            ``example_inputs`` (empty otherwise).
        tensors: The tensors the chosen groups span, each once, in the groups' order.
        spanned: Every name of those tensors (tied names too).
        checked: The tensors a refusal reads: those of the groups ``unshrunk`` and the weights
            and biases of the modules ``untraced``.
        kept: Per tensor of ``tensors`` and ``checked``, ``True`` where an element is kept: its
            mask where it has one, else where its value is not zero.
        held: The tensors of ``tensors`` and ``checked`` that a mask holds (either mode).
    """

    table: ParameterTable
    blocks: FoundBlocks | None
    chosen: list[UnitGroup]
    unshrunk: list[tuple[UnitGroup, str]]
    untraced: Mapping[str, str]
    tensors: list[str]
    spanned: frozenset[str]
    checked: list[str]
    kept: Mapping[str, Tensor]
    held: Collection[str]


def read_model(
    model: nn.Module,
    groups: Iterable[UnitGroup] | None,
    example_inputs: Tensor | tuple[Any, ...] | None,
) -> Reading:
    """Read ``model`` for :func:`~tensorplay.ao.pruning.shrink` (its ``groups`` and
    ``example_inputs``; see the module docstring).

    Raises:
        ValueError: What :func:`~tensorplay.ao.pruning.shrink` refuses before it plans: a
            sharded parameter (first of all), groups that do not fit the model, what the
            dependency graph raises, a config with transformers' ``per_layer_config``.
    """
    _check_whole(model)
    table = ParameterTable.of(model)
    untraced: Mapping[str, str] = {}
    if groups is None:
        default = default_groups(model, example_inputs, table=table)
        found, chosen = default.blocks, default.groups
        known = [(group, OVERLAP_FIX) for group in default.set_aside]
        if example_inputs is None:
            untraced = default.unprunable
    else:
        found = find_blocks(model)
        chosen = list(groups)
        check_groups(chosen, table.shapes)
        known = [
            (group, RECORDED_FIX)
            for group in recorded_groups(model)
            if group not in chosen and _fits(group, table)
        ]
    if found is not None and found.config is not None:
        check_config(found)
    aliases = table.aliases
    tensors = list(dict.fromkeys(name for group in chosen for name in group.parameters()))
    spanned = frozenset(alias for name in tensors for alias in aliases[name].names)
    unshrunk = [(g, fix) for g, fix in known if any(name in spanned for name in g.parameters())]
    checked = [name for group, _ in unshrunk for name in group.parameters()]
    checked += untraced_tensors(model, untraced)
    reads = {name: read_kept(aliases[name]) for name in dict.fromkeys([*tensors, *checked])}
    return Reading(
        table,
        found,
        chosen,
        unshrunk,
        untraced,
        tensors,
        spanned,
        checked,
        {name: kept for name, (kept, _) in reads.items()},
        {name for name, (_, masked) in reads.items() if masked},
    )


def _check_whole(model: nn.Module) -> None:
    """Refuse a sharded model before anything is traced or changed."""
    name = first_sharded(model)
    if name is not None:
        raise ValueError(
            f"Expected whole parameters to shrink, but {name!r} is a DTensor (a sharded "
            "parameter, as under FSDP2): gather the model to one device first: "
            "tensorplay.ao.pruning.save_shrunk(model, directory) on every rank gathers it "
            "on rank 0, shrinks the copy there and writes it (gather_shrunk returns it)."
        )


def _fits(group: UnitGroup, table: ParameterTable) -> bool:
    try:
        check_groups([group], table.shapes)
    except ValueError:
        return False
    return True
