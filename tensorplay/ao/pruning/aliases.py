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

from dataclasses import dataclass

from torch import nn

__all__ = ["TiedParameter", "alias_map", "parameter_groups", "tensor_name"]

Pair = tuple[nn.Module, str]


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
        >>> from tensorplay.ao.pruning.methods import identity
        >>> module = identity(nn.Linear(2, 2), "weight")
        >>> tensor_name(module, "weight_orig"), tensor_name(module, "bias")
        ('weight', 'bias')
    """
    if param_name.endswith("_orig"):
        base = param_name[: -len("_orig")]
        if base + "_mask" in module._buffers:
            return base
    return param_name


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
