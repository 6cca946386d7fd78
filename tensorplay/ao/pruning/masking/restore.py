"""Rebuilding pruning on a fresh model from a pruned state_dict.

A pruned tensor ``name`` is saved as ``<name>_orig`` and ``<name>_mask``, not as ``<name>``, so a
fresh model refuses a pruned checkpoint under ``strict=True``. :func:`restore_pruning` puts the
reparametrization on every tensor the state_dict says is pruned, and the strict load then works.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.methods import l1_unstructured
    >>> trained = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> _ = l1_unstructured(trained[0], "weight", amount=6)
    >>> state = trained.state_dict()
    >>> fresh = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> restore_pruning(fresh, state)
    ['0.weight']
    >>> fresh.load_state_dict(state, strict=True)
    <All keys matched successfully>
    >>> torch.equal(fresh(torch.ones(1, 4)), trained(torch.ones(1, 4)))
    True
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking.lean_masks import install_mask, lean_mask, lean_names, mask_like
from tensorplay.ao.pruning.masking.readers import saved_mask_keys
from tensorplay.ao.pruning.parity.aliases import TiedParameter, alias_map
from tensorplay.ao.pruning.parity.global_unstructured import share_mask
from tensorplay.ao.pruning.parity.reparametrization import (
    is_pruned_tensor,
    parameter_of,
    reparametrized_names,
)
from tensorplay.ao.pruning.targets.parameters import owner

__all__ = ["is_pruned_state_dict", "pruned_names", "restore_pruning"]


def pruned_names(state_dict: Mapping[str, object]) -> list[str]:
    """The fully qualified names of the pruned tensors in ``state_dict``, in key order.

    A tensor is pruned when both ``<name>_orig`` and ``<name>_mask`` are keys.

    Example:
        >>> pruned_names({"fc.weight_orig": 0, "fc.weight_mask": 0, "fc.bias": 0})
        ['fc.weight']
    """
    return reparametrized_names(state_dict)


def is_pruned_state_dict(state_dict: Mapping[str, object]) -> bool:
    """Whether ``state_dict`` holds at least one pruned tensor (``_orig`` and ``_mask`` keys).

    Example:
        >>> from torch import nn
        >>> is_pruned_state_dict(nn.Linear(2, 2).state_dict())
        False
    """
    return bool(pruned_names(state_dict))


@changes.atomic
def restore_pruning(model: nn.Module, state_dict: Mapping[str, Tensor]) -> list[str]:
    """Reparametrize ``model`` like the model ``state_dict`` was saved from.

    Every tensor saved as ``<name>_orig`` and ``<name>_mask`` and not yet pruned in ``model`` is
    pruned with the saved mask (a ``CustomFromMask`` hook), so that
    ``model.load_state_dict(state_dict, strict=True)`` works. The values of ``<name>_orig`` are
    left to that load. Everything is checked before ``model`` is changed.

    A tensor saved in the lean mode of ``Pruner(..., masking="inplace")`` (a bool ``<name>_mask``
    next to ``<name>``, no ``<name>_orig``) gets an all-``True`` bool ``<name>_mask`` buffer
    (its values are left to the load, like the weights').

    Tied weights: all the modules holding one parameter of ``model`` get one shared mask. The
    state_dict may hold the parameter under several names (a torch state_dict has every alias,
    and their masks must be equal) or under fewer: Hugging Face's ``save_pretrained`` keeps one
    name of a tied parameter and may drop ``<alias>_orig`` but keep ``<alias>_mask``. Such an
    orphan ``<alias>_mask`` is accepted when its tensor is tied to one saved pruned with an equal
    mask; an orphan that cannot be explained so is an error naming the key, not a guess. The
    aliases a state_dict leaves out are then missing keys of a strict load (load non-strictly
    and check that only they are missing, or load through ``from_pretrained``).

    Args:
        model: A model with the architecture of the saved one.
        state_dict: The saved state_dict, e.g. ``checkpoint["state_dict"]``.

    Returns:
        The fully qualified names newly reparametrized (every name of a tied parameter; already
        pruned ones are skipped).

    Raises:
        ValueError: A key naming a module the model lacks, a tensor that is not a parameter of
            its module, a saved tensor whose shape differs from the model's, aliases of one
            parameter saved with different values or masks (or one pruned, another dense), or an
            orphan ``<name>_mask`` whose pruning cannot be restored.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> state = {"weight_orig": torch.ones(2, 2), "weight_mask": torch.eye(2), "bias": torch.zeros(2)}
        >>> model = nn.Linear(2, 2)
        >>> restore_pruning(model, state), model.weight_mask
        (['weight'], tensor([[1., 0.],
                [0., 1.]]))
    """  # noqa: E501
    lean = _plan_lean(model, state_dict)
    plan = _plan(model, state_dict)
    restored: list[str] = []
    for group in lean:
        install_mask(group.pairs, mask_like(group.parameter))
        restored.extend(group.names)
    for group, mask in plan:
        unpruned = [(m, n) for m, n in group.pairs if not is_pruned_tensor(m, n)]
        pruned = [(m, n) for m, n in group.pairs if is_pruned_tensor(m, n)]
        if pruned:  # partly pruned already: the others join its mask, the load fills it
            shared: Tensor = getattr(pruned[0][0], pruned[0][1] + "_mask")
        else:
            like = group.parameter
            shared = mask.detach().to(device=like.device, dtype=like.dtype, copy=True)
        share_mask(unpruned, shared)
        restored.extend(group.names)
    return restored


def _plan(model: nn.Module, state_dict: Mapping[str, Tensor]) -> list[tuple[TiedParameter, Tensor]]:
    """Check every pruned key and return, per parameter with a holder not yet pruned in
    ``model``, its group and its saved mask; nothing is changed."""
    aliases = alias_map(model)
    saved: dict[int, tuple[TiedParameter, str]] = {}  # the first name saved pruned, per group
    for fq_name in pruned_names(state_dict):
        group = aliases.get(fq_name)
        if group is None:
            _owner_parameter(model, fq_name, fq_name + "_orig")  # raises, naming what is wrong
            raise ValueError(
                f"Expected the key {fq_name + '_orig'!r} to name a tensor of the model, but "
                f"{fq_name!r} is the parameter of a pruned tensor."
            )
        _check_shapes(state_dict, fq_name, ("_orig", "_mask"), group)
        first = saved.setdefault(id(group.parameter), (group, fq_name))[1]
        _check_same(state_dict, first, fq_name, ("_orig", "_mask"))
    accounted = {mask for _, mask in saved_mask_keys(state_dict).values()}
    for key in state_dict:
        if not key.endswith("_mask") or key in accounted:
            continue
        fq_name = key[: -len("_mask")]
        group = aliases.get(fq_name)
        if group is None or _is_model_buffer(model, key):
            continue  # not a pruning mask of a tensor of the model: for the load to judge
        if id(group.parameter) not in saved:
            raise ValueError(
                f"Expected {fq_name + '_orig'!r} next to {key!r} in the state_dict, but it is "
                f"missing, and {fq_name!r} is not tied to a tensor saved pruned (its names: "
                f"{list(group.names)}): the pruning of {fq_name!r} cannot be restored."
            )
        _check_shapes(state_dict, fq_name, ("_mask",), group)
        _check_same(state_dict, saved[id(group.parameter)][1], fq_name, ("_mask",))
    plan: list[tuple[TiedParameter, Tensor]] = []
    for group, first in saved.values():
        dense = [name for name in group.names if name in state_dict]
        if dense:
            raise ValueError(
                f"Expected every saved name of the tied parameter {group.names} to be pruned, "
                f"but {first!r} is saved pruned and {dense} dense (a checkpoint that masked only "
                "some holders of a tied weight): its pruning cannot be restored consistently."
            )
        if any(not is_pruned_tensor(m, n) for m, n in group.pairs):
            plan.append((group, state_dict[first + "_mask"]))
    return plan


def _plan_lean(model: nn.Module, state_dict: Mapping[str, Tensor]) -> list[TiedParameter]:
    """Check every lean key (a bool ``<name>_mask`` next to ``<name>``) and return the groups
    of the model without a lean mask yet; nothing is changed."""
    aliases = alias_map(model)
    plan: dict[int, TiedParameter] = {}
    for fq_name in lean_names(state_dict):
        group = aliases.get(fq_name)
        if group is None:
            _owner_parameter(model, fq_name, fq_name)  # raises, naming what is wrong
            raise ValueError(
                f"Expected the key {fq_name!r} to name a tensor of the model, but it names "
                "the parameter of a pruned tensor."
            )
        module, name = group.pairs[0]
        if is_pruned_tensor(module, name):
            raise ValueError(
                f"Expected ({type(module).__name__}, {name!r}) ({fq_name!r}), saved with a lean "
                "bool mask, not to be pruned by the reparametrization in the model, but it has "
                f"`{name}_orig`."
            )
        _check_shapes(state_dict, fq_name, ("", "_mask"), group)
        if lean_mask(module, name) is None:
            plan.setdefault(id(group.parameter), group)
    return list(plan.values())


def _owner_parameter(model: nn.Module, fq_name: str, key: str) -> None:
    """Raise the error that says why ``fq_name`` is not a parameter of the model."""
    module, name = owner(model, fq_name, f"the key {key!r} to name a tensor of the model")
    if parameter_of(module, name) is None:
        raise ValueError(
            f"Expected the key {key!r} to name a parameter, but ({type(module).__name__}, "
            f"{name!r}) is not a parameter of module {fq_name.rpartition('.')[0]!r}."
        )


def _is_model_buffer(model: nn.Module, key: str) -> bool:
    """Whether ``key`` is a buffer of ``model`` (the mask of a tensor pruned in it already)."""
    module_name, _, name = key.rpartition(".")
    return name in model.get_submodule(module_name)._buffers


def _check_shapes(
    state_dict: Mapping[str, Tensor], fq_name: str, suffixes: tuple[str, ...], group: TiedParameter
) -> None:
    module, name = group.pairs[0]
    shape = tuple(group.parameter.shape)
    for suffix in suffixes:
        value = state_dict[fq_name + suffix]
        if not isinstance(value, Tensor) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, Tensor) else repr(value)
            raise ValueError(
                f"Expected {fq_name + suffix!r} to have the shape of "
                f"({type(module).__name__}, {name!r}), {shape}, but got {got}."
            )


def _check_same(
    state_dict: Mapping[str, Tensor], first: str, fq_name: str, suffixes: tuple[str, ...]
) -> None:
    """Two names of one tied parameter must be saved with equal values."""
    for suffix in suffixes:
        a, b = state_dict[first + suffix], state_dict[fq_name + suffix]
        if a is not b and not torch.equal(a, b.to(a.device)):
            raise ValueError(
                f"Expected {first + suffix!r} and {fq_name + suffix!r}, names of one tied "
                "parameter of the model, to be saved equal, but they differ: the pruning of "
                f"{fq_name!r} cannot be restored."
            )
