"""The input features of a layer, as Wanda needs them: which inputs each weight unit multiplies.

Wanda (Sun et al. 2023) scales a weight ``W[i, j]`` by ``||X_j||_2``, the norm of the input
feature ``j`` it multiplies over the observed tokens. Per layout:

* ``nn.Linear`` (weight ``(out, in)``): feature ``j`` is ``x[..., j]``; it scales column ``j``;
* Hugging Face ``Conv1D`` (weight ``(in, out)``): feature ``j`` is ``x[..., j]``; it scales
  *row* ``j`` of the stored tensor;
* ``nn.Conv1d`` / ``nn.Conv2d`` (weight ``(out, in / groups, *kernel)``): the features are the
  entries of the unfolded input patches (``F.unfold``: the im2col matrix whose product with the
  flattened weight is the convolution), one per ``(input channel, kernel position)``; output
  channel ``o`` of group ``g`` sees the channels of group ``g``.

Wanda keeps the per-feature *sums of squares* (:meth:`FeatureLayout.squares`; the norm is their
square root); :func:`feature_layout` recognises the layer, refusing others.

Example:
    >>> import torch
    >>> from torch import nn
    >>> layout = feature_layout(nn.Linear(3, 2), "weight", "fc.weight")
    >>> sums = layout.squares(torch.tensor([[1.0, 2.0, 0.0], [1.0, 0.0, 3.0]]), "fc")
    >>> sums.tolist()
    [2.0, 4.0, 9.0]
    >>> layout.expand(sums.sqrt(), torch.Size([2, 3]), slice(0, 2)).shape  # broadcast on rows
    torch.Size([1, 3])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tensorplay.ao.pruning.calibration.padding import real_rows, refuse_padding
from tensorplay.ao.pruning.targets.layouts import is_transposed

__all__ = ["FeatureLayout", "feature_layout"]


@dataclass(frozen=True)
class FeatureLayout:
    """How a layer's input features map to its weight.

    Attributes:
        kind: ``"linear"``, ``"conv1d_hf"`` (Hugging Face ``Conv1D``) or ``"conv"``.
        kernel: The convolution's kernel size (2-D; a ``Conv1d``'s is ``(1, k)``).
        stride, padding, dilation: The convolution's, 2-D.
        groups: The convolution's groups.
        spatial: The convolution's spatial dimensions (1 or 2).
    """

    kind: str
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    spatial: int = 2

    def features(self, shape: torch.Size) -> int:
        """The number of input features of a weight of ``shape`` (its full shape)."""
        if self.kind == "linear":
            return int(shape[1])
        if self.kind == "conv1d_hf":
            return int(shape[0])
        return self.groups * int(torch.Size(shape[1:]).numel())

    def squares(self, inputs: Tensor, where: str) -> Tensor:
        """Per input feature, the sum of squares over one batch's real tokens (read by
        ``where``; :mod:`~tensorplay.ao.pruning.calibration.padding`), float32."""
        x = inputs.detach().to(torch.float32)
        if self.kind != "conv":
            x = real_rows(x, where)
            return torch.einsum("ni,ni->i", x, x)
        refuse_padding(where)
        if x.dim() == self.spatial + 1:  # unbatched
            x = x.unsqueeze(0)
        if self.spatial == 1:  # Conv1d: (N, C, L) as (N, C, 1, L)
            x = x.unsqueeze(2)
        patches = F.unfold(x, self.kernel, self.dilation, self.padding, self.stride)
        return torch.einsum("nfl,nfl->f", patches, patches)

    def expand(self, norms: Tensor, shape: torch.Size, rows: slice) -> Tensor:
        """The norms placed on the weight's rows ``rows`` (axis 0) of a weight of ``shape``."""
        if self.kind == "linear":
            return norms.view(1, -1)
        if self.kind == "conv1d_hf":
            return norms[rows].view(-1, 1)
        out = shape[0]
        per_group = norms.view(self.groups, -1)  # (groups, in / groups * kernel)
        group = torch.arange(out, device=norms.device)[rows] // (out // self.groups)
        return per_group[group].view(-1, *shape[1:])


def _pair(value: object) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    return (int(value[0]), int(value[1])) if len(value) == 2 else (1, int(value[0]))  # type: ignore[arg-type,index]


def feature_layout(module: nn.Module, name: str, fq_name: str) -> FeatureLayout | None:
    """The layout of ``module.<name>``'s input features; ``None`` if it has none Wanda knows.

    Raises:
        ValueError: A convolution whose padding unfolding cannot reproduce, naming it.
    """
    if name != "weight":
        return None
    kind = type(module).__name__
    if isinstance(module, nn.Linear) or (kind == "Conv1D" and is_transposed(module)):
        return FeatureLayout("linear" if isinstance(module, nn.Linear) else "conv1d_hf")
    if not isinstance(module, (nn.Conv1d, nn.Conv2d)):
        return None
    if isinstance(module.padding, str) or module.padding_mode != "zeros":
        raise ValueError(
            f"Expected the convolutions of importance='wanda' to pad with explicit zeros, but "
            f"{fq_name!r} ({kind}) has padding={module.padding!r}, "
            f"padding_mode={module.padding_mode!r}: its input patches cannot be unfolded as "
            "it computes them."
        )
    one_d = isinstance(module, nn.Conv1d)

    def two(value: object) -> tuple[int, int]:
        return (1, int(value[0])) if one_d else _pair(value)  # type: ignore[index]

    pad = (0, int(module.padding[0])) if one_d else _pair(module.padding)  # type: ignore[index]
    return FeatureLayout(
        "conv",
        two(module.kernel_size),
        two(module.stride),
        pad,
        two(module.dilation),
        module.groups,
        1 if one_d else 2,
    )
