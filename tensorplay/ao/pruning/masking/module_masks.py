"""What each module of a model holds under pruning, read once: its masked tensors in both modes.

Code that copies or takes apart a model under pruning (a dense teacher, a sharded copy) asks the
same questions of every module: which of its tensors are reparametrized (``<name>_orig``,
``<name>_mask`` and a forward pre-hook), which carry a lean bool ``<name>_mask``, and in which
order the unpruned module had its parameters. :func:`read_masks` answers them for every module in
one pass, so that code reads the answers instead of asking the module again.

Example:
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.methods import identity
    >>> model = nn.Sequential(identity(nn.Linear(2, 2), "weight"), nn.ReLU())
    >>> masks = read_masks(model)
    >>> held = masks[id(model[0])]
    >>> list(held.reparametrized), held.lean, held.order, held.hidden_keys
    (['weight'], {}, ('weight', 'bias'), frozenset({'weight_mask'}))
    >>> masks[id(model[1])].is_masked
    False
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from tensorplay.ao.pruning.masking.lean_masks import MASK_SUFFIX, lean_mask
from tensorplay.ao.pruning.masking.permanent import dense_order
from tensorplay.ao.pruning.parity.reparametrization import PrunedParts, pruned_parts
from tensorplay.ao.pruning.parity.reparametrization import pruned_tensor_names as hooked_names

__all__ = ["ModuleMasks", "read_masks"]


@dataclass(frozen=True)
class ModuleMasks:
    """The masked tensors of one module (its own, not its children's).

    Args:
        reparametrized: Each reparametrized tensor's name and its parts, in hook order.
        lean: Each lean-masked tensor's name and its bool mask.
        order: The module's parameter names as the unpruned module orders them (a
            reparametrized ``<name>_orig`` listed as ``<name>``).

    Example:
        >>> ModuleMasks({}, {}, ("weight", "bias")).is_masked
        False
    """

    reparametrized: dict[str, PrunedParts]
    lean: dict[str, Tensor]
    order: tuple[str, ...]

    @property
    def is_masked(self) -> bool:
        """Whether the module holds a mask in either mode."""
        return bool(self.reparametrized or self.lean)

    @property
    def hidden_keys(self) -> frozenset[str]:
        """The keys a dense copy leaves out: every ``<name>_mask`` buffer (the ``_orig``
        parameters are in :attr:`reparametrized_origs`)."""
        return frozenset(name + MASK_SUFFIX for name in [*self.reparametrized, *self.lean])

    @property
    def lean_keys(self) -> frozenset[str]:
        """The ``<name>_mask`` buffer keys of the lean-masked tensors."""
        return frozenset(name + MASK_SUFFIX for name in self.lean)

    @property
    def reparametrized_origs(self) -> frozenset[str]:
        """The ``<name>_orig`` parameter keys of the reparametrized tensors."""
        return frozenset(name + "_orig" for name in self.reparametrized)


def read_masks(model: nn.Module) -> dict[int, ModuleMasks]:
    """Every module of ``model`` (by ``id``) and the masks it holds.

    Raises:
        ValueError: A tensor with a pruning hook but no ``<name>_orig`` or ``<name>_mask``
            (a module edited by hand), naming the pair.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> read_masks(layer)[id(layer)].order
        ('weight', 'bias')
    """
    return {id(module): _module_masks(module) for module in model.modules()}


def _module_masks(module: nn.Module) -> ModuleMasks:
    reparametrized = {
        name: parts
        for name in hooked_names(module)
        if (parts := pruned_parts(module, name)) is not None
    }
    lean = {
        name: mask for name in module._parameters if (mask := lean_mask(module, name)) is not None
    }
    return ModuleMasks(reparametrized, lean, tuple(dense_order(module, list(reparametrized))))
