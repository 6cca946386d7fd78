"""How channels move through reshapes, permutations, concatenation and chunks.

A reshape is read from the shapes the example inputs give: a channel dimension kept whole
keeps its channels; merged channel-major with the dimensions after it (a feature map
flattened into a Linear's inputs) each channel spans the width of what it merged with; split
back into uniform blocks it is whole again. A reshape that splits the channels or merges them
with the dimensions before them, or that writes their number in the code, leaves them out.
Concatenation places each operand's channels at its offset; a chunk of the channels pairs
position ``i`` of every chunk, so the chunks stay equal.

Example:
    >>> from tensorplay.ao.pruning.structured.dependency.channel_atoms import ChannelAtoms
    >>> from torch import fx
    >>> atoms = ChannelAtoms()
    >>> x = Tracked({-3: tuple(atoms.fresh(2))}, (1, 2, 2, 2))
    >>> call = Call(fx.Graph().placeholder("x"), (x,), {}, (1, 8), atoms, "torch.flatten")
    >>> reshaped(call, x).channels[-1] == tuple(a for a in x.channels[-3] for _ in range(4))
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tensorplay.ao.pruning.structured.dependency.channel_elementwise import joined
from tensorplay.ao.pruning.structured.dependency.channel_values import NEEDS_SHAPES, Call, Tracked

__all__ = [
    "cat",
    "chunk",
    "expand",
    "expand_as",
    "permute",
    "reshape_without_sizes",
    "reshaped",
    "transpose",
    "unflatten",
    "view",
]


def reshaped(call: Call, x: Tracked, sizes: Sequence[Any] | None = None) -> Tracked:
    """The result of a reshape of ``x`` (``view``, ``reshape``, ``flatten``, ``squeeze``):
    a channel dimension kept whole keeps its channels; merged channel-major with the
    dimensions after it (a feature map flattened into a Linear's inputs), each channel spans
    the width of what it merged with. ``sizes``: the output sizes as written in the code; a
    channel dimension whose size is a number written there is refused (the code would not
    run once channels are removed)."""
    if not x.channels:
        return call.result()
    if x.shape is None or call.shape is None:
        call.poison(list(x.atoms()), f"reshapes them ({NEEDS_SHAPES})")
        return call.result()
    channels: dict[int, tuple[int, ...]] = {}
    for dim, positions in x.channels.items():
        placed = _place(call, x.shape, call.shape, len(x.shape) + dim, positions)
        if placed is None:
            call.poison(positions, "splits them or merges them with the dimensions before them")
            continue
        out_dim, moved = placed
        written = sizes[out_dim] if sizes is not None and len(sizes) == len(call.shape) else None
        if isinstance(written, int) and written != -1:
            call.poison(positions, f"fixes their number in the code ({written})")
            continue
        channels[out_dim - len(call.shape)] = moved
    return call.result(channels)


def _place(
    call: Call,
    before: tuple[int, ...],
    after: tuple[int, ...],
    dim: int,
    positions: tuple[int, ...],
) -> tuple[int, tuple[int, ...]] | None:
    """Where the positions along ``dim`` of a row-major reshape from ``before`` to ``after``
    land: a dimension of ``after`` with as many elements before it, holding them whole,
    each repeated (merged with the dimensions after), or in uniform blocks (split back)."""
    prefix, length = math.prod(before[:dim]), before[dim]
    candidates = [e for e in range(len(after)) if math.prod(after[:e]) == prefix]
    for e in candidates:
        if after[e] == length:
            return e, positions
    for e in candidates:
        if after[e] > length and length and after[e] % length == 0:
            width = after[e] // length
            return e, tuple(atom for atom in positions for _ in range(width))
    for e in candidates:
        if 0 < after[e] < length and length % after[e] == 0:
            block = length // after[e]
            heads = positions[::block]
            if all(call.atoms.same(heads[i // block], atom) for i, atom in enumerate(positions)):
                return e, heads
    return None


def view(call: Call) -> Any:
    """``x.view(*sizes)``, ``x.reshape(sizes)``, ``torch.reshape(x, sizes)``."""
    x = call.args[0]
    if not isinstance(x, Tracked):
        return call.opaque()
    sizes: Any = call.args[1:] if len(call.args) > 1 else call.kwargs.get("shape", ())
    if len(sizes) == 1 and isinstance(sizes[0], tuple | list):
        sizes = sizes[0]
    return reshaped(call, x, tuple(sizes))


def reshape_without_sizes(call: Call) -> Any:
    """``flatten``, ``squeeze``, ``unsqueeze``: reshapes with no sizes written in the code."""
    x = call.argument(0, "input")
    if not isinstance(x, Tracked):
        return call.opaque()
    return reshaped(call, x)


def unflatten(call: Call) -> Any:
    """``unflatten(dim, sizes)``: the sizes are written in the code, so channels along ``dim``
    are left out."""
    x, dim = call.argument(0, "input"), call.argument(1, "dim")
    if not isinstance(x, Tracked) or not isinstance(dim, int):
        return call.opaque()
    negative = x.negative(dim)
    if negative is None or negative in x.channels:
        return call.opaque("splits them into sizes written in the code")
    return reshaped(call, x)


def permute(call: Call) -> Any:
    """``x.permute(*dims)``: the channels move with their dimension."""
    x = call.args[0]
    dims: Any = call.args[1:] if len(call.args) > 1 else call.kwargs.get("dims", ())
    if len(dims) == 1 and isinstance(dims[0], tuple | list):
        dims = dims[0]
    if not isinstance(x, Tracked) or not all(isinstance(d, int) for d in dims):
        return call.opaque()
    ndim = len(dims)
    order = [d % ndim for d in dims]
    return call.result({order.index(ndim + d) - ndim: p for d, p in x.channels.items()})


def transpose(call: Call) -> Any:
    """``x.transpose(a, b)``: the channels move with their dimension."""
    x, first, second = call.args[0], call.argument(1, "dim0"), call.argument(2, "dim1")
    if not isinstance(x, Tracked) or not isinstance(first, int) or not isinstance(second, int):
        return call.opaque()
    a, b = x.negative(first), x.negative(second)
    if a is None or b is None:
        if x.channels:
            call.poison(list(x.atoms()), f"moves them ({NEEDS_SHAPES})")
        return call.result()
    swap = {a: b, b: a}
    return call.result({swap.get(d, d): p for d, p in x.channels.items()})


def expand(call: Call) -> Any:
    """``x.expand(*sizes)``: channels whose size is written in the code are left out."""
    x = call.args[0]
    sizes: Any = call.args[1:]
    if len(sizes) == 1 and isinstance(sizes[0], tuple | list):
        sizes = sizes[0]
    if not isinstance(x, Tracked):
        return call.opaque()
    channels = {}
    for dim, positions in x.channels.items():
        written = sizes[dim] if -dim <= len(sizes) else -1
        if isinstance(written, int) and written != -1:
            call.poison(positions, f"fixes their number in the code ({written})")
        else:
            channels[dim] = positions
    return call.result(channels)


def expand_as(call: Call) -> Any:
    """``x.expand_as(y)``: the result has ``y``'s shape, so their channels meet."""
    x, other = call.args[0], call.args[1]
    if not isinstance(x, Tracked) or not isinstance(other, Tracked):
        return call.opaque()
    return joined(call, [x, other])


def cat(call: Call) -> Any:
    """``torch.cat(tensors, dim)``: along ``dim`` each tensor's channels at its offset; along
    another dimension, the tensors' channels meet position by position."""
    tensors, dim = call.argument(0, "tensors"), call.argument(1, "dim", 0)
    if not isinstance(tensors, tuple | list) or not all(isinstance(t, Tracked) for t in tensors):
        return call.opaque()
    if not isinstance(dim, int):
        return call.opaque()
    along_dim = dim if dim < 0 else (None if call.shape is None else dim - len(call.shape))
    if along_dim is None:
        for tensor in tensors:
            call.poison(list(tensor.atoms()), f"concatenates them ({NEEDS_SHAPES})")
        return call.result()
    channels = _concatenated(call, tensors, along_dim)
    others = dict.fromkeys(d for t in tensors for d in t.channels if d != along_dim)
    for other in others:
        channels.update(_joined_along(call, tensors, other))
    return call.result(channels)


def chunk(call: Call) -> Any:
    """``chunk(k, dim)``. Along channels, position ``i`` of every chunk is one unit (removed
    from each chunk alike, the chunks stay equal); along another dimension, each chunk holds
    the tensor's channels."""
    x, chunks, dim = call.args[0], call.argument(1, "chunks"), call.argument(2, "dim", 0)
    if not isinstance(x, Tracked) or not isinstance(chunks, int) or not isinstance(dim, int):
        return call.opaque()
    along_dim = x.negative(dim)
    if along_dim is None:
        return call.opaque(f"splits them into chunks ({NEEDS_SHAPES})")
    if along_dim not in x.channels:
        size = None if x.shape is None else x.shape[along_dim]
        step = None if size is None else -(-size // chunks)
        sizes = [None] * chunks if size is None or step is None else _steps(size, step)
        return tuple(_part(x, along_dim, dict(x.channels), part) for part in sizes)
    positions = x.channels[along_dim]
    if len(positions) % chunks:
        return call.opaque("splits them into chunks of different sizes")
    width = len(positions) // chunks
    parts = [positions[k * width : (k + 1) * width] for k in range(chunks)]
    for part in parts[1:]:
        for first, other in zip(parts[0], part, strict=True):
            call.atoms.join(first, other)
    return tuple(_part(x, along_dim, {**x.channels, along_dim: p}, width) for p in parts)


def _steps(size: int, step: int) -> list[int | None]:
    return [min(step, size - start) for start in range(0, size, step)]


def _part(x: Tracked, dim: int, channels: dict[int, tuple[int, ...]], size: int | None) -> Tracked:
    if x.shape is None or size is None:
        return Tracked(channels, None)
    shape = list(x.shape)
    shape[dim] = size
    return Tracked(channels, tuple(shape))


def _concatenated(call: Call, tensors: Sequence[Tracked], dim: int) -> dict[int, tuple[int, ...]]:
    if not any(dim in tensor.channels for tensor in tensors):
        return {}
    parts: list[int] = []
    for tensor in tensors:
        if dim in tensor.channels:
            parts.extend(tensor.channels[dim])
            continue
        size = tensor.size(dim)
        if size is None:
            for t in tensors:
                call.poison(t.channels.get(dim, ()), f"concatenates them ({NEEDS_SHAPES})")
            return {}
        # Positions no channel owns: whatever is joined with them later cannot be removed.
        others = call.atoms.fresh(size)
        call.poison(others, "concatenates them with values that cannot be removed")
        parts.extend(others)
    return {dim: tuple(parts)}


def _joined_along(call: Call, tensors: Sequence[Tracked], dim: int) -> dict[int, tuple[int, ...]]:
    """Concatenated along another dimension, the tensors' channels along ``dim`` meet
    position by position."""
    held = [t.channels.get(dim) for t in tensors]
    present = [positions for positions in held if positions is not None]
    if len(present) < len(held) or len({len(p) for p in present}) > 1:
        for positions in present:
            call.poison(positions, "concatenates them with values that cannot be removed")
        return {}
    for positions in present[1:]:
        for first, other in zip(present[0], positions, strict=True):
            call.atoms.join(first, other)
    return {dim: present[0]}
