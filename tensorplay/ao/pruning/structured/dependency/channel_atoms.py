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
    >>> [(len(c.spans), c.reason) for c in atoms.classes()]
    [(2, None), (2, "reaches the model's output")]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["AtomClass", "ChannelAtoms", "Role", "Span"]

Role = Literal["out", "in", "norm"]


class Span(NamedTuple):
    """Consecutive indices of one parameter that a channel occupies.

    Args:
        parameter: The parameter's canonical qualified name.
        dim: The dimension the indices lie along.
        start: The first index along ``dim``.
        width: How many consecutive indices.
        role: ``"out"``: a producer's output channel (a weight row, a bias entry);
            ``"in"``: a consumer's input channel (weight columns); ``"norm"``: a
            normalisation's per-channel entry.
        scored: Whether a unit's score reads it (Linear and Conv weights).

    Example:
        >>> Span("fc2.weight", 1, 8, 4, "in", True).start
        8
    """

    parameter: str
    dim: int
    start: int
    width: int
    role: Role
    scored: bool


@dataclass(frozen=True)
class AtomClass:
    """Atoms joined into one channel: the parameter indices it spans, and why it cannot be
    removed.

    Args:
        spans: The channel's indices, as runs of consecutive ones, in the order their
            parameters were first reached.
        reason: ``None`` if the channel can be removed, else the first reason it cannot.

    Example:
        >>> AtomClass((Span("fc.weight", 0, 0, 1, "out", True),), None).producers()
        ('fc.weight',)
    """

    spans: tuple[Span, ...]
    reason: str | None

    def producers(self) -> tuple[str, ...]:
        """The parameters whose output channels the class holds, each once."""
        return tuple(dict.fromkeys(s.parameter for s in self.spans if s.role == "out"))


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
        # Atoms come in ranges, one per (parameter, dim): the range of each atom (-1: virtual).
        self._range_of: list[int] = []
        self._ranges: list[tuple[str, int, int, Role, bool]] = []
        self._range_ids: dict[tuple[str, int], int] = {}
        self._poison: dict[int, str] = {}
        self._poisoned_parameters: dict[str, str] = {}

    def fresh(self, count: int) -> list[int]:
        """``count`` new virtual atoms (positions no parameter holds)."""
        return self._new(count, -1)

    def _new(self, count: int, range_id: int) -> list[int]:
        start = len(self._parent)
        self._parent.extend(range(start, start + count))
        self._range_of.extend([range_id] * count)
        return list(range(start, start + count))

    def entries(
        self, parameter: str, dim: int, count: int, *, role: Role, scored: bool
    ) -> list[int]:
        """The atoms of indices ``0 .. count - 1`` along ``dim`` of ``parameter``, made on
        first use: a module called twice reaches the same atoms."""
        range_id = self._range_ids.get((parameter, dim))
        if range_id is None:
            range_id = self._range_ids[parameter, dim] = len(self._ranges)
            self._ranges.append((parameter, dim, len(self._parent), role, scored))
            return self._new(count, range_id)
        start = self._ranges[range_id][2]
        return list(range(start, start + count))

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
        """The channels: every class that holds a parameter index, in creation order."""
        # Atoms of a range are consecutive, so visiting atoms in order lists each class's
        # indices of one range in order: runs are found by comparing with the last one.
        spans: dict[int, dict[int, list[list[int]]]] = {}
        reasons: dict[int, str] = {}
        find, range_of, poison = self.find, self._range_of, self._poison
        for atom in range(len(self._parent)):
            root = find(atom)
            if atom in poison:
                reasons.setdefault(root, poison[atom])
            range_id = range_of[atom]
            if range_id < 0:
                continue
            runs = spans.setdefault(root, {}).setdefault(range_id, [])
            if runs and runs[-1][1] == atom:
                runs[-1][1] = atom + 1
            else:
                runs.append([atom, atom + 1])
        found = []
        for root, by_range in spans.items():
            listed = tuple(
                self._span(range_id, begin, end)
                for range_id, runs in by_range.items()
                for begin, end in runs
            )
            found.append(AtomClass(listed, reasons.get(root) or self._parameter_reason(listed)))
        return found

    def _span(self, range_id: int, begin: int, end: int) -> Span:
        parameter, dim, first, role, scored = self._ranges[range_id]
        return Span(parameter, dim, begin - first, end - begin, role, scored)

    def _parameter_reason(self, spans: tuple[Span, ...]) -> str | None:
        for span in spans:
            if span.parameter in self._poisoned_parameters:
                return self._poisoned_parameters[span.parameter]
        return None
