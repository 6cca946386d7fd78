"""How channels pass through the modules of a traced forward: the layers that produce and
consume them, the norms that carry per-channel entries, and the modules that act per position.

A Linear or Conv *produces* channels (the rows of its weight, its bias entries) and
*consumes* its input's channels (the columns of its weight). A grouped convolution can only
lose whole groups: each group's input channels and output channels are one unit (a depthwise
convolution: an input channel and its output channel). BatchNorm (and InstanceNorm and
GroupNorm with one channel per group) with affine parameters carries one entry per channel.
:func:`module_rule` answers for a module of one of these types whose ``forward`` is the
type's own; every other module is traced through (a model's own modules) or, left whole by
torch.fx, makes the channels reaching it unprunable.

Example:
    >>> from torch import nn
    >>> module_rule(nn.Linear(2, 2)) is not None, module_rule(nn.MultiheadAttention(4, 2))
    (True, None)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from tensorplay.ao.pruning.parity.reparametrization import parameter_of
from tensorplay.ao.pruning.structured.dependency.channel_elementwise import keep_channels
from tensorplay.ao.pruning.structured.dependency.channel_ops import mixing, spatial
from tensorplay.ao.pruning.structured.dependency.channel_reshapes import reshaped
from tensorplay.ao.pruning.structured.dependency.channel_values import (
    NEEDS_SHAPES,
    Call,
    Rule,
    Tracked,
)

__all__ = ["MODULE_RULES", "module_rule", "unknown_module"]


def module_rule(module: nn.Module) -> Rule | None:
    """The rule for ``module``: its type's (or a base type's whose ``forward`` it keeps).

    Example:
        >>> from torch import nn
        >>> class Gated(nn.Linear):
        ...     def forward(self, x):
        ...         return super().forward(x) * 2
        >>> module_rule(Gated(2, 2)) is None
        True
    """
    for cls in type(module).__mro__:
        rule = MODULE_RULES.get(cls)
        if rule is not None:
            own = getattr(cls, "forward", None)
            return rule if getattr(type(module), "forward", None) is own else None
    return None


def _input(call: Call) -> Tracked | None:
    x = call.args[0] if call.args else None
    return x if isinstance(x, Tracked) and len(call.args) == 1 and not call.kwargs else None


def _module(call: Call) -> Any:
    if call.module is None:
        raise TypeError(f"Expected a module call, but got {call.what}.")
    return call.module


def _produce(call: Call, dim: int, count: int) -> tuple[int, ...]:
    """The module's output channels: rows of its weight along ``dim``, with its bias."""
    rows = call.atoms.entries(call.name_of("weight"), dim, count, role="out", scored=True)
    if parameter_of(_module(call), "bias") is not None:
        bias = call.atoms.entries(call.name_of("bias"), 0, count, role="out", scored=False)
        for row, entry in zip(rows, bias, strict=True):
            call.atoms.join(row, entry)
    return tuple(rows)


def _consume(call: Call, x: Tracked, dim: int, entries: Sequence[int]) -> None:
    """Join ``x``'s channels along ``dim`` with the module's entries for them; entries whose
    input the analysis does not follow can never be removed (the module may be shared)."""
    positions = x.channels.get(dim)
    if positions is None or len(positions) != len(entries):
        call.poison(entries, "also reads inputs whose channels the analysis does not follow")
        call.poison(positions or (), "expects a different number of them")
        return
    for position, entry in zip(positions, entries, strict=True):
        call.atoms.join(position, entry)


def _kept_before(x: Tracked, call: Call, channel_dim: int) -> dict[int, tuple[int, ...]]:
    """Channels along dimensions before ``channel_dim`` (a batch) pass; those after it (the
    positions a convolution or a norm mixes) are unprunable."""
    for dim, positions in x.channels.items():
        if dim > channel_dim:
            call.poison(positions, "mixes positions along them")
    return {dim: positions for dim, positions in x.channels.items() if dim < channel_dim}


def _linear(call: Call) -> Any:
    x, linear = _input(call), _module(call)
    if x is None:
        return call.opaque()
    columns = call.atoms.entries(
        call.name_of("weight"), 1, linear.in_features, role="in", scored=True
    )
    _consume(call, x, -1, columns)
    channels = {dim: positions for dim, positions in x.channels.items() if dim != -1}
    channels[-1] = _produce(call, 0, linear.out_features)
    return call.result(channels)


def _conv(call: Call) -> Any:
    x, conv = _input(call), _module(call)
    if x is None:
        return call.opaque()
    channel_dim = -(len(conv.kernel_size) + 1)
    rows = _produce(call, 0, conv.out_channels)
    if conv.groups == 1:
        columns = call.atoms.entries(
            call.name_of("weight"), 1, conv.in_channels, role="in", scored=True
        )
        _consume(call, x, channel_dim, columns)
    else:
        _join_groups(call, x.channels.get(channel_dim), rows, conv.in_channels, conv.groups)
    channels = _kept_before(x, call, channel_dim)
    channels[channel_dim] = rows
    return call.result(channels)


def _join_groups(
    call: Call, inputs: tuple[int, ...] | None, rows: tuple[int, ...], count: int, groups: int
) -> None:
    """A grouped convolution loses whole groups: each group's input and output channels are
    one unit."""
    if inputs is None:
        call.poison(rows, "is a grouped convolution whose inputs the analysis does not follow")
        return
    per_in, per_out = count // groups, len(rows) // groups
    for group in range(groups):
        members = (
            inputs[group * per_in : (group + 1) * per_in]
            + rows[group * per_out : (group + 1) * per_out]
        )
        for member in members[1:]:
            call.atoms.join(members[0], member)


def _conv_transpose(call: Call) -> Any:
    x, conv = _input(call), _module(call)
    if x is None or conv.groups != 1:
        return unknown_module(call)
    channel_dim = -(len(conv.kernel_size) + 1)
    columns = call.atoms.entries(
        call.name_of("weight"), 0, conv.in_channels, role="in", scored=True
    )
    _consume(call, x, channel_dim, columns)
    channels = _kept_before(x, call, channel_dim)
    channels[channel_dim] = _produce(call, 1, conv.out_channels)
    return call.result(channels)


def unknown_module(call: Call) -> Any:
    """A module the analysis does not follow: channels reaching it and its own parameters
    are unprunable."""
    module = _module(call)
    for name, _ in module.named_parameters():
        call.atoms.poison_parameter(call.name_of(name), f"{call.what} is not followed")
    return call.opaque()


def _per_channel_entries(call: Call, x: Tracked, channel_dim: int, count: int, why: str) -> Any:
    """A norm with one weight and bias entry per channel along ``channel_dim``."""
    module = _module(call)
    if parameter_of(module, "weight") is None:
        call.poison(x.channels.get(channel_dim, ()), why)
    else:
        weight = call.atoms.entries(call.name_of("weight"), 0, count, role="norm", scored=False)
        if parameter_of(module, "bias") is not None:
            bias = call.atoms.entries(call.name_of("bias"), 0, count, role="norm", scored=False)
            for entry, other in zip(weight, bias, strict=True):
                call.atoms.join(entry, other)
        _consume(call, x, channel_dim, weight)
    channels = _kept_before(x, call, channel_dim)
    if channel_dim in x.channels and parameter_of(module, "weight") is not None:
        channels[channel_dim] = x.channels[channel_dim]
    return call.result(channels)


_NO_AFFINE = "has no affine parameters, so the channels cannot be recorded for removal"


def _batch_norm(dims: int | None) -> Rule:
    """BatchNorm over inputs of ``dims`` dimensions (``None``: 2 or 3, read from the shape)."""

    def rule(call: Call) -> Any:
        x = _input(call)
        if x is None:
            return call.opaque()
        ndim = dims if dims is not None else x.ndim
        if ndim is None:
            call.poison(list(x.atoms()), f"normalises them ({NEEDS_SHAPES})")
            return call.result()
        return _per_channel_entries(call, x, 1 - ndim, _module(call).num_features, _NO_AFFINE)

    return rule


def _instance_norm(call: Call) -> Any:
    x, norm = _input(call), _module(call)
    if x is None:
        return call.opaque()
    channel_dim = -(_spatial_dims(norm) + 1)
    return _per_channel_entries(call, x, channel_dim, norm.num_features, _NO_AFFINE)


def _spatial_dims(norm: nn.Module) -> int:
    for count, types in enumerate(
        (
            (nn.InstanceNorm1d, nn.LazyInstanceNorm1d),
            (nn.InstanceNorm2d, nn.LazyInstanceNorm2d),
            (nn.InstanceNorm3d, nn.LazyInstanceNorm3d),
        ),
        start=1,
    ):
        if isinstance(norm, types):
            return count
    raise TypeError(f"Expected an InstanceNorm module, but got {type(norm).__name__}.")


def _group_norm(call: Call) -> Any:
    x, norm = _input(call), _module(call)
    if x is None:
        return call.opaque()
    if x.ndim is None:
        call.poison(list(x.atoms()), f"normalises them ({NEEDS_SHAPES})")
        return call.result()
    if norm.num_groups != norm.num_channels:
        return mixing(call, x, list(x.channels), "normalises across groups of them")
    return _per_channel_entries(call, x, 1 - x.ndim, norm.num_channels, _NO_AFFINE)


def _layer_norm(call: Call) -> Any:
    x, norm = _input(call), _module(call)
    if x is None:
        return call.opaque()
    dims = list(range(-len(norm.normalized_shape), 0))
    return mixing(call, x, dims, "normalises across them")


def _softmax(call: Call) -> Any:
    x, softmax = _input(call), _module(call)
    if x is None or softmax.dim is None:
        return call.opaque("normalises across them")
    dim = x.negative(softmax.dim)
    dims = list(x.channels) if dim is None else [dim]
    return mixing(call, x, dims, "normalises across them")


def _elementwise(call: Call) -> Any:
    return keep_channels(call) if _input(call) is not None else call.opaque()


def _prelu(call: Call) -> Any:
    if _module(call).num_parameters != 1:
        return unknown_module(call)
    return _elementwise(call)


def _pooling(count: int) -> Rule:
    def rule(call: Call) -> Any:
        x = _input(call)
        if x is None or getattr(_module(call), "return_indices", False):
            return call.opaque()
        return spatial(call, x, count)

    return rule


def _upsample(call: Call) -> Any:
    x = _input(call)
    if x is None:
        return call.opaque()
    return spatial(call, x, None if x.ndim is None else x.ndim - 2)


def _flatten(call: Call) -> Any:
    x = _input(call)
    return call.opaque() if x is None else reshaped(call, x)


def _unflatten(call: Call) -> Any:
    x = _input(call)
    if x is None:
        return call.opaque()
    dim = x.negative(_module(call).dim)
    if dim is None or dim in x.channels:
        return call.opaque("splits them into sizes written in the code")
    return reshaped(call, x)


def _table(rule: Rule, *types: type[nn.Module]) -> dict[type[nn.Module], Rule]:
    return dict.fromkeys(types, rule)


_ELEMENTWISE: tuple[type[nn.Module], ...] = (
    nn.Identity, nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Hardswish,
    nn.Hardsigmoid, nn.Hardtanh, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.Mish, nn.Softplus,
    nn.LogSigmoid, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)  # fmt: skip

MODULE_RULES: dict[type[nn.Module], Callable[[Call], Any]] = {
    nn.Linear: _linear,
    **_table(_conv, nn.Conv1d, nn.Conv2d, nn.Conv3d),
    **_table(_conv_transpose, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d),
    nn.BatchNorm1d: _batch_norm(None),
    nn.BatchNorm2d: _batch_norm(4),
    nn.BatchNorm3d: _batch_norm(5),
    nn.SyncBatchNorm: _batch_norm(None),
    **_table(_instance_norm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d),
    nn.GroupNorm: _group_norm,
    **_table(_layer_norm, nn.LayerNorm, nn.RMSNorm),
    **_table(_softmax, nn.Softmax, nn.LogSoftmax),
    **_table(_elementwise, *_ELEMENTWISE),
    nn.PReLU: _prelu,
    **_table(
        _pooling(1),
        nn.MaxPool1d,
        nn.AvgPool1d,
        nn.AdaptiveAvgPool1d,
        nn.AdaptiveMaxPool1d,
        nn.LPPool1d,
    ),
    **_table(
        _pooling(2),
        nn.MaxPool2d,
        nn.AvgPool2d,
        nn.AdaptiveAvgPool2d,
        nn.AdaptiveMaxPool2d,
        nn.LPPool2d,
    ),
    **_table(
        _pooling(3),
        nn.MaxPool3d,
        nn.AvgPool3d,
        nn.AdaptiveAvgPool3d,
        nn.AdaptiveMaxPool3d,
        nn.LPPool3d,
    ),
    nn.Upsample: _upsample,
    nn.Flatten: _flatten,
    nn.Unflatten: _unflatten,
}
