"""A pruner's target: one parameter, with every ``(module, name)`` reaching it.

A parameter reached under several names (tied weights: an embedding and the LM head, a layer
shared between blocks) is one :class:`Target`: it is counted once, ranked once and gets one
mask that every holder shares. The pruner's targets are resolved from a model and its
configuration by :func:`~tensorplay.ao.pruning.pruner.selected_targets.resolve_targets`; everything
the pruner delegates to (masking modes, importance scores, scopes) takes them as they are, so this
module depends on nothing of the pruner's.

Example:
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    >>> model[1].weight = model[0].weight  # tied
    >>> target = Target(("0.weight", "1.weight"), ((model[0], "weight"), (model[1], "weight")))
    >>> target.name, target.parameter() is model[1].weight
    ('0.weight', True)
"""

from __future__ import annotations

from typing import NamedTuple

from torch import nn

from tensorplay.ao.pruning.pair import Pair
from tensorplay.ao.pruning.parity.reparametrization import parameter_of

__all__ = ["Target"]


class Target(NamedTuple):
    """Every name and ``(module, name)`` pair of one target's parameter (one of each unless
    tied). It holds no reference to the parameter itself: the functional API's test for other
    holders (the parameter's reference count) then needs no scan when the pruner prunes.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> target = Target(("weight",), ((layer, "weight"),))
        >>> target.name, target.label, target.parameter() is layer.weight
        ('weight', "(Linear, 'weight')", True)
    """

    names: tuple[str, ...]
    pairs: tuple[Pair, ...]

    @property
    def name(self) -> str:
        """The target's canonical name: its first in module order."""
        return self.names[0]

    @property
    def pair(self) -> Pair:
        """The ``(module, name)`` pair of :attr:`name`."""
        return self.pairs[0]

    @property
    def label(self) -> str:
        """``(ModuleClass, 'name')`` of :attr:`pair`, as errors name a tensor."""
        module, name = self.pairs[0]
        return f"({type(module).__name__}, {name!r})"

    def parameter(self) -> nn.Parameter:
        """The parameter (``<name>_orig`` while reparametrized), read now.

        Raises:
            ValueError: The module no longer holds it (changed after the pruner was made).
        """
        module, name = self.pairs[0]
        param = parameter_of(module, name)
        if param is None:
            raise ValueError(
                f"Expected ({type(module).__name__}, {name!r}) to be a parameter or a pruned "
                "tensor, but it is neither; was the module changed after the pruner was made?"
            )
        return param
