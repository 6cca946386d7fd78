"""Bringing a plain module's attributes in line with parameters that lost units.

After shrinking slices a module's parameters, the attributes that mirror their shapes
(``nn.Linear.in_features``, ``Conv2d.out_channels``, ``BatchNorm2d.num_features``, Hugging Face
``Conv1D.nf``) and the buffers that follow the same channels (BatchNorm's running statistics)
must follow. Each module type has one resizer here, found by :func:`resizer_for`; a module with
none cannot shrink, and shrinking says so before it changes anything. A new type is one
function and its line in :data:`RESIZERS`.

A resizer receives the module and, per local parameter name, the kept indices of every sliced
dimension (``{"weight": {0: tensor([0, 2])}}``).

Example:
    >>> import torch
    >>> from torch import nn
    >>> norm = nn.BatchNorm1d(3)
    >>> norm.running_mean = torch.tensor([1.0, 2.0, 3.0])
    >>> kept = torch.tensor([0, 2])
    >>> norm.weight = nn.Parameter(norm.weight.detach()[kept])
    >>> norm.bias = nn.Parameter(norm.bias.detach()[kept])
    >>> resizer_for(norm)(norm, {"weight": {0: kept}, "bias": {0: kept}})
    >>> norm.num_features, norm.running_mean.tolist()
    (2, [1.0, 3.0])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase
from torch.nn.modules.conv import _ConvNd
from torch.nn.modules.instancenorm import _InstanceNorm

__all__ = ["RESIZERS", "Kept", "Resizer", "resize", "resizer_for"]

Kept = Mapping[str, Mapping[int, Tensor]]
"""Per local parameter name, the kept indices of each dimension that lost units."""
Resizer = Callable[[nn.Module, Kept], None]


def _linear(module: nn.Module, kept: Kept) -> None:
    assert isinstance(module, nn.Linear)
    module.out_features = int(module.weight.shape[0])
    module.in_features = int(module.weight.shape[1])


def _conv1d(module: nn.Module, kept: Kept) -> None:
    """Hugging Face's ``Conv1D``: weight ``(nx, nf)``."""
    rows, columns = module.get_parameter("weight").shape
    vars(module).update(nx=int(rows), nf=int(columns))


def _is_conv1d(module: nn.Module) -> bool:
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "nx")


def _is_plain_conv(module: nn.Module) -> bool:
    """A convolution (not transposed) with one group or depthwise: the two whose channels
    shrink by rows and columns of the weight alone."""
    return (
        isinstance(module, _ConvNd)
        and not module.transposed
        and (module.groups == 1 or module.groups == module.in_channels == module.out_channels)
    )


def _conv(module: nn.Module, kept: Kept) -> None:
    assert isinstance(module, _ConvNd)
    out_channels, per_group = module.weight.shape[:2]
    if module.groups == 1:
        module.out_channels, module.in_channels = out_channels, per_group
    else:  # depthwise: one input channel per output channel
        module.out_channels = module.in_channels = module.groups = out_channels


def _batch_norm(module: nn.Module, kept: Kept) -> None:
    assert isinstance(module, _BatchNorm)
    _batch_norm_like(module, kept)


def _is_grouped_conv(module: nn.Module) -> bool:
    return isinstance(module, _ConvNd) and not module.transposed and module.groups > 1


def _grouped_conv(module: nn.Module, kept: Kept) -> None:
    """A grouped convolution that lost whole groups (the channel analysis makes a group one
    unit: its input channels with its output channels); each group keeps its width."""
    assert isinstance(module, _ConvNd)
    per_group = module.out_channels // module.groups
    out_channels, in_per_group = module.weight.shape[:2]
    if out_channels % per_group:
        raise ValueError(
            f"Expected a grouped convolution to lose whole groups of {per_group} output "
            f"channels, but {out_channels} of {module.out_channels} are left."
        )
    module.groups = out_channels // per_group
    module.out_channels, module.in_channels = out_channels, in_per_group * module.groups


def _is_transposed_conv(module: nn.Module) -> bool:
    return isinstance(module, _ConvNd) and module.transposed and module.groups == 1


def _transposed_conv(module: nn.Module, kept: Kept) -> None:
    """A transposed convolution: weight ``(in_channels, out_channels, *kernel)``."""
    assert isinstance(module, _ConvNd)
    module.in_channels, module.out_channels = module.weight.shape[:2]


def _instance_norm(module: nn.Module, kept: Kept) -> None:
    """InstanceNorm with affine parameters, and its running statistics where it keeps them."""
    assert isinstance(module, _InstanceNorm)
    _batch_norm_like(module, kept)


def _batch_norm_like(module: _NormBase, kept: Kept) -> None:
    indices = kept.get("weight", kept.get("bias", {})).get(0)
    if indices is not None:
        for name in ("running_mean", "running_var"):
            buffer = module._buffers.get(name)
            if buffer is not None:
                module._buffers[name] = buffer.index_select(0, indices.to(buffer.device))
    module.num_features = module.weight.shape[0]


def _is_group_norm_per_channel(module: nn.Module) -> bool:
    return (
        isinstance(module, nn.GroupNorm)
        and module.affine
        and module.num_groups == module.num_channels
    )


def _group_norm_per_channel(module: nn.Module, kept: Kept) -> None:
    """GroupNorm of one channel per group: it normalises each channel alone."""
    assert isinstance(module, nn.GroupNorm)
    module.num_groups = module.num_channels = int(module.weight.shape[0])


def _is_expert_holder(module: nn.Module) -> bool:
    """A mixture-of-experts router or experts module: an int ``num_experts`` counting its
    parameters' rows along dim 0 (what the expert units of
    :mod:`~tensorplay.ao.pruning.structured.dependency.families.moe` slice)."""
    count = getattr(module, "num_experts", None)
    return isinstance(count, int) and not isinstance(module, nn.Linear)


def _expert_holder(module: nn.Module, kept: Kept) -> None:
    """Experts removed along dim 0 of its parameters (``num_experts`` follows), or channels of
    each expert along another dim of a fused 3-D expert tensor (the family's ``sync`` sets the
    width)."""
    for name, dims in kept.items():
        parameter = module.get_parameter(name)
        if (
            set(dims) - {0}
            and parameter.dim() != 3
            and not (name == "weight" and set(dims) <= {0, 1})
        ):
            raise ValueError(
                f"Expected the experts of {type(module).__name__} to lose whole experts (dim 0 "
                f"of {name!r}), channels of a fused 3-D expert tensor or hidden channels of a "
                f"router, but dims {sorted(dims)} of a {parameter.dim()}-D tensor shrink."
            )
        vars(module)["num_experts"] = int(parameter.shape[0])
    _hidden_dim(module)


def _hidden_dim(module: nn.Module) -> None:
    """A router's or fused experts' ``hidden_dim`` (the residual stream's width, which their
    forward reshapes by) from the tensor that holds it: the router's ``weight``
    ``(experts, hidden)``, the experts' ``down_proj`` ``(experts, hidden, inter)``."""
    if not isinstance(vars(module).get("hidden_dim"), int):
        return
    for name, dim in (("weight", 1), ("down_proj", 1)):
        parameter = module._parameters.get(name)
        if parameter is not None and parameter.dim() > dim:
            vars(module)["hidden_dim"] = int(parameter.shape[dim])
            return


def _embedding(module: nn.Module, kept: Kept) -> None:
    """``nn.Embedding`` whose columns (the residual stream's channels) shrank."""
    assert isinstance(module, nn.Embedding)
    module.embedding_dim = int(module.weight.shape[1])


def _layer_norm(module: nn.Module, kept: Kept) -> None:
    """``nn.LayerNorm`` over one dimension whose entries shrank."""
    assert isinstance(module, nn.LayerNorm)
    module.normalized_shape = (int(module.weight.shape[0]),)


def _is_rms_norm(module: nn.Module) -> bool:
    """A Hugging Face RMSNorm: a ``*RMSNorm`` class with a 1-D ``weight`` (and no size
    attribute other than ``hidden_size`` where it keeps one)."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(weight, Tensor)
        and weight.dim() == 1
    )


def _rms_norm(module: nn.Module, kept: Kept) -> None:
    width = int(module.get_parameter("weight").shape[0])
    if isinstance(vars(module).get("hidden_size"), int):
        vars(module)["hidden_size"] = width
    if isinstance(module, nn.RMSNorm):
        module.normalized_shape = (width,)


RESIZERS: tuple[tuple[Callable[[nn.Module], bool], Resizer], ...] = (
    (lambda module: isinstance(module, nn.Linear), _linear),
    (_is_conv1d, _conv1d),
    (_is_plain_conv, _conv),
    (lambda module: isinstance(module, _BatchNorm) and module.affine, _batch_norm),
    (_is_grouped_conv, _grouped_conv),
    (_is_transposed_conv, _transposed_conv),
    (lambda module: isinstance(module, _InstanceNorm) and module.affine, _instance_norm),
    (_is_group_norm_per_channel, _group_norm_per_channel),
    (_is_expert_holder, _expert_holder),
    (lambda module: isinstance(module, nn.Embedding), _embedding),
    (
        lambda module: isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1,
        _layer_norm,
    ),
    (_is_rms_norm, _rms_norm),
)
"""Each module type that can shrink: a test and the function that resizes it."""


def resizer_for(module: nn.Module) -> Resizer | None:
    """The resizer of ``module``'s type, or ``None`` if it cannot shrink.

    Example:
        >>> resizer_for(nn.Linear(2, 2)) is not None, resizer_for(nn.GRU(2, 2))
        (True, None)
    """
    for matches, resizer in RESIZERS:
        if matches(module):
            return resizer
    return None


def resize(module: nn.Module, kept: Kept) -> None:
    """Resize ``module`` after its parameters were sliced (see the module docstring).

    Raises:
        ValueError: A module type with no resizer (checked before shrinking; here for a
            direct call).
    """
    resizer = resizer_for(module)
    if resizer is None:
        raise ValueError(
            f"Expected a module shrink knows how to resize, but got {type(module).__name__}."
        )
    resizer(module, kept)
