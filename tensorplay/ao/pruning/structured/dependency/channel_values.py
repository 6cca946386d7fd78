"""What the channel analysis knows about one value of a traced forward, and one call in it.

A tensor is a :class:`Tracked`: for each dimension that holds channels (counted from the end,
so it holds for batched and unbatched inputs alike), the atom of every position along it; its
shape where example inputs gave one. A size read from a tensor (``x.shape[1]``,
``x.size(1)``) is a :class:`SizeRead`: harmless as a dynamic size of a ``view``, but a channel
count used as a number would change when channels are removed, so anything else that reads it
makes those channels unprunable. A rule (:mod:`.channel_ops`, :mod:`.channel_modules`) gets
one :class:`Call` and returns the value of its result.

Example:
    >>> from tensorplay.ao.pruning.structured.dependency.channel_atoms import ChannelAtoms
    >>> atoms = ChannelAtoms()
    >>> x = Tracked({-1: tuple(atoms.fresh(3))}, (2, 3))
    >>> x.ndim, x.negative(1), x.size(-1)
    (2, -1, 3)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import fx, nn

from tensorplay.ao.pruning.structured.dependency.channel_atoms import ChannelAtoms

__all__ = ["NEEDS_SHAPES", "Call", "Rule", "SizeRead", "Tracked", "values_in"]

NEEDS_SHAPES = "needs the shapes that example_inputs give"
"""How a reason ends where the analysis needed a shape and no example inputs gave one."""

Channels = Mapping[int, tuple[int, ...]]


@dataclass(frozen=True)
class Tracked:
    """A tensor value: the atom of every position along each dimension that holds channels.

    Args:
        channels: Negative dimension -> one atom per position along it; dimensions not listed
            hold no channel the analysis follows.
        shape: The tensor's shape, where example inputs gave one.

    Example:
        >>> Tracked({}, None).ndim is None
        True
    """

    channels: Channels
    shape: tuple[int, ...] | None

    @property
    def ndim(self) -> int | None:
        """The number of dimensions, if the shape is known."""
        return None if self.shape is None else len(self.shape)

    def negative(self, dim: int) -> int | None:
        """``dim`` counted from the end; ``None`` where that needs a shape nobody gave."""
        if dim < 0:
            return dim
        return None if self.ndim is None else dim - self.ndim

    def size(self, dim: int) -> int | None:
        """The size along ``dim`` (from either end), if known."""
        if self.shape is None:
            return None
        if dim in self.channels:
            return len(self.channels[dim])
        return self.shape[dim]

    def atoms(self) -> Iterator[int]:
        """Every atom the value holds."""
        for positions in self.channels.values():
            yield from positions


@dataclass(frozen=True)
class SizeRead:
    """A size (or sizes) read from a tensor: ``x.shape``, ``x.size(1)``, ``c * h * w``.

    Args:
        reads: The tensors read and, for each, the negative dimensions read.

    Example:
        >>> x = Tracked({}, (2, 3))
        >>> SizeRead(((x, (-1,)),)).reads[0][1]
        (-1,)
    """

    reads: tuple[tuple[Tracked, tuple[int, ...]], ...]

    def read_atoms(self) -> Iterator[int]:
        """The atoms of every channel dimension the sizes were read from."""
        for tensor, dims in self.reads:
            for dim in dims:
                yield from tensor.channels.get(dim, ())


def values_in(tree: Any) -> Iterator[Tracked | SizeRead]:
    """Every tensor or size value in a nested structure of call arguments."""
    if isinstance(tree, Tracked | SizeRead):
        yield tree
    elif isinstance(tree, list | tuple):
        for item in tree:
            yield from values_in(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from values_in(item)
    elif isinstance(tree, slice):
        yield from values_in((tree.start, tree.stop, tree.step))


@dataclass
class Call:
    """One call of a traced forward, as a rule sees it.

    Args:
        node: The graph node.
        args: Its positional arguments, graph values replaced by what the analysis knows.
        kwargs: Its keyword arguments, likewise.
        shape: Its result's shape, where example inputs gave one.
        atoms: The analysis' atoms.
        what: How a reason names the call (``"torch.cat"``, ``"module 'ln' (LayerNorm)"``).
        module: The module a ``call_module`` node calls, else ``None``.
        name_of: Canonical qualified name of a parameter of :attr:`module` by its own name.

    Example:
        >>> from torch import fx
        >>> graph = fx.Graph()
        >>> call = Call(graph.placeholder("x"), (), {}, None, ChannelAtoms(), "x")
        >>> call.result().channels
        {}
    """

    node: fx.Node
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    shape: tuple[int, ...] | None
    atoms: ChannelAtoms
    what: str
    module: nn.Module | None = None
    name_of: Callable[[str], str] = field(default=str)

    def argument(self, index: int, name: str, default: Any = None) -> Any:
        """The argument at position ``index`` or by keyword ``name``."""
        if len(self.args) > index:
            return self.args[index]
        return self.kwargs.get(name, default)

    def result(self, channels: Channels | None = None) -> Tracked:
        """The call's tensor result holding ``channels`` (none by default)."""
        return Tracked(dict(channels or {}), self.shape)

    def poison(self, atoms: Iterable[int], why: str) -> None:
        """Make ``atoms`` unprunable because of this call; ``why`` completes
        ``"they reach <call>, which ..."``."""
        self.atoms.poison(atoms, f"they reach {self.what}, which {why}")

    def opaque(self, why: str = "the channel analysis does not follow") -> Tracked:
        """Give up on the call: every channel reaching it is unprunable; its result holds
        none."""
        for value in values_in((self.args, self.kwargs)):
            atoms = value.atoms() if isinstance(value, Tracked) else value.read_atoms()
            self.poison(list(atoms), why)
        return self.result()


Rule = Callable[[Call], Any]
