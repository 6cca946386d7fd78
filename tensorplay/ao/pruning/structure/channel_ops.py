"""How channels pass through the functions and tensor methods of a traced forward.

One rule per kind of operation; :data:`FUNCTION_RULES` (by function) and :data:`METHOD_RULES`
(by tensor method name) say which rule an operation follows. An operation in neither table
makes every channel that reaches it unprunable (:meth:`Call.opaque`).

The rules rest on one observation: the masked model zeroes a channel where it is produced and
where it is consumed, so what a masked channel carries in between does not matter as long as
it stays in its own position. Operations that act on each position alone (activations,
dropout, pooling over space, reshapes that keep the channel dimension whole) pass the
channels on; operations that combine positions of the same tensor (a sum over the channels,
softmax over them, a reshape that splits them) make them unprunable; elementwise operations on
two tensors *join* their channels position by position, which is how residual additions are
pruned together or not at all. Division by a channel is refused: a removed (zero) channel
would turn into infinities that a zeroed weight cannot cancel.

Example:
    >>> import operator
    >>> FUNCTION_RULES[operator.add] is FUNCTION_RULES[operator.mul]
    True
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from tensorplay.ao.pruning.structure.channel_values import Call, Rule, SizeRead, Tracked

__all__ = [
    "ELEMENTWISE_FUNCTIONS",
    "ELEMENTWISE_METHODS",
    "FUNCTION_RULES",
    "METHOD_RULES",
    "keep_channels",
    "mixing",
    "reshaped",
    "spatial",
]

NEEDS_SHAPES = "needs the shapes that example_inputs give"


def keep_channels(call: Call) -> Any:
    """An elementwise operation of one tensor (an activation, dropout, a dtype cast): the
    result holds the tensor's channels; any other tensor argument is not followed."""
    x = call.argument(0, "input")
    if not isinstance(x, Tracked) or _other_values(call, x):
        return call.opaque()
    return call.result(x.channels)


def _other_values(call: Call, first: object) -> bool:
    rest = [value for value in call.args[1:]] + list(call.kwargs.values())
    return any(isinstance(value, Tracked | SizeRead) for value in rest if value is not first)


def _join(call: Call) -> Any:
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


def _where(call: Call) -> Any:
    """``torch.where(condition, a, b)``: the three operands' channels meet position by
    position."""
    operands = [call.argument(0, "condition"), call.argument(1, "input"), call.argument(2, "other")]
    if any(isinstance(value, SizeRead) for value in operands):
        return call.opaque()
    return joined(call, [value for value in operands if isinstance(value, Tracked)])


def _divide(call: Call) -> Any:
    divisor = call.argument(1, "other")
    if isinstance(divisor, Tracked):
        call.poison(list(divisor.atoms()), "divides by them (a removed channel divides by zero)")
    return _join(call)


def _size_arithmetic(call: Call) -> Any:
    """Integer arithmetic on sizes (``c // 2``) stays a size; on tensors it is not followed."""
    if any(isinstance(value, Tracked) for value in call.args):
        return call.opaque()
    reads = tuple(read for v in call.args if isinstance(v, SizeRead) for read in v.reads)
    return SizeRead(reads) if reads else None


# -- sizes and metadata ------------------------------------------------------------------------


def _metadata(call: Call) -> Any:
    """``x.dim()``, ``x.dtype``, ``x.device``: nothing that changes when channels go."""
    return None


def _size(call: Call) -> Any:
    """``x.size()`` or ``x.size(d)``."""
    x = call.args[0]
    dim = call.argument(1, "dim")
    if not isinstance(x, Tracked):
        return call.opaque()
    if dim is None:
        return _whole_shape(x)
    negative = x.negative(dim)
    return SizeRead(((x, tuple(x.channels) if negative is None else (negative,)),))


def _narrowed(size: SizeRead, index: Any) -> SizeRead:
    """``shape[index]`` of a whole shape read (when its dimensions are known)."""
    if len(size.reads) != 1 or not isinstance(index, int | slice):
        return size
    x, dims = size.reads[0]
    if x.ndim is None or dims != tuple(range(-x.ndim, 0)):
        return size
    picked = dims[index]
    return SizeRead(((x, picked if isinstance(picked, tuple) else (picked,)),))


def _whole_shape(x: Tracked) -> SizeRead:
    dims = tuple(x.channels) if x.ndim is None else tuple(range(-x.ndim, 0))
    return SizeRead(((x, dims),))


def _numel(call: Call) -> Any:
    x = call.args[0]
    return _whole_shape(x) if isinstance(x, Tracked) else call.opaque()


def _cast(call: Call) -> Any:
    """``x.to(...)``, ``x.type_as(y)``: ``y`` is read for its dtype only."""
    x = call.args[0]
    return call.result(x.channels) if isinstance(x, Tracked) else call.opaque()


def _getattr(call: Call) -> Any:
    x, name = call.args[0], call.args[1]
    if name == "shape" and isinstance(x, Tracked):
        return _whole_shape(x)
    if name in ("ndim", "dtype", "device", "is_cuda", "requires_grad", "layout"):
        return None
    return call.opaque()


def _getitem(call: Call) -> Any:
    """``shape[i]`` narrows a size read; indexing a tensor is not followed."""
    value, index = call.args[0], call.args[1]
    if isinstance(value, SizeRead):
        return _narrowed(value, index)
    if isinstance(value, tuple | list):
        return value[index]
    return call.opaque("indexes into them")


# -- reshapes ----------------------------------------------------------------------------------


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


def _view(call: Call) -> Any:
    x = call.args[0]
    if not isinstance(x, Tracked):
        return call.opaque()
    sizes: Any = call.args[1:] if len(call.args) > 1 else call.kwargs.get("shape", ())
    if len(sizes) == 1 and isinstance(sizes[0], tuple | list):
        sizes = sizes[0]
    return reshaped(call, x, tuple(sizes))


def _reshape_without_sizes(call: Call) -> Any:
    x = call.argument(0, "input")
    if not isinstance(x, Tracked):
        return call.opaque()
    return reshaped(call, x)


def _unflatten(call: Call) -> Any:
    x, dim = call.argument(0, "input"), call.argument(1, "dim")
    if not isinstance(x, Tracked) or not isinstance(dim, int):
        return call.opaque()
    negative = x.negative(dim)
    if negative is None or negative in x.channels:
        return call.opaque("splits them into sizes written in the code")
    return reshaped(call, x)


def _permute(call: Call) -> Any:
    x = call.args[0]
    dims: Any = call.args[1:] if len(call.args) > 1 else call.kwargs.get("dims", ())
    if len(dims) == 1 and isinstance(dims[0], tuple | list):
        dims = dims[0]
    if not isinstance(x, Tracked) or not all(isinstance(d, int) for d in dims):
        return call.opaque()
    ndim = len(dims)
    order = [d % ndim for d in dims]
    return call.result({order.index(ndim + d) - ndim: p for d, p in x.channels.items()})


def _transpose(call: Call) -> Any:
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


def _expand(call: Call) -> Any:
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


def _expand_as(call: Call) -> Any:
    x, other = call.args[0], call.args[1]
    if not isinstance(x, Tracked) or not isinstance(other, Tracked):
        return call.opaque()
    return joined(call, [x, other])


def _cat(call: Call) -> Any:
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


def _chunk(call: Call) -> Any:
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


# -- reductions, softmax, pooling --------------------------------------------------------------


def mixing(call: Call, x: Tracked, dims: Sequence[int], why: str, keepdim: bool = True) -> Any:
    """The result of an operation that combines the positions along the negative ``dims``
    of ``x``: channels there are unprunable, the others are kept (moved where reduced dims
    after them disappear, ``keepdim=False``)."""
    channels = {}
    for dim, positions in x.channels.items():
        if dim in dims:
            call.poison(positions, why)
        else:
            channels[dim + (0 if keepdim else sum(1 for d in dims if d > dim))] = positions
    return call.result(channels)


def _along(x: Tracked, dims: Sequence[int] | int | None) -> list[int] | None:
    """``dims`` of ``x`` counted from the end; ``None`` where one needs an unknown shape."""
    listed = [dims] if isinstance(dims, int) else list(dims or ())
    negative = [x.negative(dim) for dim in listed]
    return None if any(d is None for d in negative) else [d for d in negative if d is not None]


def _reduce(call: Call) -> Any:
    x, dims = call.argument(0, "input"), call.argument(1, "dim")
    keepdim = bool(call.argument(2, "keepdim", False))
    if not isinstance(x, Tracked) or dims is None or isinstance(dims, Tracked | SizeRead):
        return call.opaque("reduces over them")
    negative = _along(x, dims)
    if negative is None:
        return mixing(call, x, list(x.channels), f"reduces over some ({NEEDS_SHAPES})")
    return mixing(call, x, negative, "reduces over them", keepdim)


def _softmax(call: Call) -> Any:
    x, dim = call.argument(0, "input"), call.argument(1, "dim")
    if not isinstance(x, Tracked) or not isinstance(dim, int):
        return call.opaque("normalises across them")
    negative = _along(x, dim)
    if negative is None:
        return mixing(call, x, list(x.channels), f"normalises across some ({NEEDS_SHAPES})")
    return mixing(call, x, negative, "normalises across them")


def spatial(call: Call, x: Tracked, count: int | None) -> Any:
    """An operation per channel over the last ``count`` (spatial) dimensions (pooling,
    interpolation): channels before them are kept, positions along them are mixed."""
    if count is None:
        return mixing(call, x, list(x.channels), f"resamples over space ({NEEDS_SHAPES})")
    return mixing(call, x, list(range(-count, 0)), "mixes positions along them")


def _pooling(count: int, indices_at: int | None = None) -> Rule:
    """Pooling over ``count`` spatial dimensions; ``indices_at``: the position of its
    ``return_indices`` argument."""

    def rule(call: Call) -> Any:
        x = call.argument(0, "input")
        if not isinstance(x, Tracked) or _other_values(call, x):
            return call.opaque()
        if indices_at is not None and call.argument(indices_at, "return_indices", False):
            return call.opaque("returns indices of their positions")
        return spatial(call, x, count)

    return rule


def _interpolate(call: Call) -> Any:
    x = call.argument(0, "input")
    if not isinstance(x, Tracked) or _other_values(call, x):
        return call.opaque()
    return spatial(call, x, None if x.ndim is None else x.ndim - 2)


def _layer_norm(call: Call) -> Any:
    x, shape = call.argument(0, "input"), call.argument(1, "normalized_shape")
    if not isinstance(x, Tracked) or not isinstance(shape, tuple | list):
        return call.opaque("normalises across them")
    return mixing(call, x, list(range(-len(shape), 0)), "normalises across them")


# Elementwise operations of one tensor: the result has its shape and its channels.
ELEMENTWISE_FUNCTIONS = (
    torch.relu, torch.relu_, torch.sigmoid, torch.tanh, torch.exp, torch.abs, torch.neg,
    torch.square, torch.clamp, torch.clip, operator.neg, operator.pos,
    F.relu, F.relu_, F.relu6, F.gelu, F.silu, F.sigmoid, F.tanh, F.hardswish, F.hardsigmoid,
    F.hardtanh, F.leaky_relu, F.elu, F.selu, F.celu, F.mish, F.softplus, F.logsigmoid,
    F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
)  # fmt: skip

# Elementwise operations of two operands: their channels meet position by position.
_JOINING_FUNCTIONS = (
    operator.add, operator.iadd, operator.sub, operator.isub, operator.mul, operator.imul,
    torch.add, torch.sub, torch.subtract, torch.mul, torch.multiply, torch.maximum, torch.minimum,
    operator.gt, operator.ge, operator.lt, operator.le, operator.eq, operator.ne,
    torch.gt, torch.ge, torch.lt, torch.le, torch.eq, torch.ne,
)  # fmt: skip

FUNCTION_RULES: dict[Any, Rule] = {
    **dict.fromkeys(ELEMENTWISE_FUNCTIONS, keep_channels),
    **dict.fromkeys(_JOINING_FUNCTIONS, _join),
    **dict.fromkeys(
        (operator.truediv, operator.itruediv, torch.div, torch.divide, torch.true_divide),
        _divide,
    ),
    **dict.fromkeys((operator.floordiv, operator.mod), _size_arithmetic),
    builtins.getattr: _getattr,
    operator.getitem: _getitem,
    torch.chunk: _chunk,
    torch.where: _where,
    torch.flatten: _reshape_without_sizes,
    torch.squeeze: _reshape_without_sizes,
    torch.unsqueeze: _reshape_without_sizes,
    torch.reshape: _view,
    torch.unflatten: _unflatten,
    torch.permute: _permute,
    torch.transpose: _transpose,
    torch.swapaxes: _transpose,
    **dict.fromkeys((torch.cat, torch.concat, torch.concatenate), _cat),
    **dict.fromkeys((torch.mean, torch.sum, torch.amax, torch.amin), _reduce),
    **dict.fromkeys((F.softmax, F.log_softmax, torch.softmax, torch.log_softmax), _softmax),
    **dict.fromkeys((F.avg_pool1d, F.adaptive_avg_pool1d, F.lp_pool1d), _pooling(1)),
    **dict.fromkeys((F.avg_pool2d, F.adaptive_avg_pool2d, F.lp_pool2d), _pooling(2)),
    **dict.fromkeys((F.avg_pool3d, F.adaptive_avg_pool3d, F.lp_pool3d), _pooling(3)),
    F.max_pool1d: _pooling(1, indices_at=6),
    F.max_pool2d: _pooling(2, indices_at=6),
    F.max_pool3d: _pooling(3, indices_at=6),
    F.adaptive_max_pool1d: _pooling(1, indices_at=2),
    F.adaptive_max_pool2d: _pooling(2, indices_at=2),
    F.adaptive_max_pool3d: _pooling(3, indices_at=2),
    F.interpolate: _interpolate,
    F.layer_norm: _layer_norm,
}

ELEMENTWISE_METHODS = (
    "relu", "relu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "exp", "abs", "neg", "square",
    "clamp", "clamp_", "clip", "contiguous", "clone", "detach",
)  # fmt: skip

METHOD_RULES: dict[str, Rule] = {
    **dict.fromkeys(ELEMENTWISE_METHODS, keep_channels),
    **dict.fromkeys(
        (
            "add",
            "add_",
            "sub",
            "sub_",
            "mul",
            "mul_",
            "maximum",
            "minimum",
            "gt",
            "ge",
            "lt",
            "le",
            "eq",
            "ne",
        ),
        _join,
    ),
    **dict.fromkeys(("div", "div_", "true_divide"), _divide),
    **dict.fromkeys(("to", "type_as", "float", "half", "bfloat16", "double", "cpu", "cuda"), _cast),
    "chunk": _chunk,
    "size": _size,
    "numel": _numel,
    **dict.fromkeys(("dim", "element_size"), _metadata),
    **dict.fromkeys(("view", "reshape"), _view),
    **dict.fromkeys(("flatten", "squeeze", "unsqueeze"), _reshape_without_sizes),
    "unflatten": _unflatten,
    "permute": _permute,
    **dict.fromkeys(("transpose", "swapaxes"), _transpose),
    "expand": _expand,
    "expand_as": _expand_as,
    **dict.fromkeys(("mean", "sum", "amax", "amin"), _reduce),
    **dict.fromkeys(("softmax", "log_softmax"), _softmax),
}
