"""While hidden channels are masked, every norm over the stream normalises the kept ones only.

A masked hidden channel (:mod:`~tensorplay.ao.pruning.structured.dependency.hidden_width`) is
zero all along the residual stream, but a norm over the stream still counts it: an RMSNorm
divides by ``sqrt(sum(x**2) / hidden_size + eps)``, a LayerNorm takes its mean and variance over
all ``hidden_size`` entries. The shrunk model, which has no such channel, divides by the kept
width. :class:`StreamNormHook`, a forward hook on each norm over the stream, recomputes the norm
over the kept channels (an RMSNorm in float32 as Hugging Face's does, a LayerNorm with
``F.layer_norm`` over the kept entries) and puts zeros at the masked ones, so the masked model
computes what the shrunk one does.

**Which channels are kept** is read from the norm's own ``weight``: its mask (either masking
mode), else its values (a channel whose weight and bias are exactly zero is pruned: after
``make_permanent``). A mask is read again whenever it changed (another tensor, an in-place
write, which bumps its version, or its data swapped), values at every forward; so the hook
follows a gradual pruner's steps, a resumed pruner's restored masks and ``make_permanent`` with
nothing to refresh, and while the masks stay as they are a forward costs no copy to the host (no
device synchronisation on a GPU). Where no channel is masked it returns the norm's output
untouched. The hidden structure installs it when the pruner
is made (:func:`install_stream_norms`, through the one owner of model changes), and
:func:`~tensorplay.ao.pruning.shrink` removes it once the channels are gone
(:func:`remove_stream_norms`).

Example:
    >>> import torch
    >>> from torch import nn
    >>> norm = nn.LayerNorm(4)
    >>> install_stream_norms([(norm, "layer")])
    >>> with torch.no_grad():
    ...     norm.weight[3] = 0
    ...     norm.bias[3] = 0
    >>> x = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    >>> torch.allclose(norm(x)[:, :3], nn.functional.layer_norm(x[:, :3], (3,)))
    True
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking.readers import mask_of
from tensorplay.ao.pruning.structured.dependency.hidden_width import NormKind

__all__ = [
    "StreamNormHook",
    "install_stream_norms",
    "kept_channels",
    "masked_stream_norms",
    "remove_stream_norms",
]


class StreamNormHook:
    """The forward hook that normalises over the kept channels (see the module docstring).

    Args:
        kind: ``"rms"`` or ``"layer"``.
    """

    def __init__(self, kind: NormKind) -> None:
        self.kind = kind
        self._read: tuple[tuple[Tensor, int, int, torch.device] | None, Tensor | None] | None = None

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        index = self._kept_index(module, output.device)
        if index is None:
            return None
        x = args[0].index_select(-1, index)
        full = cast(Tensor, module.weight)  # the effective (masked) weight
        weight = full.index_select(0, index)
        eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
        if self.kind == "layer":
            found = cast(Tensor | None, module.bias)
            bias = None if found is None else found.index_select(0, index)
            normed = F.layer_norm(x, (len(index),), weight, bias, eps)
        else:  # Hugging Face's RMSNorm: float32 statistics, back to the input dtype, weighted
            x32 = x.to(torch.float32)
            variance = x32.pow(2).mean(-1, keepdim=True)
            normed = weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)
        result = output.new_zeros(output.shape)
        result.index_copy_(-1, index, normed.to(output.dtype))
        return result

    def _kept_index(self, module: nn.Module, device: torch.device) -> Tensor | None:
        """The kept channels' indices on ``device`` (``None``: all kept). A mask's are read
        again only when it changed since the last read: another tensor, its version (an
        in-place write) or its storage (a ``.data`` swap, as undoing a change does); values
        (no mask) are read at every call."""
        mask = mask_of(module, "weight")
        source = None if mask is None else (mask, mask._version, mask.data_ptr(), device)
        read = self._read
        if source is not None and read is not None and read[0] is not None:
            old = read[0]
            if old[0] is source[0] and old[1:] == source[1:]:
                return read[1]
        kept = kept_channels(module)
        index = None if bool(kept.all()) else torch.nonzero(kept).flatten().to(device)
        self._read = (source, index)
        return index

    def permanent_refusal(self, module: nn.Module) -> str | None:
        """Why the permanent form of ``module`` would compute otherwise (read by
        :func:`~tensorplay.ao.pruning.masking.permanent.check_permanent_hooks`), or ``None``
        where no channel is masked."""
        kept = kept_channels(module)
        if bool(kept.all()):
            return None
        return (
            f"normalises over its {int(kept.sum())} kept channels of {kept.numel()} only while "
            "tensorplay's hook is on it: a model loaded from this state would normalise over "
            "all of them. Call tensorplay.ao.pruning.shrink(model) before saving the model for "
            "use (or save a training checkpoint, with the masks, to resume pruning)."
        )


def kept_channels(norm: nn.Module) -> Tensor:
    """Per channel of a norm over the stream, whether it is kept: its weight's mask where it
    has one (either masking mode), else where its weight or bias is not zero.

    Example:
        >>> norm = nn.LayerNorm(3)
        >>> with torch.no_grad():
        ...     norm.weight[1] = 0
        ...     norm.bias[1] = 0
        >>> kept_channels(norm).tolist()
        [True, False, True]
    """
    mask = mask_of(norm, "weight")
    if mask is not None:
        return (mask.detach() != 0).cpu()
    kept = norm.get_parameter("weight").detach() != 0
    bias = norm._parameters.get("bias")
    if bias is not None:
        kept = kept | (bias.detach() != 0)
    return kept.cpu()


def install_stream_norms(norms: Iterable[tuple[nn.Module, NormKind]]) -> None:
    """Hook each norm with a :class:`StreamNormHook`, unless it has one."""
    for norm, kind in norms:
        if not any(isinstance(hook, StreamNormHook) for hook in norm._forward_hooks.values()):
            changes.hook(norm.register_forward_hook, StreamNormHook(kind))


def remove_stream_norms(norm: nn.Module) -> None:
    """Remove the :class:`StreamNormHook` of ``norm`` (its masked channels are gone).

    Example:
        >>> norm = nn.LayerNorm(3)
        >>> install_stream_norms([(norm, "layer")])
        >>> remove_stream_norms(norm)
        >>> len(norm._forward_hooks)
        0
    """
    changes.touch(norm)
    for key, hook in list(norm._forward_hooks.items()):
        if isinstance(hook, StreamNormHook):
            del norm._forward_hooks[key]
            norm._forward_hooks_with_kwargs.pop(key, None)
            norm._forward_hooks_always_called.pop(key, None)


def masked_stream_norms(model: nn.Module) -> list[str]:
    """The norms of ``model`` that a :class:`StreamNormHook` makes normalise over fewer
    channels than they hold: only the hook keeps such a model computing what it should, so a
    copy loaded without tensorplay computes otherwise until
    :func:`~tensorplay.ao.pruning.shrink` removes the channels.

    Example:
        >>> model = nn.Sequential(nn.LayerNorm(3))
        >>> install_stream_norms([(model[0], "layer")])
        >>> masked_stream_norms(model)
        []
        >>> with torch.no_grad():
        ...     model[0].weight[0] = 0
        ...     model[0].bias[0] = 0
        >>> masked_stream_norms(model)
        ['0']
    """
    return [
        name
        for name, module in model.named_modules()
        if any(isinstance(hook, StreamNormHook) for hook in module._forward_hooks.values())
        and not bool(kept_channels(module).all())
    ]
