"""Channel atoms: which index of which parameter must go when one channel goes.

The channel analysis (:mod:`.tracing`) gives every index a channel can occupy an *atom*: an
output row of a Linear or Conv weight, an entry of a bias or a BatchNorm weight, an input
column of a consumer, or a *virtual* atom for a position no parameter holds (a position of the
model's input). Whatever must be removed together is *joined* (union-find): a producer's row
with its bias entry, its BatchNorm entries and its consumers' columns; the two operands of a
residual addition position by position. An atom the analysis cannot follow (it reaches the
model's output, a LayerNorm over the channels, an operation it does not know) is *poisoned*
with the reason, and so is every atom joined with it: such channels are never removed.

Example:
    >>> atoms = ChannelAtoms()
    >>> rows = atoms.entries("fc1.weight", 0, 2, role="out", scored=True)
    >>> columns = atoms.entries("fc2.weight", 1, 2, role="in", scored=True)
    >>> for row, column in zip(rows, columns):
    ...     atoms.join(row, column)
    >>> atoms.poison([columns[1]], "reaches the model's output")
    >>> [(len(c.entries), c.reason) for c in atoms.classes()]
    [(2, None), (2, "reaches the model's output")]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["AtomClass", "ChannelAtoms", "Entry", "Role"]

Role = Literal["out", "in", "norm"]


class Entry(NamedTuple):
    """One index of one parameter that a channel occupies.

    Args:
        parameter: The parameter's canonical qualified name.
        dim: The dimension the index lies along.
        position: The index along ``dim``.
        role: ``"out"``: a producer's output channel (a weight row, a bias entry);
            ``"in"``: a consumer's input channel (a weight column); ``"norm"``: a
            normalisation's per-channel entry.
        scored: Whether a unit's score reads it (Linear and Conv weights).

    Example:
        >>> Entry("fc.weight", 0, 3, "out", True).position
        3
    """

    parameter: str
    dim: int
    position: int
    role: Role
    scored: bool


@dataclass(frozen=True)
class AtomClass:
    """Atoms joined into one channel: its parameter entries, and why it cannot be removed.

    Args:
        entries: The parameter entries of the channel, in the order they were first seen.
        reason: ``None`` if the channel can be removed, else the first reason it cannot.

    Example:
        >>> AtomClass((Entry("fc.weight", 0, 0, "out", True),), None).producers()
        ('fc.weight',)
    """

    entries: tuple[Entry, ...]
    reason: str | None

    def producers(self) -> tuple[str, ...]:
        """The parameters whose output channels the class holds, each once."""
        return tuple(dict.fromkeys(e.parameter for e in self.entries if e.role == "out"))


class ChannelAtoms:
    """A union-find over channel atoms, with the reasons some cannot be removed.

    Example:
        >>> atoms = ChannelAtoms()
        >>> first, second = atoms.fresh(2)
        >>> atoms.join(first, second)
        >>> atoms.same(first, second)
        True
    """

    def __init__(self) -> None:
        self._parent: list[int] = []
        self._entry: list[Entry | None] = []
        self._ids: dict[tuple[str, int, int], int] = {}
        self._poison: dict[int, str] = {}
        self._poisoned_parameters: dict[str, str] = {}

    def fresh(self, count: int) -> list[int]:
        """``count`` new virtual atoms (positions no parameter holds)."""
        start = len(self._parent)
        self._parent.extend(range(start, start + count))
        self._entry.extend([None] * count)
        return list(range(start, start + count))

    def entries(
        self, parameter: str, dim: int, count: int, *, role: Role, scored: bool
    ) -> list[int]:
        """The atoms of indices ``0 .. count - 1`` along ``dim`` of ``parameter``, made on
        first use: a module called twice reaches the same atoms."""
        atoms = []
        for index in range(count):
            key = (parameter, dim, index)
            atom = self._ids.get(key)
            if atom is None:
                atom = len(self._parent)
                self._parent.append(atom)
                self._entry.append(Entry(parameter, dim, index, role, scored))
                self._ids[key] = atom
            atoms.append(atom)
        return atoms

    def find(self, atom: int) -> int:
        """The representative of ``atom``'s class."""
        root = atom
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[atom] != root:
            self._parent[atom], atom = root, self._parent[atom]
        return root

    def join(self, first: int, second: int) -> None:
        """Make two atoms one channel: removed together or not at all."""
        a, b = self.find(first), self.find(second)
        if a != b:
            # The older atom stays the root, so classes list their entries in creation order.
            self._parent[max(a, b)] = min(a, b)

    def same(self, first: int, second: int) -> bool:
        """Whether two atoms are one channel."""
        return self.find(first) == self.find(second)

    def poison(self, atoms: Iterable[int], reason: str) -> None:
        """Mark atoms (and so every atom joined with them) as never removable."""
        for atom in atoms:
            self._poison.setdefault(atom, reason)

    def poison_parameter(self, parameter: str, reason: str) -> None:
        """Mark every entry of ``parameter`` as never removable (it is used in a way the
        analysis does not follow)."""
        self._poisoned_parameters.setdefault(parameter, reason)

    def classes(self) -> list[AtomClass]:
        """The channels: every class that holds a parameter entry, in creation order."""
        members: dict[int, list[int]] = {}
        for atom in range(len(self._parent)):
            members.setdefault(self.find(atom), []).append(atom)
        found = []
        for atoms in members.values():
            entries = tuple(e for e in (self._entry[a] for a in atoms) if e is not None)
            if entries:
                found.append(AtomClass(entries, self._reason(atoms, entries)))
        return found

    def _reason(self, atoms: list[int], entries: tuple[Entry, ...]) -> str | None:
        for atom in atoms:
            if atom in self._poison:
                return self._poison[atom]
        for entry in entries:
            if entry.parameter in self._poisoned_parameters:
                return self._poisoned_parameters[entry.parameter]
        return None
