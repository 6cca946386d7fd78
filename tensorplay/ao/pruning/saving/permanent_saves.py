"""Every save of a model under pruning in the permanent form, and that form loaded back.

:func:`save_permanent` hooks the modules that hold a pruner's targets so that ``state_dict()``
returns what :func:`~tensorplay.ao.pruning.masking.permanent.permanent_state_dict` returns: each
masked tensor ``<name>`` as its masked values (pruned units ``+0.0``), no ``<name>_orig`` or
``<name>_mask``, tied weights one tensor. Whatever saves through ``state_dict()`` then writes a
model that loads into the unpruned class with no tensorplay code: ``save_pretrained``, a
training framework's checkpoints, ``torch.save(model.state_dict())``. The model itself is not
changed: it keeps its masks and trains on.

``load_state_dict`` takes that form back: a ``<name>`` loads into the values (``<name>_orig``,
or the lean parameter) and its zeros into the mask, as a state_dict in the training form brings
its ``<name>_mask``. What the zeros of a saved model cannot tell is which zeros were pruned and
which were kept weights that happen to be exactly zero (a zero-initialised LoRA ``B``): those
load pruned. :func:`kept_zeros` lists them (usually none) when the model is saved, and
:func:`restore_masks` rebuilds the exact masks from the loaded zeros and that list, so a run
saved this way resumes with the masks it had.

``state_dict(keep_vars=True)`` (which asks for the live parameters) is left in the training form.
A lean tensor (``masking="inplace"``) whose pruned weights are not zero cannot be saved right
(the model computes with them, the saved one would not): its save raises, naming it.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.conductor import Pruner
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> pruner = Pruner(model, OneShotSchedule(0.5))
    >>> _ = pruner.step()
    >>> saves = save_permanent(pruner)
    >>> state = model.state_dict()
    >>> list(state)  # as the unpruned model's
    ['0.weight', '0.bias', '2.weight', '2.bias']
    >>> fresh = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> fresh.load_state_dict(state, strict=True)
    <All keys matched successfully>
    >>> x = torch.randn(3, 4)
    >>> torch.equal(fresh(x), model(x))
    True
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking.lean_masks import (
    MASK_SUFFIX,
    lean_mask,
    revived_counts,
)
from tensorplay.ao.pruning.masking.permanent import (
    check_permanent_hooks,
    dense_order,
    masked_tensor,
)
from tensorplay.ao.pruning.masking.readers import masked_values
from tensorplay.ao.pruning.parity.reparametrization import pruned_tensor_names
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.selection import is_dtensor

__all__ = ["PermanentSaves", "kept_zeros", "restore_masks", "save_permanent"]

_ORIG = "_orig"


def _masked_names(module: nn.Module) -> list[str]:
    """The module's own masked tensor names, in either format, in parameter order."""
    reparametrized = pruned_tensor_names(module)
    lean = [name for name in module._parameters if lean_mask(module, name) is not None]
    return [*reparametrized, *lean]


# One masked tensor per (values, mask) while a state_dict is being made, so that the holders of a
# tied parameter save the same tensor object (``save_pretrained`` and ``safetensors`` see the tie
# by its storage). Weak: the entry goes when the state_dict that holds the tensor does.
_MASKED: weakref.WeakValueDictionary[tuple[int, int, int, int], Tensor] = (
    weakref.WeakValueDictionary()
)


def _permanent(values: Tensor, mask: Tensor) -> Tensor:
    key = (id(values), values._version, id(mask), mask._version)
    found = _MASKED.get(key)
    if found is None:
        found = masked_tensor(values, mask)
        _MASKED[key] = found
    return found


def _check_lean_zeros(module: nn.Module, name: str, prefix: str) -> None:
    """A lean tensor computes with its weights as they are: pruned ones must be zero."""
    mask = lean_mask(module, name)
    if mask is None:
        return
    revived = revived_counts([module._parameters[name]], [mask])[0]  # type: ignore[list-item]
    if revived:
        raise ValueError(
            f"Expected the pruned weights of ({type(module).__name__}, {name!r}) "
            f"({prefix + name!r}) to be zero when the model is saved, but {revived} are not (an "
            "optimizer that is not attached to the pruner, or a hand edit, changed them): the "
            "saved model would compute with other weights than this one. Zero them with "
            "pruner.apply_masks() (and attach the optimizer with pruner.attach) before saving."
        )


class _SavePermanent:
    """A ``state_dict`` post-hook: the module's masked tensors in the permanent form.

    The module's keys and its children's are the tail of the state_dict when it runs; they are
    put back with the module's parameters in the unpruned module's order.
    """

    def __call__(
        self, module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any
    ) -> None:
        names = _masked_names(module)
        if not names:
            return
        first = names[0] + _ORIG if names[0] + _ORIG in module._parameters else names[0]
        if state_dict.get(prefix + first) is module._parameters[first]:
            return  # keep_vars=True: the caller asked for the live tensors
        check_permanent_hooks(module, prefix.removesuffix("."))
        for name in names:
            _check_lean_zeros(module, name, prefix)
        tail: list[tuple[str, Any]] = []
        while state_dict and next(reversed(state_dict)).startswith(prefix):
            key = next(reversed(state_dict))
            tail.append((key, state_dict.pop(key)))
        tail.reverse()
        saved = dict(tail)
        order = dense_order(module, names)
        for param in order:
            if param in names:
                values, mask = masked_values(module, param)  # type: ignore[misc]
                state_dict[prefix + param] = _permanent(values, mask)
            elif prefix + param in saved:
                state_dict[prefix + param] = saved[prefix + param]
        replaced = {prefix + name + suffix for name in names for suffix in (_ORIG, MASK_SUFFIX)}
        for key, value in tail:
            if key not in replaced and key not in state_dict:
                state_dict[key] = value  # buffers, then the children's keys


class _LoadPermanent:
    """A ``load_state_dict`` pre-hook: a masked tensor saved as ``<name>`` loads into its values,
    and its zeros into its mask; records which names were loaded that way."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.prefix = ""

    def __call__(
        self,
        module: nn.Module,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        self.prefix = prefix
        for name in _masked_names(module):
            key, mask_key = prefix + name, prefix + name + MASK_SUFFIX
            found = masked_values(module, name)
            value = state_dict.get(key)
            if found is None or not isinstance(value, Tensor):
                continue  # missing: for the load to judge
            if name + _ORIG in module._parameters:
                if key + _ORIG in state_dict:
                    continue  # the training form
                state_dict[key + _ORIG] = state_dict.pop(key)
            elif mask_key in state_dict:
                continue  # the lean training form
            state_dict[mask_key] = (value != 0).to(dtype=found[1].dtype)
            self.loaded.add(name)


class _AfterLoad:
    """A ``load_state_dict`` post-hook: a holder the saved file left out (a tied weight saved
    once) is reported missing under its permanent name, as for a model that is not pruned."""

    def __init__(self, loading: _LoadPermanent) -> None:
        self.loading = loading

    def __call__(self, module: nn.Module, incompatible_keys: Any) -> None:
        prefix, missing = self.loading.prefix, incompatible_keys.missing_keys
        for name in _masked_names(module):
            values = name if lean_mask(module, name) is not None else name + _ORIG
            keys = [prefix + values, prefix + name + MASK_SUFFIX]
            if all(key in missing for key in keys):
                for key in keys:
                    missing.remove(key)
                missing.append(prefix + name)


class PermanentSaves:
    """The hooks :func:`save_permanent` put on a pruner's holders, and what they loaded.

    Args:
        pruner: The pruner whose targets' holders are hooked.
    """

    def __init__(self, pruner: Pruner) -> None:
        self.pruner = pruner
        self._pairs = _target_pairs(pruner)
        self._loads = {id(m): _installed(m) for pairs in self._pairs for m, _ in pairs}

    def loaded(self) -> list[str]:
        """The targets that a ``load_state_dict`` in the permanent form loaded into (any
        holder of a tied one) since :meth:`forget_loads`."""
        return [
            target
            for target, pairs in zip(self.pruner.targets, self._pairs, strict=True)
            if any(name in self._loads[id(module)].loaded for module, name in pairs)
        ]

    def forget_loads(self) -> None:
        """Start recording :meth:`loaded` afresh."""
        for loading in self._loads.values():
            loading.loaded.clear()


def _installed(module: nn.Module) -> _LoadPermanent:
    """Hook ``module`` once (a second pruner of the same model finds the hooks in place)."""
    for hook in module._load_state_dict_pre_hooks.values():
        inner = getattr(hook, "hook", None)
        if isinstance(inner, _LoadPermanent):
            return inner
    loading = _LoadPermanent()
    changes.hook(module.register_state_dict_post_hook, _SavePermanent())
    changes.hook(module.register_load_state_dict_pre_hook, loading)
    changes.hook(module.register_load_state_dict_post_hook, _AfterLoad(loading))
    return loading


def _target_pairs(pruner: Pruner) -> list[list[tuple[nn.Module, str]]]:
    """Every ``(module, name)`` holder of each target, in target order."""
    model = pruner.model
    out = []
    for names in pruner.aliases.values():
        pairs = []
        for fq_name in names:
            prefix, _, name = fq_name.rpartition(".")
            pairs.append((model.get_submodule(prefix), name))
        out.append(pairs)
    return out


def save_permanent(pruner: Pruner) -> PermanentSaves:
    """Make the model of ``pruner`` save in the permanent form and load it back (see the
    module); calling it again, or for a second pruner of the same model, hooks no module twice.

    Raises:
        ValueError: A sharded (``DTensor``) target: its permanent form is not a plain tensor.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> model = nn.Linear(4, 2)
        >>> pruner = Pruner(model, OneShotSchedule(0.5, step=3))
        >>> pruner.reparametrize()
        >>> _ = save_permanent(pruner)
        >>> sorted(model.state_dict()), sorted(model.state_dict(keep_vars=True))
        (['bias', 'weight'], ['bias', 'weight_mask', 'weight_orig'])
    """
    for target, (module, name) in zip(pruner.targets, pruner.pairs, strict=True):
        found = masked_values(module, name)
        if is_dtensor(getattr(module, name) if found is None else found[0]):
            raise ValueError(
                f"Expected plain tensors for permanent saves, but the target {target!r} is a "
                "DTensor (sharded): save its shards with the distributed checkpoint instead."
            )
    return PermanentSaves(pruner)


def kept_zeros(pruner: Pruner, targets: Iterable[str] | None = None) -> dict[str, Tensor]:
    """Per target (of ``targets``, default all) with any, the flat indices of its kept units
    whose value is exactly zero: what the zeros of its permanent form cannot tell from pruned
    units.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> model = nn.Linear(3, 1, bias=False)
        >>> with torch.no_grad():
        ...     _ = model.weight.copy_(torch.tensor([[0.0, 2.0, -1.0]]))
        >>> pruner = Pruner(model, OneShotSchedule(0.0))
        >>> pruner.reparametrize()
        >>> kept_zeros(pruner)
        {'weight': tensor([0])}
    """
    out = {}
    chosen = None if targets is None else set(targets)
    for target, (module, name) in zip(pruner.targets, pruner.pairs, strict=True):
        if chosen is not None and target not in chosen:
            continue
        found = masked_values(module, name)
        if found is None:
            continue
        values, mask = found
        with torch.no_grad():
            kept = (mask != 0) & (values.detach() == 0)
            indices = kept.reshape(-1).nonzero().reshape(-1).cpu()
        if indices.numel():
            out[target] = indices
    return out


def restore_masks(
    pruner: Pruner, kept: Mapping[str, Tensor], targets: Iterable[str] | None = None
) -> None:
    """Make each target's mask (of ``targets``, default all) what a model saved in the
    permanent form had: a unit is kept where the loaded value is not zero or where ``kept``
    (:func:`kept_zeros` of that model) lists it. Tied holders share the mask, which is written
    in place.

    Raises:
        ValueError: ``kept`` names a target the pruner lacks or an index out of range.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> model = nn.Linear(3, 1, bias=False)
        >>> pruner = Pruner(model, OneShotSchedule(0.0))
        >>> pruner.reparametrize()
        >>> with torch.no_grad():
        ...     _ = model.weight_orig.copy_(torch.tensor([[0.0, 2.0, 0.0]]))
        >>> restore_masks(pruner, {"weight": torch.tensor([0])})
        >>> model.weight_mask
        tensor([[1., 1., 0.]])
    """
    pairs = dict(zip(pruner.targets, pruner.pairs, strict=True))
    unknown = sorted(set(kept) - set(pairs))
    if unknown:
        raise ValueError(
            f"Expected the kept zeros to name targets of the pruner, but got {unknown} (its "
            f"targets: {pruner.targets})."
        )
    chosen = list(pairs) if targets is None else list(targets)
    plans = []
    for name in chosen:
        found = masked_values(*pairs[name])
        if found is None:
            continue
        values, mask = found
        with torch.no_grad():
            keep = (values.detach() != 0).reshape(-1)
            indices = kept.get(name)
            if indices is not None:
                indices = indices.to(device=keep.device, dtype=torch.long)
                low, high = (int(indices.min()), int(indices.max())) if indices.numel() else (0, 0)
                if low < 0 or high >= keep.numel():
                    raise ValueError(
                        f"Expected the kept zeros of {name!r} to index its {keep.numel()} "
                        f"units, but got {low}..{high}."
                    )
                keep[indices] = True
        plans.append((mask, keep.reshape(mask.shape)))
    with torch.no_grad():
        for mask, keep in plans:
            mask.copy_(keep.to(mask.dtype))
    pruner.apply_masks()
