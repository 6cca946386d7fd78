"""A frozen, dense, plain copy of a model as it computes now: the default distillation teacher.

:func:`dense_copy` copies a model, pruned or not, into one that computes the same outputs but
carries no pruning: a tensor masked by the reparametrization (``<name>_orig``, ``<name>_mask``
and a forward pre-hook) or by a lean mask (a bool ``<name>_mask`` beside the weight) becomes a
plain parameter ``<name>`` holding its masked values, and the masks, the ``_orig`` parameters
and the pruning hooks are left out. Every parameter is frozen (``requires_grad=False``), holds
its own memory (nothing is shared with the model, so training the model never changes the
copy) and is optionally converted to a lower ``dtype``; a tie (one parameter held by several
modules) stays one parameter. Anything else (the modules' other attributes, the user's own
hooks) is deep-copied.

The copy is made without a transient copy of what it leaves out: masks and ``_orig`` values are
never copied, and each tensor is converted to ``dtype`` as it is copied, so a bfloat16 copy of a
float32 model needs 2 bytes per parameter at every moment (plus one tensor's float32 product of
a mask and its values while that tensor is copied).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.methods import l1_unstructured
    >>> model = l1_unstructured(nn.Linear(4, 2), "weight", amount=3)
    >>> teacher = dense_copy(model)
    >>> sorted(teacher.state_dict()), teacher._forward_pre_hooks
    (['bias', 'weight'], OrderedDict())
    >>> x = torch.randn(5, 4)
    >>> torch.equal(teacher(x), model(x).detach()), teacher.weight.requires_grad
    (True, False)
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from tensorplay.ao.pruning.distillation.left_out import drop_left_out_hooks, left_out_memo
from tensorplay.ao.pruning.distillation.sharded_copy import sharded_copy
from tensorplay.ao.pruning.masking.frozen_copies import FrozenCopies
from tensorplay.ao.pruning.masking.module_masks import read_masks
from tensorplay.ao.pruning.selection.sharding import first_dtensor

__all__ = ["dense_copy"]


def dense_copy(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A frozen copy of ``model`` that computes what ``model`` computes now, with every masked
    tensor made a plain parameter of its masked values and no pruning state (the module).

    A model sharded with FSDP2 (``DTensor`` parameters) is copied shard by shard into a copy
    sharded like it (:func:`~tensorplay.ao.pruning.distillation.sharded_copy.sharded_copy`;
    collective).

    Args:
        model: Any module, under pruning (either masking mode) or not, on any device.
        dtype: The floating-point dtype of the copy's floating-point parameters and buffers
            (as ``model.to(dtype)`` converts them), e.g. ``torch.bfloat16`` to halve a float32
            model's memory; ``None`` keeps each tensor's dtype.

    Returns:
        The copy, in eval mode, on the model's devices; none of its parameters requires a
        gradient or shares memory with the model. The model is not changed.

    Raises:
        TypeError: ``model`` is not a module, or ``dtype`` is not a floating-point dtype.
        ValueError: ``model`` holds ``DTensor`` buffers but no ``DTensor`` parameter (naming
            one), or is sharded in a way
            :func:`~tensorplay.ao.pruning.distillation.sharded_copy.sharded_copy` refuses.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning import Pruner, OneShotSchedule
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> _ = Pruner(model, OneShotSchedule(0.5), masking="inplace").step()
        >>> sorted(model.state_dict())[:3]
        ['0.bias', '0.weight', '0.weight_mask']
        >>> teacher = dense_copy(model, dtype=torch.bfloat16)
        >>> sorted(teacher.state_dict()), teacher[0].weight.dtype
        (['0.bias', '0.weight', '2.bias', '2.weight'], torch.bfloat16)
        >>> sum(int((teacher[i].weight == 0).sum()) for i in (0, 2))  # half of 48, as pruned
        24
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"Expected `model` to be a torch.nn.Module, but got {model!r}.")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(
            f"Expected `dtype` to be a floating-point torch.dtype or None, but got {dtype!r}."
        )
    found = first_dtensor(model)  # the one question the choice of copy asks of the model
    if found is not None:
        name, parameter = found
        if not parameter:
            raise ValueError(
                f"Expected a model whose DTensors include its parameters (sharded with FSDP2, "
                f"copied shard by shard) or plain tensors only, but {name} is a DTensor and no "
                "parameter is: pass a teacher you built yourself."
            )
        return sharded_copy(model, dtype)
    return _plain_copy(model, dtype)


def _plain_copy(model: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """:func:`dense_copy` of a model of plain tensors: its masked tensors frozen as they
    compute, then everything else deep-copied, the hooks it leaves out dropped."""
    memo = left_out_memo(model)
    FrozenCopies(read_masks(model), dtype, memo).fill(model)
    clone: nn.Module = copy.deepcopy(model, memo)
    for module in clone.modules():
        drop_left_out_hooks(module)
    return clone.eval()
