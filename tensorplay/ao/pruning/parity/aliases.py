"""Which names reach which parameter: tied weights and shared modules.

One :class:`~torch.nn.Parameter` can be reached under several fully qualified names: a tied
embedding and LM head (``transformer.wte.weight`` and ``lm_head.weight`` of GPT-2), weights shared
between layers, or one module registered in two places. Pruning must treat such a parameter as one
set of units with one mask that every holder computes with, so every part of tensorplay asks this
module which names and ``(module, name)`` pairs belong together.

A pruned tensor is found under its own name (``"fc.weight"``), not under ``"fc.weight_orig"``.

Example:
    >>> from torch import nn
    >>> embedding, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    >>> head.weight = embedding.weight  # tied, as in a language model
    >>> model = nn.ModuleDict({"wte": embedding, "lm_head": head})
    >>> [group.names for group in parameter_groups(model)]
    [('wte.weight', 'lm_head.weight')]
"""

from __future__ import annotations

import gc
import itertools
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.frames import user_stacklevel
from tensorplay.ao.pruning.pair import Pair
from tensorplay.ao.pruning.parity.reparametrization import is_pruned_tensor

__all__ = [
    "ParameterTable",
    "TiedParameter",
    "alias_map",
    "parameter_groups",
    "tensor_name",
    "unmasked_holders",
    "warn_unmasked_holders",
]


@dataclass(frozen=True)
class TiedParameter:
    """One parameter and every way the model reaches it.

    Args:
        parameter: The parameter (``<name>_orig`` of a pruned tensor).
        names: Its fully qualified names in module order; the first is its canonical name.
        pairs: The distinct ``(module, name)`` pairs holding it (a module registered twice
            gives two names but one pair).

    Example:
        >>> from torch import nn
        >>> group = parameter_groups(nn.Linear(2, 2))[0]
        >>> group.names, group.is_tied
        (('weight',), False)
    """

    parameter: nn.Parameter
    names: tuple[str, ...]
    pairs: tuple[Pair, ...]

    @property
    def name(self) -> str:
        """The canonical (first) name."""
        return self.names[0]

    @property
    def is_tied(self) -> bool:
        """Whether more than one ``(module, name)`` pair holds the parameter."""
        return len(self.pairs) > 1


def tensor_name(module: nn.Module, param_name: str) -> str:
    """The tensor's own name for a key of ``module._parameters``: ``w_orig`` of a pruned ``w``
    is ``w``, anything else is itself.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.parity.methods import identity
        >>> module = identity(nn.Linear(2, 2), "weight")
        >>> tensor_name(module, "weight_orig"), tensor_name(module, "bias")
        ('weight', 'bias')
    """
    base = param_name.removesuffix("_orig")
    return base if base != param_name and is_pruned_tensor(module, base) else param_name


def parameter_groups(model: nn.Module) -> list[TiedParameter]:
    """Every parameter of ``model`` with all the names and pairs that reach it.

    Args:
        model: The model.

    Returns:
        One entry per distinct parameter, in the order its first name appears in
        ``model.named_modules()`` (shared modules visited under every path).

    Example:
        >>> from torch import nn
        >>> shared = nn.Linear(2, 2)
        >>> model = nn.Sequential(shared, nn.ReLU(), shared)
        >>> [(g.names, len(g.pairs)) for g in parameter_groups(model)]
        [(('0.weight', '2.weight'), 1), (('0.bias', '2.bias'), 1)]
    """
    names: dict[int, list[str]] = {}
    pairs: dict[int, dict[tuple[int, str], Pair]] = {}
    params: dict[int, nn.Parameter] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        prefix = f"{module_name}." if module_name else ""
        for param_name, param in module._parameters.items():
            if param is None:
                continue
            name = tensor_name(module, param_name)
            key = id(param)
            params.setdefault(key, param)
            names.setdefault(key, []).append(prefix + name)
            pairs.setdefault(key, {}).setdefault((id(module), name), (module, name))
    return [
        TiedParameter(params[key], tuple(dict.fromkeys(names[key])), tuple(pairs[key].values()))
        for key in params
    ]


def alias_map(model: nn.Module) -> dict[str, TiedParameter]:
    """Every fully qualified parameter name of ``model``, mapped to its :class:`TiedParameter`.

    Example:
        >>> from torch import nn
        >>> first, second = nn.Linear(2, 2), nn.Linear(2, 2)
        >>> second.weight = first.weight
        >>> groups = alias_map(nn.Sequential(first, second))
        >>> groups["1.weight"].names
        ('0.weight', '1.weight')
    """
    return {name: group for group in parameter_groups(model) for name in group.names}


@dataclass(frozen=True)
class ParameterTable:
    """A model's parameters read once: each name's :class:`TiedParameter`, and what planning
    code asks of them (canonical names, shapes, bytes per element, the count), so that a pass
    over the model's modules is made once, not once per question.

    Args:
        aliases: Every qualified name mapped to its parameter (:func:`alias_map`).

    Example:
        >>> from torch import nn
        >>> table = ParameterTable.of(nn.Linear(3, 2))
        >>> table.count, table.shapes["weight"], table.element_sizes["bias"]
        (8, torch.Size([2, 3]), 4)
    """

    aliases: Mapping[str, TiedParameter]

    @classmethod
    def of(cls, model: nn.Module) -> ParameterTable:
        """Read ``model``'s parameters."""
        return cls(alias_map(model))

    @cached_property
    def canonical(self) -> dict[str, str]:
        """Each name's canonical (first) name."""
        return {name: tied.names[0] for name, tied in self.aliases.items()}

    @cached_property
    def shapes(self) -> dict[str, torch.Size]:
        """Each name's shape (a pruned tensor's, under its own name)."""
        return {name: tied.parameter.shape for name, tied in self.aliases.items()}

    @cached_property
    def element_sizes(self) -> dict[str, int]:
        """Each name's bytes per element."""
        return {name: tied.parameter.element_size() for name, tied in self.aliases.items()}

    @cached_property
    def count(self) -> int:
        """Every parameter's elements, tied ones once."""
        unique = {id(tied.parameter): tied.parameter for tied in self.aliases.values()}
        return sum(parameter.numel() for parameter in unique.values())


# -- holders of a parameter, without a model (the functional API) ------------------------------


def _references_beyond(module: nn.Module, key: str, slots: int) -> int:
    """How many references to ``module._parameters[key]`` exist besides ``slots`` dict slots.

    Calibrated below on a parameter held by exactly one dict slot, so the count is exact for
    this very function whatever the Python version; it is the cheap test that lets the scan
    of :func:`_module_holders` run only when something else holds the parameter.
    """
    param = module._parameters[key]
    held = changes.held_references(param)  # an open transaction's snapshots
    return sys.getrefcount(param) - slots - _OWN_REFERENCES - held


_OWN_REFERENCES = 0
_calibration = nn.Module()
_calibration.register_parameter("w", nn.Parameter(torch.empty(0)))
_OWN_REFERENCES = _references_beyond(_calibration, "w", 1)
del _calibration


def _module_holders(parameters: Sequence[object]) -> dict[int, list[Pair]]:
    """Every ``(module, key)`` of a live module whose ``_parameters[key]`` is one of
    ``parameters``, by ``id`` of the parameter: one pass over the objects the garbage collector
    tracks, whatever the number of parameters (the filter by class runs in C).
    """
    wanted = {id(param) for param in parameters}
    classes = _subclasses(nn.Module)
    objects = gc.get_objects()
    found: dict[int, list[Pair]] = {}
    for module in itertools.compress(objects, map(classes.__contains__, map(type, objects))):
        for key, value in module._parameters.items():
            if id(value) in wanted:
                found.setdefault(id(value), []).append((module, key))
    return found


def _subclasses(cls: type) -> set[type]:
    found: set[type] = {cls}
    todo: list[type] = [cls]
    while todo:
        sub: type
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def unmasked_holders(groups: Sequence[Sequence[Pair]]) -> list[tuple[Pair, list[Pair]]]:
    """For parameters about to be pruned for the first time, the holders left unmasked.

    Call it before the reparametrization is installed, while the caller holds no reference to
    the parameters: each group lists the pairs of one parameter pruned in the call, every pair
    still holding it as ``module._parameters[name]``.

    Returns:
        ``(first pair, other holders)`` for each parameter that some module outside the call
        holds as a plain (not pruned) parameter.

    Example:
        >>> from torch import nn
        >>> first, second = nn.Linear(2, 2), nn.Linear(2, 2)
        >>> second.weight = first.weight
        >>> [(type(m).__name__, n) for m, n in unmasked_holders([[(first, "weight")]])[0][1]]
        [('Linear', 'weight')]
    """
    suspects = [
        pairs for pairs in groups if _references_beyond(pairs[0][0], pairs[0][1], len(pairs)) > 0
    ]
    if not suspects:
        return []
    holders = _module_holders([pairs[0][0]._parameters[pairs[0][1]] for pairs in suspects])
    left: list[tuple[Pair, list[Pair]]] = []
    for pairs in suspects:
        module, name = pairs[0]
        pruned = {(id(m), n) for m, n in pairs}
        others = [
            (holder, key)
            for holder, key in holders.get(id(module._parameters[name]), [])
            if (id(holder), key) not in pruned and tensor_name(holder, key) == key
        ]
        if others:
            left.append((pairs[0], others))
    return left


def warn_unmasked_holders(left: Sequence[tuple[Pair, Sequence[Pair]]]) -> None:
    """One warning per parameter that the call pruned in some holders but not in all.

    Example:
        >>> import warnings
        >>> from torch import nn
        >>> first, second = nn.Linear(2, 2), nn.Linear(2, 2)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_unmasked_holders([((first, "weight"), [(second, "weight")])])
        >>> "also held by (Linear, 'weight')" in str(caught[0].message)
        True
    """
    for (module, name), others in left:
        holders = ", ".join(f"({type(m).__name__}, {key!r})" for m, key in others)
        warnings.warn(
            f"Pruned ({type(module).__name__}, {name!r}), but its parameter is also held by "
            f"{holders}, which still computes with the unpruned values (tied weights). To mask "
            "every holder, pass all the (module, name) pairs of the parameter to "
            "global_unstructured in one call, or prune with Pruner, which finds tied weights "
            "itself.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
