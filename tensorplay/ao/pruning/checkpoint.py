"""Rebuilding pruning on a fresh model from a pruned state_dict.

A pruned tensor ``name`` is saved as ``<name>_orig`` and ``<name>_mask``, not as ``<name>``, so a
fresh model refuses a pruned checkpoint under ``strict=True``. :func:`restore_pruning` puts the
reparametrization on every tensor the state_dict says is pruned, and the strict load then works.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.methods import l1_unstructured
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

from torch import Tensor, nn

from tensorplay.ao.pruning.methods import custom_from_mask
from tensorplay.ao.pruning.stats import _is_pruned_tensor
from tensorplay.ao.pruning.targets import _owner

__all__ = ["is_pruned_state_dict", "pruned_names", "restore_pruning"]


def pruned_names(state_dict: Mapping[str, object]) -> list[str]:
    """The fully qualified names of the pruned tensors in ``state_dict``, in key order.

    A tensor is pruned when both ``<name>_orig`` and ``<name>_mask`` are keys.

    Example:
        >>> pruned_names({"fc.weight_orig": 0, "fc.weight_mask": 0, "fc.bias": 0})
        ['fc.weight']
    """
    return [
        key[: -len("_orig")]
        for key in state_dict
        if key.endswith("_orig") and key[: -len("_orig")] + "_mask" in state_dict
    ]


def is_pruned_state_dict(state_dict: Mapping[str, object]) -> bool:
    """Whether ``state_dict`` holds at least one pruned tensor (``_orig`` and ``_mask`` keys).

    Example:
        >>> from torch import nn
        >>> is_pruned_state_dict(nn.Linear(2, 2).state_dict())
        False
    """
    return bool(pruned_names(state_dict))


def restore_pruning(model: nn.Module, state_dict: Mapping[str, Tensor]) -> list[str]:
    """Reparametrize ``model`` like the model ``state_dict`` was saved from.

    Every tensor saved as ``<name>_orig`` and ``<name>_mask`` and not yet pruned in ``model`` is
    pruned with the saved mask (a ``CustomFromMask`` hook), so that
    ``model.load_state_dict(state_dict, strict=True)`` works. The values of ``<name>_orig`` are
    left to that load. Everything is checked before ``model`` is changed.

    Args:
        model: A model with the architecture of the saved one.
        state_dict: The saved state_dict, e.g. ``checkpoint["state_dict"]``.

    Returns:
        The fully qualified names newly reparametrized (already pruned ones are skipped).

    Raises:
        ValueError: A key naming a module the model lacks, a tensor that is not a parameter of
            its module, or a saved tensor whose shape differs from the model's.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> state = {"weight_orig": torch.ones(2, 2), "weight_mask": torch.eye(2), "bias": torch.zeros(2)}
        >>> model = nn.Linear(2, 2)
        >>> restore_pruning(model, state), model.weight_mask
        (['weight'], tensor([[1., 0.],
                [0., 1.]]))
    """  # noqa: E501
    todo: list[tuple[str, nn.Module, str, Tensor]] = []
    for fq_name in pruned_names(state_dict):
        expected = f"the key {fq_name + '_orig'!r} to name a tensor of the model"
        module, name = _owner(model, fq_name, expected)
        if _is_pruned_tensor(module, name):
            current: Tensor = getattr(module, name + "_orig")
        else:
            param = module._parameters.get(name)
            if param is None:
                raise ValueError(
                    f"Expected the key {fq_name + '_orig'!r} to name a parameter, but "
                    f"({type(module).__name__}, {name!r}) is not a parameter of module "
                    f"{fq_name.rpartition('.')[0]!r}."
                )
            current = param
        for suffix in ("_orig", "_mask"):
            saved = state_dict[fq_name + suffix]
            if not isinstance(saved, Tensor) or saved.shape != current.shape:
                got = tuple(saved.shape) if isinstance(saved, Tensor) else repr(saved)
                raise ValueError(
                    f"Expected {fq_name + suffix!r} to have the shape of "
                    f"({type(module).__name__}, {name!r}), {tuple(current.shape)}, but got {got}."
                )
        if not _is_pruned_tensor(module, name):
            todo.append((fq_name, module, name, state_dict[fq_name + "_mask"]))
    for _, module, name, mask in todo:
        like: Tensor = getattr(module, name)
        custom_from_mask(module, name, mask.detach().to(device=like.device, dtype=like.dtype))
    return [fq_name for fq_name, *_ in todo]
