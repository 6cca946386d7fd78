"""The pruner's targets: each selected parameter once, with every ``(module, name)`` reaching it.

:func:`resolve_targets` turns a model and a
:class:`~tensorplay.ao.pruning.pruner.config.PrunerConfig` into
:class:`~tensorplay.ao.pruning.targets.tied.Target` objects (a tied parameter is one target with
all its names), checking every name before anything changes.

Example:
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.config import PrunerConfig
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    >>> model[1].weight = model[0].weight  # tied
    >>> [t.names for t in resolve_targets(model, PrunerConfig(OneShotSchedule(0.5)))]
    [('0.weight', '1.weight')]
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from tensorplay.ao.pruning.masking.readers import mask_of
from tensorplay.ao.pruning.parity.aliases import TiedParameter, alias_map
from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.targets.parameters import (
    DEFAULT_MODULE_TYPES,
    DEFAULT_NAMES,
    SelectionWarning,
    resolve_parameters,
    select_parameters,
)
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["resolve_targets"]


def resolve_targets(model: nn.Module, config: PrunerConfig) -> list[Target]:
    """The targets ``config`` selects in ``model``: each parameter once, in the order of its
    first mention, under its first name in module order.

    Raises:
        ValueError: A name that is not a tensor of the model, or holders of one tied parameter
            that are not pruned alike.
    """
    names = _target_names(model, config)
    resolve_parameters(model, names)  # names each module and tensor that does not exist
    aliases = alias_map(model)
    groups: dict[int, TiedParameter] = {}
    for fq_name in names:
        group = aliases.get(fq_name)
        if group is None:
            raise ValueError(
                f"Expected {fq_name!r} to name a tensor of the model, but it is the parameter "
                f"of a pruned tensor: name the tensor, {fq_name.removesuffix('_orig')!r}."
            )
        groups.setdefault(id(group.parameter), group)
    for group in groups.values():
        _check_pruned_alike(group)
    return [Target(group.names, group.pairs) for group in groups.values()]


def _target_names(model: nn.Module, config: PrunerConfig) -> list[str]:
    """The names ``config.parameters`` gives, or those its selection arguments select."""
    if config.parameters is None:
        # Imported here: the structures reach the masking modes, which read the configuration.
        from tensorplay.ao.pruning.structured.units import STRUCTURES

        with warnings.catch_warnings():
            kind = STRUCTURES.get(config.structure) if isinstance(config.structure, str) else None
            chooses = getattr(kind, "selects_blocks", None)
            if chooses is not None and chooses(model):
                # The selection chooses blocks (experts are no Linear weights): no warning
                # that it leaves tensors out.
                warnings.simplefilter("ignore", SelectionWarning)
            return select_parameters(
                model,
                module_types=DEFAULT_MODULE_TYPES
                if config.module_types is None
                else config.module_types,
                names=DEFAULT_NAMES if config.names is None else config.names,
                include=config.include,
                exclude=config.exclude,
                keep_dense=config.keep_dense,
            )
    if isinstance(config.parameters, str):
        return [config.parameters]
    return list(config.parameters)


def _check_pruned_alike(group: TiedParameter) -> None:
    """The holders of a tied parameter must all be unpruned, or pruned with equal masks."""
    masks = [mask_of(module, name) for module, name in group.pairs]
    first = masks[0]
    label = f"({type(group.pairs[0][0]).__name__}, {group.pairs[0][1]!r})"
    for (module, name), mask in zip(group.pairs, masks, strict=True):
        if mask is first or (mask is not None and first is not None and torch.equal(mask, first)):
            continue
        other = f"({type(module).__name__}, {name!r})"
        if mask is not None and first is not None:
            state = f"{other} and {label} are pruned with different masks"
        else:
            pruned, unpruned = (other, label) if first is None else (label, other)
            state = f"{pruned} is pruned and {unpruned} is not"
        raise ValueError(
            f"Expected the holders of the tied parameter {group.name!r} {group.names} to be "
            f"pruned alike, but {state}: prune all its pairs in one global_unstructured call, "
            "or remove() the pruning first."
        )
