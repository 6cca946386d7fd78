"""From channels (classes of joined atoms) to :class:`~.units.UnitGroup` objects.

Each removable channel is a set of parameter indices; along each parameter dimension they
form runs of consecutive indices (a conv filter's one row; the ``H * W`` columns a flattened
feature map gives a Linear). Channels with the same runs (same parameters, dimensions,
widths) whose runs follow each other make one group: unit ``u`` of the group is the ``u``-th
of them, exactly the layout :class:`~.units.Slice` describes. A group is named after the
module whose output channels it holds first in the model's order.

Example:
    >>> from tensorplay.ao.pruning.structured.dependency.channel_atoms import ChannelAtoms
    >>> atoms = ChannelAtoms()
    >>> rows = atoms.entries("fc1.weight", 0, 3, role="out", scored=True)
    >>> columns = atoms.entries("fc2.weight", 1, 6, role="in", scored=True)
    >>> for unit, row in enumerate(rows):
    ...     atoms.join(row, columns[2 * unit])
    ...     atoms.join(row, columns[2 * unit + 1])
    >>> [group] = unit_groups(atoms.classes(), {"fc1.weight": 0, "fc2.weight": 1})
    >>> group.size, group.slices[1]
    (3, Slice(parameter='fc2.weight', dim=1, offset=0, width=2, scored=True, expert=None))
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from tensorplay.ao.pruning.structured.dependency.channel_atoms import AtomClass
from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup

__all__ = ["unit_groups"]


def unit_groups(classes: Sequence[AtomClass], order: Mapping[str, int]) -> list[UnitGroup]:
    """The groups of the removable channels among ``classes`` (those with no reason against
    them that hold a producer's output channel); ``order``: each parameter's position in the
    model, which orders the slices and the groups."""
    chains: dict[tuple[object, ...], list[list[tuple[_Run, ...]]]] = {}
    units = sorted(
        (_runs(c, order) for c in classes if c.reason is None and c.producers()),
        key=lambda runs: [(run.order, run.dim, run.start) for run in runs],
    )
    for runs in units:
        layout = tuple((r.parameter, r.dim, r.width, r.scored) for r in runs)
        chain = chains.setdefault(layout, [])
        if chain and _follows(chain[-1][-1], runs):
            chain[-1].append(runs)
        else:
            chain.append([runs])
    members = sorted(
        (m for chain in chains.values() for m in chain), key=lambda m: _producer(m).order_key()
    )
    names = Counter(_module(_producer(m)) for m in members)
    return [_group(m, names[_module(_producer(m))] > 1) for m in members]


class _Run(NamedTuple):
    order: int
    parameter: str
    dim: int
    start: int
    width: int
    scored: bool
    produces: bool

    def order_key(self) -> tuple[int, int, int]:
        return self.order, self.dim, self.start


def _runs(channel: AtomClass, order: Mapping[str, int]) -> tuple[_Run, ...]:
    """The channel's spans in the model's order."""
    return tuple(
        sorted(
            _Run(
                order[s.parameter], s.parameter, s.dim, s.start, s.width, s.scored, s.role == "out"
            )
            for s in channel.spans
        )
    )


def _follows(previous: tuple[_Run, ...], runs: tuple[_Run, ...]) -> bool:
    return all(r.start == p.start + p.width for p, r in zip(previous, runs, strict=True))


def _producer(members: list[tuple[_Run, ...]]) -> _Run:
    """The first run of the group's first unit that holds output channels."""
    return next(run for run in members[0] if run.produces)


def _module(run: _Run) -> str:
    return run.parameter.rpartition(".")[0]


def _group(members: list[tuple[_Run, ...]], shared_name: bool) -> UnitGroup:
    """One group; named after its producer's module, with the range of that module's output
    channels it holds where another group holds others of them."""
    slices = tuple(Slice(r.parameter, r.dim, r.start, r.width, r.scored) for r in members[0])
    producer = _producer(members)
    name = _module(producer)
    if shared_name:
        name += f"[{producer.start}:{producer.start + len(members) * producer.width}]"
    return UnitGroup(name, "channel", len(members), slices)
