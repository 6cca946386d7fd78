"""What a family of Hugging Face models tells the dependency analysis about one residual block.

A family (Llama-style, Gemma 2, Phi-3, GPT-NeoX, GPT-2, BERT, mixtures of experts...) is
recognised by the names and types of a block's submodules, never by importing ``transformers``:
a model's blocks are the entries of an ``nn.ModuleList`` that all match one family. For each
block the family names its units
(:class:`BlockUnits`: the FFN channels and the attention heads as
:class:`~tensorplay.ao.pruning.structured.dependency.unit_groups.UnitGroup` objects), the tensors
that belong to no unit (the residual-stream norms, the output biases), and how to bring the
block's attributes and its model's config in line once units are gone. A tensor of the block
that the family does not know makes the block unanalysable: a clear error rather than a guess.

Example:
    >>> from torch import nn
    >>> block = nn.Module()
    >>> block.fc = nn.Linear(4, 3)
    >>> tensor_names("layers.0", block), is_linear(block.fc), out_in(block.fc)
    (['layers.0.fc.weight', 'layers.0.fc.bias'], True, (3, 4))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor, nn

from tensorplay.ao.pruning.parity.aliases import TiedParameter, parameter_groups
from tensorplay.ao.pruning.parity.reparametrization import parameter_of
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup

__all__ = [
    "BlockUnits",
    "Family",
    "Routing",
    "UnanalysableError",
    "child",
    "has_children",
    "int_attribute",
    "is_conv1d",
    "is_linear",
    "join",
    "laid_out",
    "out_in",
    "parameter_children",
    "set_present",
    "submodule",
    "read_tensor_names",
    "tensor_names",
    "weight_of",
]


class UnanalysableError(ValueError):
    """A model, block or submodule the dependency analysis cannot vouch for."""


@dataclass(frozen=True)
class Routing:
    """How a mixture-of-experts layer's router routes: ``logits = x @ weight.T``, a softmax
    over the experts, the ``top_k`` largest, renormalised over them where ``normalise``.

    Args:
        router: The router module's qualified name (its ``weight`` has one row per expert).
        top_k: Experts per token.
        normalise: Whether the top-k weights are divided by their sum.

    Example:
        >>> Routing("model.layers.0.mlp.gate", 2, True).top_k
        2
    """

    router: str
    top_k: int
    normalise: bool


@dataclass(frozen=True)
class BlockUnits:
    """The units of one residual block.

    Args:
        channel: The FFN intermediate neurons (``None``: the block has none, as a
            mixture-of-experts block without a shared expert).
        head: The attention heads (under grouped-query attention, the key/value groups with
            their query heads; ``None``: heads that cannot be removed one by one).
        shared: The block's tensors (names relative to the block) that belong to no unit and
            stay whole: norms over the residual stream, output biases, per-head norms shared by
            all heads.
        expert: The experts of a mixture-of-experts block (``None`` elsewhere).
        routing: How that block's router routes (with ``expert``).
        head_refusal: Why no head can be removed exactly though ``head`` lays them out (a norm
            spanning all heads), naming the submodule in the way; ``None`` where they can.
        expert_channels: The FFN channels of each routed expert of a mixture-of-experts block,
            one ``"channel"`` group per expert (its slices of the fused expert tensors), in
            expert order; empty elsewhere.

    Example:
        >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
        >>> fc = UnitGroup("mlp", "channel", 2, (Slice("mlp.fc.weight", 0),))
        >>> BlockUnits(fc, fc, ("norm.weight",)).shared
        ('norm.weight',)
    """

    channel: UnitGroup | None
    head: UnitGroup | None
    shared: tuple[str, ...]
    expert: UnitGroup | None = None
    routing: Routing | None = None
    head_refusal: str | None = None
    expert_channels: tuple[UnitGroup, ...] = ()

    def groups(self) -> tuple[UnitGroup, ...]:
        """The block's unit groups, those it has (channel, the experts' channels, head,
        expert).

        Example:
            >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
            >>> fc = UnitGroup("mlp", "channel", 2, (Slice("mlp.fc.weight", 0),))
            >>> [group.kind for group in BlockUnits(fc, None, ()).groups()]
            ['channel']
        """
        found = (self.channel, *self.expert_channels, self.head, self.expert)
        return tuple(group for group in found if group)


class Family(Protocol):
    """One family of Hugging Face blocks: how to recognise, describe and resize a block."""

    name: str
    """Short name in summaries and errors (``"llama"``)."""
    models: str
    """The architectures it covers, for messages (``"Llama, Mistral, Qwen2, Qwen3"``)."""
    submodules: tuple[str, ...]
    """The submodules (dotted paths) every block of the family has: what an unknown block is
    compared with to name what it lacks."""

    def matches(self, block: nn.Module) -> bool:
        """Whether ``block`` has the family's submodules (names and types)."""

    def units(self, prefix: str, block: nn.Module) -> BlockUnits:
        """The block's units, parameter names prefixed by ``prefix`` (the block's name).

        Raises:
            UnanalysableError: Shapes or attributes that do not fit the family.
        """

    def layer_refusal(self, block: nn.Module) -> str | None:
        """Why removing the whole block would change the model (``None``: it is an identity
        once its parameters are zero: a pre-norm residual block)."""

    def sync(self, block: nn.Module) -> None:
        """Set the block's attributes that mirror its widths (head counts) from its shapes."""

    def widths(self, block: nn.Module) -> dict[str, int]:
        """The block's widths under the family's config keys (``intermediate_size``...)."""

    def unit_counts(self, widths: Mapping[str, int]) -> dict[str, int]:
        """The units per kind (``"channel"``, ``"head"``) that ``widths`` means; under
        ``"expert_channel"``, those of each group of :attr:`BlockUnits.expert_channels`."""


def join(prefix: str, *names: str) -> str:
    """A qualified name: ``join("a", "b.c")`` is ``"a.b.c"``; an empty prefix adds nothing.

    Example:
        >>> join("model.layers.0", "mlp"), join("", "mlp")
        ('model.layers.0.mlp', 'mlp')
    """
    return ".".join(part for part in (prefix, *names) if part)


def child(module: nn.Module, path: str) -> nn.Module | None:
    """The submodule at dotted ``path``, or ``None``.

    Example:
        >>> child(nn.Sequential(nn.Sequential(nn.ReLU())), "0.0")
        ReLU()
    """
    found: nn.Module | None = module
    for part in path.split("."):
        found = found._modules.get(part) if found is not None else None
    return found


def submodule(block: nn.Module, path: str) -> nn.Module:
    """The submodule at dotted ``path`` that a family relies on.

    Raises:
        UnanalysableError: It is missing, naming the path.

    Example:
        >>> submodule(nn.Sequential(nn.ReLU()), "0")
        ReLU()
    """
    found = child(block, path)
    if found is None:
        raise UnanalysableError(
            f"Expected {type(block).__name__} to have the submodule {path!r}, but it has none."
        )
    return found


def has_children(module: nn.Module, paths: tuple[str, ...], kind: type | None = None) -> bool:
    """Whether every dotted path names a submodule (of type ``kind`` if given).

    Example:
        >>> has_children(nn.Sequential(nn.Linear(2, 2)), ("0",), nn.Linear)
        True
    """
    found = [child(module, path) for path in paths]
    return all(m is not None and (kind is None or isinstance(m, kind)) for m in found)


def is_linear(module: nn.Module | None) -> bool:
    """Whether ``module`` is an ``nn.Linear``.

    Example:
        >>> is_linear(nn.Linear(2, 2)), is_linear(nn.ReLU())
        (True, False)
    """
    return isinstance(module, nn.Linear)


def is_conv1d(module: nn.Module | None) -> bool:
    """Whether ``module`` is Hugging Face's ``Conv1D`` (a linear map whose weight is
    ``(in, out)``), recognised by class name and its ``nf``/``nx`` attributes.

    Example:
        >>> is_conv1d(nn.Conv1d(2, 2, 1))  # torch's convolution is another thing
        False
    """
    return (
        module is not None
        and type(module).__name__ == "Conv1D"
        and hasattr(module, "nf")
        and hasattr(module, "nx")
    )


def weight_of(module: nn.Module, name: str = "weight") -> Tensor | None:
    """The parameter behind ``module.<name>`` (its ``_orig`` when pruned), else ``None``.

    Example:
        >>> weight_of(nn.Linear(3, 2)).shape
        torch.Size([2, 3])
    """
    return parameter_of(module, name)


def out_in(module: nn.Module) -> tuple[int, int]:
    """``(out, in)`` features of a Linear or ``Conv1D`` from its weight's shape.

    Example:
        >>> out_in(nn.Linear(3, 2))
        (2, 3)
    """
    weight = weight_of(module)
    if weight is None or weight.dim() != 2:
        raise UnanalysableError(
            f"Expected a 2-D weight in {type(module).__name__}, but got "
            f"{None if weight is None else tuple(weight.shape)}."
        )
    rows, columns = weight.shape
    return (columns, rows) if is_conv1d(module) else (rows, columns)


def tensor_names(prefix: str, module: nn.Module) -> list[str]:
    """The qualified names of every parameter of ``module`` and its submodules (a pruned one
    under its own name), each once.

    Example:
        >>> tensor_names("fc", nn.Linear(2, 2))
        ['fc.weight', 'fc.bias']
    """
    held = {id(tied.parameter): tied for tied in parameter_groups(module)}
    return read_tensor_names(prefix, module, held)


def read_tensor_names(
    prefix: str, module: nn.Module, held: Mapping[int, TiedParameter]
) -> list[str]:
    """:func:`tensor_names` of ``module``, whose parameters were read into ``held`` (a
    :class:`~tensorplay.ao.pruning.parity.aliases.ParameterTable`'s, by ``id``): a pruned one's
    own name is the one it was read under, ``w`` for ``w_orig`` where its module holds it as
    ``w``.

    Example:
        >>> from tensorplay.ao.pruning.parity.aliases import ParameterTable
        >>> from tensorplay.ao.pruning.parity.methods import identity
        >>> layer = identity(nn.Linear(2, 2), "weight")
        >>> held = {id(t.parameter): t for t in ParameterTable.of(layer).aliases.values()}
        >>> read_tensor_names("fc", layer, held)
        ['fc.bias', 'fc.weight']
    """
    names: dict[str, None] = {}
    for module_name, sub in module.named_modules():
        for key, param in sub._parameters.items():
            if param is None:
                continue
            base = key.removesuffix("_orig")
            pairs = held[id(param)].pairs
            own = base if base != key and not any(m is sub and n == key for m, n in pairs) else key
            names[join(prefix, module_name, own)] = None
    return list(names)


def int_attribute(module: nn.Module, name: str, where: str) -> int:
    """``module.<name>``, a positive int a family reads (``head_dim``, ``split_size``).

    Raises:
        UnanalysableError: It is missing or not a positive int, naming ``where`` (the module's
            qualified name).

    Example:
        >>> layer = nn.Linear(2, 2)
        >>> int_attribute(layer, "in_features", "fc")
        2
    """
    value = getattr(module, name, None)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UnanalysableError(
            f"Expected {where!r} ({type(module).__name__}) to have a positive int `{name}`, but "
            f"got {value!r}."
        )
    return value


def set_present(module: nn.Module, values: Mapping[str, int]) -> None:
    """Set those of ``values`` that ``module`` has as attributes; the others are left out
    (a family's modules differ in which head counts they keep).

    Example:
        >>> layer = nn.Linear(2, 2)
        >>> set_present(layer, {"in_features": 3, "num_heads": 1})
        >>> layer.in_features, hasattr(layer, "num_heads")
        (3, False)
    """
    for name, value in values.items():
        if hasattr(module, name):
            setattr(module, name, value)


def parameter_children(module: nn.Module) -> set[str]:
    """The names of ``module``'s direct children that hold parameters (dropouts and
    activations are left out): what a family's layout is compared with.

    Example:
        >>> sorted(parameter_children(nn.Sequential(nn.Linear(2, 2), nn.ReLU())))
        ['0']
    """
    return {
        name for name, sub in module.named_children() if next(sub.parameters(), None) is not None
    }


def laid_out(block: nn.Module, linears: tuple[str, ...], children: tuple[str, ...]) -> bool:
    """Whether ``block`` has an ``nn.Linear`` at each of the dotted paths ``linears`` and, as
    children holding parameters, exactly ``children``: a family's layout, which no block of
    another family with more norms or other parts also fits.

    Example:
        >>> block = nn.Module()
        >>> block.mlp = nn.Sequential(nn.Linear(2, 2))
        >>> laid_out(block, ("mlp.0",), ("mlp",)), laid_out(block, ("mlp.0",), ("mlp", "norm"))
        (True, False)
    """
    return has_children(block, linears, nn.Linear) and parameter_children(block) == set(children)
