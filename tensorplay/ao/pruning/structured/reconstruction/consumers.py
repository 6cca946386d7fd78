"""The consumers of structured units: the layers that read the units' outputs.

A unit group (:class:`~tensorplay.ao.pruning.structured.dependency.unit_groups.UnitGroup`) spans the
rows of the layers that produce its units and the input columns of the layers that read them: an FFN
channel's ``down_proj`` column, a head's ``o_proj`` columns, the next Linear's input column in a
plain model. Those readers are the **consumers** that reconstruction re-solves: a slice on a layer's
*input* dimension (dim 1 of an ``nn.Linear`` weight, dim 0 of a Hugging Face ``Conv1D`` weight,
stored ``(in, out)``). A consumer may read units of several groups (a plain model's channels joined
by a residual addition); its pruned inputs are the union of theirs.

The hidden group (``structure="hidden"``) spans the input columns of every layer reading the
residual stream: q/k/v, gate/up, a shared expert and its gate, an untied LM head are consumers.
Not among them: an embedding (its columns are its outputs), a head tied to one (its columns are
the embedding's: re-solving it would change what the stream starts from), a mixture-of-experts
router (not an ``nn.Linear``: left as it is rather than refused) and the routed experts' fused
``gate_up_proj`` (which tokens an expert reads follows the routing, which differs between the
dense and the pruned model). The writers' slices are output rows: no input to solve over.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
    >>> mlp = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> group = UnitGroup("0", "channel", 3, (Slice("0.weight", 0), Slice("0.bias", 0),
    ...                                       Slice("2.weight", 1)))
    >>> [consumer.parameter for consumer in find_consumers(mlp, [group])]
    ['2.weight']
    >>> from tensorplay.ao.pruning.parity.methods import custom_from_mask
    >>> _ = custom_from_mask(mlp[0], "weight", torch.tensor([[1.0] * 4, [0.0] * 4, [1.0] * 4]))
    >>> _ = custom_from_mask(mlp[0], "bias", torch.tensor([1.0, 0.0, 1.0]))
    >>> _ = custom_from_mask(mlp[2], "weight", torch.tensor([[1.0, 0.0, 1.0]] * 2))
    >>> kept_inputs(find_consumers(mlp, [group])[0], masks_of(mlp, [group])).tolist()
    [True, False, True]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.masking.readers import mask_of
from tensorplay.ao.pruning.parity.aliases import alias_map
from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
from tensorplay.ao.pruning.structured.dependency.hidden_width import HIDDEN
from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup, pruned_units
from tensorplay.ao.pruning.targets.layouts import is_transposed

__all__ = [
    "RECONSTRUCTED_KINDS",
    "Consumer",
    "consumers_for",
    "find_consumers",
    "kept_inputs",
    "masks_of",
    "split_name",
]

#: The kinds of unit whose consumers can be re-solved: channels, heads and hidden channels
#: have consumers; a layer (a whole residual block) has none, a single weight no unit.
RECONSTRUCTED_KINDS = ("channel", "head", HIDDEN)


@dataclass(frozen=True)
class Consumer:
    """A layer that reads structured units, and where it reads them.

    Args:
        module: The layer's qualified name (``"model.layers.0.mlp.down_proj"``).
        parameter: Its weight's qualified name.
        transposed: Whether the weight is stored ``(in, out)`` (Hugging Face ``Conv1D``).
        width: Its input features.
        pieces: Each group it reads units of, with the slice of its weight they span.

    Example:
        >>> Consumer("fc", "fc.weight", False, 8, ()).width
        8
    """

    module: str
    parameter: str
    transposed: bool
    width: int
    pieces: tuple[tuple[UnitGroup, Slice], ...]


def split_name(name: str) -> tuple[str, str]:
    """``"a.b.weight"`` -> ``("a.b", "weight")``; ``"weight"`` -> ``("", "weight")``.

    Example:
        >>> split_name("model.fc.weight")
        ('model.fc', 'weight')
    """
    module, _, attr = name.rpartition(".")
    return module, attr


def find_consumers(model: nn.Module, groups: Iterable[UnitGroup]) -> list[Consumer]:
    """The consumers of ``groups`` in ``model``, each once, in the order the groups name them.

    Raises:
        ValueError: A layer reading units that is neither an ``nn.Linear`` nor a Hugging Face
            ``Conv1D`` (a convolution, a routed expert's slice of a fused expert tensor), naming
            it and the group: reconstruction re-solves matrix products only.
    """
    found: dict[str, list[tuple[UnitGroup, Slice]]] = {}
    layers: dict[str, tuple[str, bool, int]] = {}
    aliases = alias_map(model)
    for group in groups:
        for piece in group.slices:
            if piece.dim is None or _embedded(aliases[piece.parameter].pairs):
                continue  # an embedding's columns are its outputs; a head tied to one is it
            if piece.expert is not None:
                raise ValueError(
                    f"Expected the layers that read the units of group {group.name!r} to be "
                    f"nn.Linear or Hugging Face Conv1D layers for reconstruct=True, but they are "
                    f"routed experts' slices of the fused {piece.parameter!r}: reconstruction "
                    "re-solves Linear layers only; prune without reconstruct, or exclude the "
                    "mixture-of-experts layers."
                )
            module_name, attr = split_name(piece.parameter)
            module = model.get_submodule(module_name)
            if attr != "weight" or piece.dim != _input_dim(module):
                continue  # a producer's rows, a bias, a norm's entries, a fused expert tensor
            if group.kind == HIDDEN and not _is_matrix_product(module):
                continue  # a router: not re-solved (see the module)
            _check_layer(module, module_name, group)
            layers[piece.parameter] = (module_name, is_transposed(module), _width(module))
            found.setdefault(piece.parameter, []).append((group, piece))
    return [
        Consumer(layers[name][0], name, layers[name][1], layers[name][2], tuple(pieces))
        for name, pieces in found.items()
    ]


def consumers_for(
    model: nn.Module,
    kind: str,
    targets: Iterable[str],
    example_inputs: Tensor | tuple[Any, ...] | None = None,
) -> list[Consumer]:
    """The consumers of the ``kind`` groups of ``model`` whose scored weights are all among
    ``targets`` (a pruner's targets, every name of each): the groups that pruner prunes.

    Args:
        model: The model (or its dense copy: the names are the same).
        kind: ``"channel"``, ``"head"`` or ``"hidden"``.
        targets: Parameter names.
        example_inputs: For tracing a plain model
            (:class:`~tensorplay.ao.pruning.structured.dependency.graph.DependencyGraph`).

    Raises:
        ValueError: Another kind, or what :func:`find_consumers` and the graph raise.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> mlp = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        >>> names = ["0.weight", "0.bias", "2.weight"]
        >>> [c.module for c in consumers_for(mlp, "channel", names, torch.randn(1, 4))]
        ['2']
    """
    if kind not in RECONSTRUCTED_KINDS:
        raise ValueError(
            f"Expected structure='channel', 'head' or 'hidden' for reconstruct=True, but got "
            f"{kind!r}: only the layers that read pruned channels, heads or hidden channels can "
            "be re-solved."
        )
    chosen = set(targets)
    groups: Sequence[UnitGroup] = DependencyGraph(model, example_inputs).groups(kind)
    return find_consumers(
        model, [group for group in groups if set(group.scored_parameters()) <= chosen]
    )


def masks_of(model: nn.Module, groups: Iterable[UnitGroup]) -> dict[str, Tensor]:
    """The keep mask of every parameter ``groups`` span, in either masking format (all kept
    where a parameter holds none; see the module example)."""
    masks: dict[str, Tensor] = {}
    for group in groups:
        for name in group.parameters():
            if name in masks:
                continue
            module_name, attr = split_name(name)
            module = model.get_submodule(module_name)
            mask = mask_of(module, attr)
            if mask is None:
                shape = getattr(module, attr).shape
                mask = torch.ones((), dtype=torch.bool).expand(shape)
            masks[name] = mask
    return masks


def kept_inputs(
    consumer: Consumer, masks: Mapping[str, Tensor], pruned: dict[UnitGroup, Tensor] | None = None
) -> Tensor:
    """One bool per input feature of ``consumer`` (on the CPU), ``False`` where it belongs to
    a pruned unit: one masked in every slice it spans (see the module example).

    Args:
        consumer: The layer.
        masks: :func:`masks_of` its groups.
        pruned: Where given, each group's pruned units by group, read from it where there
            and added to it where not: the consumers of one group (a hidden group has one in
            every block) then reduce its masks once.
    """
    keep = torch.ones(consumer.width, dtype=torch.bool)
    known = {} if pruned is None else pruned
    for group, piece in consumer.pieces:
        if group not in known:
            known[group] = pruned_units(group, masks, partial="keep")
        pruned_here = known[group]
        for unit in torch.nonzero(pruned_here).flatten().tolist():
            keep[piece.span(unit)] = False
    return keep


def _input_dim(module: nn.Module) -> int:
    return 0 if is_transposed(module) else 1


def _width(module: nn.Module) -> int:
    weight = module.weight
    assert isinstance(weight, Tensor)  # for mypy: checked by _check_layer
    return int(weight.shape[_input_dim(module)])


def _embedded(holders: Iterable[tuple[nn.Module, str]]) -> bool:
    """Whether an ``nn.Embedding`` holds the parameter (alone, or tied to a head)."""
    return any(isinstance(module, nn.Embedding) for module, _ in holders)


def _is_matrix_product(module: nn.Module) -> bool:
    """An ``nn.Linear`` or a Hugging Face ``Conv1D``: a layer whose output is its input times
    its 2-D weight, which the ridge solve re-fits."""
    weight = getattr(module, "weight", None)
    matrix = isinstance(weight, Tensor) and weight.dim() == 2
    return matrix and (isinstance(module, nn.Linear) or is_transposed(module))


def _check_layer(module: nn.Module, name: str, group: UnitGroup) -> None:
    if _is_matrix_product(module):
        return
    raise ValueError(
        f"Expected the layers that read the units of group {group.name!r} to be nn.Linear or "
        f"Hugging Face Conv1D layers for reconstruct=True, but {name!r} is a "
        f"{type(module).__name__}: reconstruction re-solves matrix products only; prune "
        "without reconstruct, or exclude its units."
    )
