"""How channels pass through elementwise operations of a traced forward.

The masked model zeroes a channel where it is produced and where it is consumed, so what a
masked channel carries in between does not matter as long as it stays in its own position:
an elementwise operation of one tensor (an activation, dropout, a cast) passes its channels
on. An elementwise operation of several tensors (``+``, ``*``, ``torch.where``) *joins* their
channels position by position: a residual addition is pruned together or not at all, and an
operand that holds no channels there (the model's input, a parameter used directly) keeps
them all. Division by a channel is refused: a removed (zero) channel would turn into
infinities that a zeroed weight cannot cancel.

Example:
    >>> from tensorplay.ao.pruning.structured.dependency.channel_atoms import ChannelAtoms
    >>> from torch import fx
    >>> atoms = ChannelAtoms()
    >>> a = Tracked({-1: tuple(atoms.fresh(2))}, (3, 2))
    >>> b = Tracked({-1: tuple(atoms.fresh(2))}, (3, 2))
    >>> call = Call(fx.Graph().placeholder("x"), (a, b), {}, (3, 2), atoms, "operator.add")
    >>> _ = join(call)
    >>> atoms.same(a.channels[-1][0], b.channels[-1][0])
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensorplay.ao.pruning.structured.dependency.channel_values import (
    NEEDS_SHAPES,
    Call,
    SizeRead,
    Tracked,
)

__all__ = [
    "divide",
    "join",
    "joined",
    "keep_channels",
    "other_values",
    "size_arithmetic",
    "where",
]


def keep_channels(call: Call) -> Any:
    """An elementwise operation of one tensor (an activation, dropout, a dtype cast): the
    result holds the tensor's channels; any other tensor argument is not followed."""
    x = call.argument(0, "input")
    if not isinstance(x, Tracked) or other_values(call, x):
        return call.opaque()
    return call.result(x.channels)


def other_values(call: Call, first: object) -> bool:
    """Whether a tensor or size other than ``first`` is among the call's arguments."""
    rest = [value for value in call.args[1:]] + list(call.kwargs.values())
    return any(isinstance(value, Tracked | SizeRead) for value in rest if value is not first)


def join(call: Call) -> Any:
    """An elementwise operation of two operands (``+``, ``-``, ``*``, maximum): tensors of the
    same channels are joined position by position; sizes combine into a size."""
    operands = [call.argument(0, "input"), call.argument(1, "other")]
    tensors = [value for value in operands if isinstance(value, Tracked)]
    sizes = [value for value in operands if isinstance(value, SizeRead)]
    if not tensors:
        return SizeRead(tuple(read for size in sizes for read in size.reads)) if sizes else None
    for size in sizes:
        call.poison(list(size.read_atoms()), "uses their number as a value")
    return joined(call, tensors)


def joined(call: Call, tensors: Sequence[Tracked]) -> Tracked:
    """The result of an elementwise operation on broadcast ``tensors``: per dimension, the
    operands that hold channels there are joined; an operand of the full size that holds none
    (the model's input, a buffer, an unfollowed result) makes them unprunable."""
    dims = dict.fromkeys(dim for tensor in tensors for dim in tensor.channels)
    channels: dict[int, tuple[int, ...]] = {}
    for dim in dims:
        full = _full_size(call, tensors, dim)
        held: list[tuple[int, ...]] = []
        blocked: str | None = None
        for tensor in tensors:
            positions = tensor.channels.get(dim)
            if positions is not None and len(positions) == full:
                held.append(positions)
            elif positions is not None:
                call.poison(positions, "broadcasts each of them over several channels")
            else:
                blocked = blocked or _blocks(tensor, dim)
        if blocked is not None:
            call.poison([atom for positions in held for atom in positions], blocked)
            continue
        for positions in held[1:]:
            for first, other in zip(held[0], positions, strict=True):
                call.atoms.join(first, other)
        if held:
            channels[dim] = held[0]
    return call.result(channels)


def _full_size(call: Call, tensors: Sequence[Tracked], dim: int) -> int:
    if call.shape is not None and -dim <= len(call.shape):
        return call.shape[dim]
    return max(len(t.channels[dim]) for t in tensors if dim in t.channels)


def _blocks(tensor: Tracked, dim: int) -> str | None:
    """Why ``tensor``, holding no channels along ``dim``, keeps the other operands' channels
    there from being removed (``None``: it broadcasts along ``dim``)."""
    if tensor.ndim is None:
        return f"combines them with a tensor of unknown shape ({NEEDS_SHAPES})"
    if -dim > tensor.ndim or (tensor.shape is not None and tensor.shape[dim] == 1):
        return None
    return (
        "combines them with values that cannot be removed (the model's input, a parameter "
        "or buffer used directly, or a result the analysis does not follow)"
    )


def where(call: Call) -> Any:
    """``torch.where(condition, a, b)``: the three operands' channels meet position by
    position."""
    operands = [call.argument(0, "condition"), call.argument(1, "input"), call.argument(2, "other")]
    if any(isinstance(value, SizeRead) for value in operands):
        return call.opaque()
    return joined(call, [value for value in operands if isinstance(value, Tracked)])


def divide(call: Call) -> Any:
    """``a / b``: joined like ``a * b``, and ``b``'s channels left out."""
    divisor = call.argument(1, "other")
    if isinstance(divisor, Tracked):
        call.poison(list(divisor.atoms()), "divides by them (a removed channel divides by zero)")
    return join(call)


def size_arithmetic(call: Call) -> Any:
    """Integer arithmetic on sizes (``c // 2``) stays a size; on tensors it is not followed."""
    if any(isinstance(value, Tracked) for value in call.args):
        return call.opaque()
    reads = tuple(read for v in call.args if isinstance(v, SizeRead) for read in v.reads)
    return SizeRead(reads) if reads else None
