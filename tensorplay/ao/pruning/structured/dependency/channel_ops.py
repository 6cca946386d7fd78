"""Which rule each function and tensor method of a traced forward follows, and the rules for
sizes, reductions and pooling.

:data:`FUNCTION_RULES` (by function) and :data:`METHOD_RULES` (by tensor method name) map an
operation to its rule: elementwise ones (:mod:`.channel_elementwise`), reshapes and
concatenation (:mod:`.channel_reshapes`), and those here. A size read from a tensor is
harmless as a dynamic size of a ``view``, but used as a number it would change when channels
go; operations that combine the positions along a dimension (a sum or softmax over the
channels, pooling over space) leave the channels along it out and pass the others. An
operation in neither table makes every channel that reaches it unprunable
(:meth:`~.channel_values.Call.opaque`).

Example:
    >>> import operator
    >>> FUNCTION_RULES[operator.add] is FUNCTION_RULES[operator.mul]
    True
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from tensorplay.ao.pruning.structured.dependency.channel_elementwise import (
    divide,
    join,
    keep_channels,
    other_values,
    size_arithmetic,
    where,
)
from tensorplay.ao.pruning.structured.dependency.channel_reshapes import (
    cat,
    chunk,
    expand,
    expand_as,
    permute,
    reshape_without_sizes,
    transpose,
    unflatten,
    view,
)
from tensorplay.ao.pruning.structured.dependency.channel_values import (
    NEEDS_SHAPES,
    Call,
    Rule,
    SizeRead,
    Tracked,
)

__all__ = [
    "ELEMENTWISE_FUNCTIONS",
    "ELEMENTWISE_METHODS",
    "FUNCTION_RULES",
    "METHOD_RULES",
    "mixing",
    "spatial",
]


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
        if not isinstance(x, Tracked) or other_values(call, x):
            return call.opaque()
        if indices_at is not None and call.argument(indices_at, "return_indices", False):
            return call.opaque("returns indices of their positions")
        return spatial(call, x, count)

    return rule


def _interpolate(call: Call) -> Any:
    x = call.argument(0, "input")
    if not isinstance(x, Tracked) or other_values(call, x):
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
    **dict.fromkeys(_JOINING_FUNCTIONS, join),
    **dict.fromkeys(
        (operator.truediv, operator.itruediv, torch.div, torch.divide, torch.true_divide),
        divide,
    ),
    **dict.fromkeys((operator.floordiv, operator.mod), size_arithmetic),
    builtins.getattr: _getattr,
    operator.getitem: _getitem,
    torch.chunk: chunk,
    torch.where: where,
    torch.flatten: reshape_without_sizes,
    torch.squeeze: reshape_without_sizes,
    torch.unsqueeze: reshape_without_sizes,
    torch.reshape: view,
    torch.unflatten: unflatten,
    torch.permute: permute,
    torch.transpose: transpose,
    torch.swapaxes: transpose,
    **dict.fromkeys((torch.cat, torch.concat, torch.concatenate), cat),
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
        join,
    ),
    **dict.fromkeys(("div", "div_", "true_divide"), divide),
    **dict.fromkeys(("to", "type_as", "float", "half", "bfloat16", "double", "cpu", "cuda"), _cast),
    "chunk": chunk,
    "size": _size,
    "numel": _numel,
    **dict.fromkeys(("dim", "element_size"), _metadata),
    **dict.fromkeys(("view", "reshape"), view),
    **dict.fromkeys(("flatten", "squeeze", "unsqueeze"), reshape_without_sizes),
    "unflatten": unflatten,
    "permute": permute,
    **dict.fromkeys(("transpose", "swapaxes"), transpose),
    "expand": expand,
    "expand_as": expand_as,
    **dict.fromkeys(("mean", "sum", "amax", "amin"), _reduce),
    **dict.fromkeys(("softmax", "log_softmax"), _softmax),
}
