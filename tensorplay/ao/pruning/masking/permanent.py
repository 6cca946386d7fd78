"""The state_dict of a model under pruning, as if the pruning were permanent.

A model under pruning saves ``<name>_orig`` and ``<name>_mask`` for every pruned tensor. That is
what resuming needs, but nothing else can read it: a fresh model, ``from_pretrained`` or a
deployment runtime expects ``<name>``. :func:`permanent_state_dict` returns the state_dict the
model would have after :meth:`~tensorplay.ao.pruning.Pruner.make_permanent`, without changing the
model, so training can go on:

.. code-block:: python

    model.save_pretrained(directory, state_dict=permanent_state_dict(model))  # Hugging Face
    torch.save(permanent_state_dict(model), "deploy.pt")                      # plain torch

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.methods import l1_unstructured
    >>> model = l1_unstructured(nn.Linear(3, 2), "weight", amount=4)
    >>> sorted(model.state_dict())
    ['bias', 'weight_mask', 'weight_orig']
    >>> state = permanent_state_dict(model)
    >>> list(state), int((state["weight"] == 0).sum())
    (['weight', 'bias'], 4)
    >>> fresh = nn.Linear(3, 2)
    >>> fresh.load_state_dict(state, strict=True)
    <All keys matched successfully>
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.masking.lean_masks import MASK_SUFFIX, lean_mask
from tensorplay.ao.pruning.masking.readers import masked_values
from tensorplay.ao.pruning.parity.aliases import parameter_groups, tensor_name
from tensorplay.ao.pruning.parity.reparametrization import pruned_tensor_names

__all__ = [
    "check_permanent_hooks",
    "dense_order",
    "masked_tensor",
    "permanent_state_dict",
    "share_storage",
    "view_identity",
]


def permanent_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """``model.state_dict()`` as if every pruned tensor had been made permanent; the model is
    left exactly as it is (parameters, masks, hooks, gradients).

    Every pruned tensor ``<name>`` is saved as ``mask * orig`` in the parameter's dtype (what the
    model computes with; a lean tensor of ``masking="inplace"`` as its values, its bool
    ``<name>_mask`` dropped), its zeros all ``+0.0`` (the product is ``-0.0`` where a negative
    weight is pruned: equal, but it would cost :func:`~tensorplay.ao.pruning.save_sparse` space),
    and its ``<name>_orig`` and ``<name>_mask`` keys are dropped. Everything else is what
    ``model.state_dict()`` returns: tensors that share memory with the model, like any state_dict.

    * **Key order** is that of the unpruned model: pruning moves ``<name>_orig`` to the end of its
      module's parameters, so a pruned tensor is put back before the module's first remaining
      ``bias`` when its name has ``weight`` in it (``nn.RNN``-like modules: the order of their
      ``_flat_weights_names``), else at the end.
    * **Tied aliases** (one parameter under several names, such as a language model's embedding
      and output head, see :mod:`~tensorplay.ao.pruning.parity.aliases`) are one tensor object under
      all their names, so libraries that de-duplicate tied weights (``save_pretrained``,
      ``safetensors``) see the tie. If the holders of one parameter are masked differently (only
      one of them pruned) they compute with different weights: each name then gets its own
      tensor, and a :class:`UserWarning` names them.

    Args:
        model: Any module, pruned or not.

    Returns:
        A new dict of detached tensors.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning import global_unstructured, L1Unstructured
        >>> embedding, head = nn.Embedding(5, 2), nn.Linear(2, 5, bias=False)
        >>> head.weight = embedding.weight  # tied
        >>> model = nn.ModuleDict({"wte": embedding, "lm_head": head})
        >>> global_unstructured([(head, "weight"), (embedding, "weight")], L1Unstructured, amount=4)
        >>> state = permanent_state_dict(model)
        >>> list(state), state["wte.weight"] is state["lm_head.weight"]
        (['wte.weight', 'lm_head.weight'], True)
        >>> sorted(model.state_dict())[:2]  # the model is still under pruning
        ['lm_head.weight_mask', 'lm_head.weight_orig']
    """
    for prefix, module in model.named_modules():
        check_permanent_hooks(module, prefix)
    state = model.state_dict()
    modules = dict(model.named_modules(remove_duplicate=False))
    masked: dict[tuple[int, int], Tensor] = {}  # one tensor per (orig, mask): ties stay tied
    out: dict[str, Tensor] = {}
    emitted: set[str] = set()
    for key, value in state.items():
        prefix, _, local = key.rpartition(".")
        module = modules.get(prefix)
        pruned = _pruned_names(module) if module is not None else []
        if module is not None and lean_mask(module, local) is not None:
            out[key] = _permanent_tensor(module, local, masked)
        elif module is not None and _is_lean_mask(module, local):
            continue
        elif module is None or not pruned:
            out[key] = value
        elif local in module._parameters:
            if prefix not in emitted:  # the module's whole parameter block, in dense order
                emitted.add(prefix)
                for name in dense_order(module, pruned):
                    fq_name = f"{prefix}.{name}" if prefix else name
                    if name in pruned:
                        out[fq_name] = _permanent_tensor(module, name, masked)
                    elif fq_name in state:
                        out[fq_name] = state[fq_name]
        elif not (local.endswith("_mask") and local[: -len("_mask")] in pruned):
            out[key] = value
    out = share_storage(out)
    _warn_on_split_ties(model, out)
    return out


def check_permanent_hooks(module: nn.Module, name: str) -> None:
    """Refuse the permanent form of ``module`` where a forward hook of tensorplay's keeps it
    computing what a copy without the hook would not (the hook's ``permanent_refusal(module)``
    says why: a norm over a residual stream whose hidden channels are masked).

    Raises:
        ValueError: Naming the module and why.

    Example:
        >>> from torch import nn
        >>> check_permanent_hooks(nn.Linear(2, 2), "fc")  # no such hook: nothing to refuse
    """
    for hook in module._forward_hooks.values():
        refusal = getattr(hook, "permanent_refusal", None)
        why = refusal(module) if callable(refusal) else None
        if why is not None:
            raise ValueError(
                f"Expected a model whose permanent form computes what it does, but {name!r} "
                f"({type(module).__name__}) {why}"
            )


def masked_tensor(orig: Tensor, mask: Tensor) -> Tensor:
    """``mask * orig`` in ``orig``'s dtype, detached, every zero a ``+0.0``.

    ``mask * orig`` is ``-0.0`` where a negative weight is pruned: equal to ``0.0``, but not
    bitwise, so a compressed file would have to store half the pruned units. Nothing the model
    computes changes.

    Example:
        >>> import torch
        >>> masked = masked_tensor(torch.tensor([1.5, -2.0, -3.0]), torch.tensor([0.0, 1.0, 0.0]))
        >>> masked, torch.signbit(masked)
        (tensor([ 0., -2.,  0.]), tensor([False,  True, False]))
    """
    with torch.no_grad():
        product = (mask.to(dtype=orig.dtype) * orig).detach()
        if product.is_floating_point():
            product[product == 0] = 0.0  # -0.0 -> +0.0
        return product


def share_storage(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state`` with every tensor that is the same view of the same memory as an earlier one
    replaced by that earlier tensor object (tied weights read back from a state_dict).

    Example:
        >>> import torch
        >>> weight = torch.ones(2, 2)
        >>> state = share_storage({"a": weight.detach(), "b": weight.detach(), "c": weight[0]})
        >>> state["a"] is state["b"], state["a"] is state["c"]
        (True, False)
    """
    first: dict[tuple[object, ...], Tensor] = {}
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        identity = view_identity(tensor)
        out[key] = tensor if identity is None else first.setdefault(identity, tensor)
    return out


def view_identity(tensor: Tensor) -> tuple[object, ...] | None:
    """What makes two tensors the same view of the same memory (``None``: no memory).

    Example:
        >>> import torch
        >>> weight = torch.ones(2, 2)
        >>> view_identity(weight) == view_identity(weight.detach()) != view_identity(weight[0])
        True
    """
    if tensor.numel() == 0 or tensor.device.type == "meta":
        return None  # no memory to share
    return (
        tensor.device,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tensor.stride(),
        tensor.dtype,
    )


def _pruned_names(module: nn.Module) -> list[str]:
    """The module's own pruned tensor names, in the order of their ``_orig`` parameters."""
    hooked = set(pruned_tensor_names(module))
    return [
        name
        for key in module._parameters
        if (name := tensor_name(module, key)) != key and name in hooked
    ]


def dense_order(module: nn.Module, pruned: list[str]) -> list[str]:
    """The module's parameter names, the ``pruned`` ones (whose parameter is ``<name>_orig``)
    put back where the unpruned module had them (before its first bias, in
    ``_flat_weights_names`` order for recurrent layers).

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.parity.methods import identity
        >>> layer = identity(nn.Linear(2, 2), "weight")
        >>> list(layer._parameters), dense_order(layer, ["weight"])
        (['bias', 'weight_orig'], ['weight', 'bias'])
    """
    names = [tensor_name(module, key) for key, p in module._parameters.items() if p is not None]
    flat = getattr(module, "_flat_weights_names", None)  # nn.RNN, nn.LSTM, nn.GRU
    if isinstance(flat, list):
        rank = {name: index for index, name in enumerate(flat)}
        return sorted(names, key=lambda name: rank.get(name, len(rank)))
    order = [name for name in names if name not in pruned]
    for name in (name for name in names if name in pruned):
        before_bias = "weight" in name and "bias" not in name
        at = next((i for i, kept in enumerate(order) if before_bias and "bias" in kept), None)
        order.insert(len(order) if at is None else at, name)
    return order


def _permanent_tensor(
    module: nn.Module, name: str, masked: dict[tuple[int, int], Tensor]
) -> Tensor:
    """A masked tensor's permanent value, one per (values, mask) so ties stay tied: its values
    times its mask, every pruned unit ``+0.0`` (a lean tensor's in-place zeroing, like
    ``mask * orig``, leaves ``-0.0`` where a negative weight was pruned)."""
    found = masked_values(module, name)
    assert found is not None  # for mypy: only masked names get here
    values, mask = found
    key = (id(values), id(mask))
    if key not in masked:
        masked[key] = masked_tensor(values, mask)
    return masked[key]


def _is_lean_mask(module: nn.Module, key: str) -> bool:
    return key.endswith(MASK_SUFFIX) and lean_mask(module, key[: -len(MASK_SUFFIX)]) is not None


def _warn_on_split_ties(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    for group in parameter_groups(model):
        names = [name for name in group.names if name in state]
        if len({id(state[name]) for name in names}) > 1:
            warnings.warn(
                f"Expected the names {names} of one tied parameter to be masked alike, but their "
                "holders compute with different weights (some are not pruned, or pruned with "
                "another mask): each name is saved with its own tensor, and a loader that "
                "re-ties them (such as `from_pretrained`) keeps only one. Prune all the holders "
                "together, e.g. list every (module, name) pair in `global_unstructured`.",
                UserWarning,
                stacklevel=3,
            )
