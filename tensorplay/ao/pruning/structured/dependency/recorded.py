"""The unit groups a structured pruner masks, recorded on the model itself.

A structured :class:`~tensorplay.ao.pruning.Pruner` (``structure="channel"``, ``"head"`` or
``"layer"``) finds its groups once, when it is built, with everything the analysis needed
(``example_inputs`` for a plain model), and records them on the model with
:func:`record_groups`. :func:`~tensorplay.ao.pruning.shrink` reads them back with
:func:`recorded_groups` and removes exactly the units that were masked, never re-deriving them:
without the example inputs, tracing a plain model would miss the channels a reshape (a feature
map flattened into a ``Linear``) or a residual addition joins, and would leave them in place.

Where the record lives: an attribute of the module the pruner was built on,
:data:`RECORD_ATTRIBUTE` (``tensorplay_unit_groups``), holding a tuple of frozen
:class:`~tensorplay.ao.pruning.structured.dependency.unit_groups.UnitGroup` objects (plain names and
integers). It is not a buffer (``state_dict`` never carries it) and goes wherever the module's
``__dict__`` goes: it survives ``copy.deepcopy`` and pickling of the model, and is lost by
rebuilding the model from its class and loading a state_dict (pass ``groups=`` or
``example_inputs=`` to :func:`~tensorplay.ao.pruning.shrink` there). A record on a submodule
is read with the submodule's prefix, so shrinking a wrapper finds the groups of a pruner built
on the model inside it. Recording again adds the new groups (a second pruner, another kind);
a group recorded twice is kept once. Shrinking forgets the groups whose tensors it changed.

A Hugging Face model (a module with ``save_pretrained`` and a ``config``) also holds the
groups within it in its config, under the same key, as plain data
(:meth:`~tensorplay.ao.pruning.structured.dependency.unit_groups.UnitGroup.to_dict`): every
``save_pretrained`` writes them to ``config.json``, and ``from_pretrained`` brings them back.
The model is given a config of its own first
(:mod:`~tensorplay.ao.pruning.structured.dependency.own_configs`): another model built from the
same config object keeps it as it was.
So a folder saved with its units masked (their slices zero), as a sharded run saves it, is
shrunk later on any machine with exactly the groups the pruner masked: load it and call
:func:`~tensorplay.ao.pruning.shrink`.

Example:
    >>> import copy
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
    >>> model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    >>> group = UnitGroup("0", "channel", 3, (Slice("0.weight", 0), Slice("2.weight", 1)))
    >>> record_groups(model, [group])
    >>> recorded_groups(copy.deepcopy(model)) == (group,)
    True
    >>> wrapper = nn.ModuleDict({"net": model})
    >>> [piece.parameter for piece in recorded_groups(wrapper)[0].slices]
    ['net.0.weight', 'net.2.weight']
    >>> forget_groups(wrapper, ["net.2.weight"])
    >>> recorded_groups(model)
    ()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from typing import Any, Final

from torch import nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.structured.dependency.own_configs import own_configs
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup

__all__ = [
    "RECORD_ATTRIBUTE",
    "forget_groups",
    "record_groups",
    "recorded_groups",
    "records_without",
]

RECORD_ATTRIBUTE: Final = "tensorplay_unit_groups"
"""The name of the attribute the record is held in (a tuple of unit groups)."""


def record_groups(model: nn.Module, groups: Iterable[UnitGroup]) -> None:
    """Add ``groups`` (named as in ``model``) to ``model``'s record; each group once; and
    write the record into the config of each Hugging Face model in ``model``.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
        >>> model = nn.Linear(2, 2)
        >>> group = UnitGroup("", "channel", 2, (Slice("weight", 0),))
        >>> record_groups(model, [group]); record_groups(model, [group])
        >>> len(recorded_groups(model))
        1
    """
    held = _own(model)
    changes.set_attribute(model, RECORD_ATTRIBUTE, tuple(dict.fromkeys((*held, *groups))))
    own_configs(model)  # never the config of another model built from the same one
    _write_configs(model)


def recorded_groups(model: nn.Module) -> tuple[UnitGroup, ...]:
    """The groups recorded on ``model`` and on its submodules (theirs named from ``model``),
    each once, in the order of the modules and then of recording (see the module example)."""
    found: dict[UnitGroup, None] = {}
    for prefix, module in model.named_modules(remove_duplicate=True):
        for group in _own(module):
            found.setdefault(_prefixed(group, prefix), None)
    for prefix, config in _configs(model):
        for group in _config_record(config):
            found.setdefault(_prefixed(group, prefix), None)
    return tuple(found)


def forget_groups(model: nn.Module, parameters: Collection[str]) -> None:
    """Drop from the records of ``model`` and its submodules every group spanning one of
    ``parameters`` (names from ``model``): shrinking changed those tensors (see the module
    example)."""
    for holder, record in records_without(model, parameters):
        changes.set_attribute(holder, RECORD_ATTRIBUTE, record)


def records_without(model: nn.Module, parameters: Collection[str]) -> list[tuple[Any, Any]]:
    """What :func:`forget_groups` writes, read and changing nothing: each holder of a record
    in ``model`` (a module, or a Hugging Face config) that spans one of ``parameters``, with
    the record it keeps, the value of its :data:`RECORD_ATTRIBUTE`.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> record_groups(model, [UnitGroup("0", "channel", 2, (Slice("0.weight", 0),))])
        >>> [(holder is model, record) for holder, record in records_without(model, ["0.weight"])]
        [(True, ())]
    """
    records: list[tuple[Any, Any]] = []
    for prefix, module in model.named_modules(remove_duplicate=True):
        held = _own(module)
        kept = _untouched(held, prefix, parameters)
        if len(kept) != len(held):
            records.append((module, kept))
    for prefix, config in _configs(model):
        held = _config_record(config)
        kept = _untouched(held, prefix, parameters)
        if len(kept) != len(held):
            records.append((config, [group.to_dict() for group in kept]))
    return records


def _untouched(
    held: tuple[UnitGroup, ...], prefix: str, parameters: Collection[str]
) -> tuple[UnitGroup, ...]:
    """The groups of ``held`` (named from the module at ``prefix``) spanning none of
    ``parameters``."""
    return tuple(
        group
        for group in held
        if not any(name in parameters for name in _prefixed(group, prefix).parameters())
    )


def _own(module: nn.Module) -> tuple[UnitGroup, ...]:
    held = vars(module).get(RECORD_ATTRIBUTE, ())
    return tuple(group for group in held if isinstance(group, UnitGroup))


def _configs(model: nn.Module) -> list[tuple[str, Any]]:
    """The prefix and config of each Hugging Face model in ``model`` (a module with
    ``save_pretrained`` and a ``config`` that has ``to_dict``), the outermost holder of each
    config only (a ``LlamaModel`` inside its ``LlamaForCausalLM`` shares its config)."""
    found: dict[int, tuple[str, Any]] = {}
    for prefix, module in model.named_modules(remove_duplicate=True):
        config = vars(module).get("config")
        if (
            config is None
            or not hasattr(config, "to_dict")
            or not hasattr(module, "save_pretrained")
        ):
            continue
        found.setdefault(id(config), (prefix, config))
    return list(found.values())


def _config_record(config: Any) -> tuple[UnitGroup, ...]:
    """The groups a config holds (named from its model), read from plain data."""
    held = getattr(config, RECORD_ATTRIBUTE, None)
    if not isinstance(held, list):
        return ()
    return tuple(UnitGroup.from_dict(data) for data in held)


def _write_configs(model: nn.Module) -> None:
    """Each Hugging Face model's config takes the recorded groups that lie within it."""
    groups = recorded_groups(model)
    for prefix, config in _configs(model):
        start = f"{prefix}." if prefix else ""
        within = [
            _unprefixed(group, start)
            for group in groups
            if all(name.startswith(start) for name in group.parameters())
        ]
        changes.set_attribute(config, RECORD_ATTRIBUTE, [group.to_dict() for group in within])


def _unprefixed(group: UnitGroup, start: str) -> UnitGroup:
    if not start:
        return group
    slices = tuple(
        dataclasses.replace(piece, parameter=piece.parameter.removeprefix(start))
        for piece in group.slices
    )
    # A group named for the model itself (its hidden size) is named "" within it.
    name = "" if group.name == start.removesuffix(".") else group.name.removeprefix(start)
    return dataclasses.replace(group, name=name, slices=slices)


def _prefixed(group: UnitGroup, prefix: str) -> UnitGroup:
    if not prefix:
        return group
    slices = tuple(
        dataclasses.replace(piece, parameter=f"{prefix}.{piece.parameter}")
        for piece in group.slices
    )
    name = f"{prefix}.{group.name}" if group.name else prefix
    return dataclasses.replace(group, name=name, slices=slices)
