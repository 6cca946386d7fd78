"""The ridge least-squares solve of reconstruction: a consumer re-fitted over its kept inputs.

A consumer of pruned units (the ``down_proj`` of pruned FFN channels, the ``o_proj`` of pruned
heads) computes ``Y = X W^T`` with ``X`` its inputs. Once units are pruned it sees only the kept
inputs ``X_k``; re-solving its weight over them makes its outputs match the dense model's
``Y_d = X_d W_d^T`` as closely as least squares can:

.. math::

    W = \\arg\\min_W \\lVert X_d W_d^\\top - X_k W^\\top \\rVert_F^2
        + \\lambda \\lVert W \\rVert_F^2 = W_d C^\\top (G + \\lambda I)^{-1},
    \\qquad G = X_k^\\top X_k,\\; C = X_k^\\top X_d,\\;
    \\lambda = \\mathrm{damping} \\cdot \\operatorname{mean}(\\operatorname{diag} G).

Only the Gram matrices ``G`` (kept by kept) and ``C`` (kept by all inputs) are needed, so the
calibration tokens are summed into them and never stored. The damping is relative to the mean
diagonal so one value suits every layer's scale; it keeps the solve well posed where kept
inputs are collinear or rarely active, and pulls the solution towards small weights.

Example:
    >>> import torch
    >>> x = torch.randn(64, 4, dtype=torch.float64)
    >>> dense = torch.randn(3, 4, dtype=torch.float64)
    >>> kept = x[:, :3]  # input 3 pruned
    >>> w = ridge_solve(kept.T @ kept, kept.T @ x, dense, damping=0.0)
    >>> error = lambda weight: float((kept @ weight.T - x @ dense.T).norm())
    >>> w.shape, error(w) <= error(dense[:, :3])  # re-solved, or the dense columns kept
    (torch.Size([3, 3]), True)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["check_damping", "ridge_solve"]


def ridge_solve(gram: Tensor, cross: Tensor, weight: Tensor, damping: float) -> Tensor:
    """The weight over the kept inputs whose outputs best match the dense ones (the module).

    Computed in float64 (a Cholesky solve; a pseudo-inverse where ``G + lambda I`` is singular,
    which only ``damping=0`` allows) and returned in ``weight``'s dtype and device.

    Args:
        gram: ``G = X_k^T X_k``, ``(k, k)``: the kept inputs' Gram matrix.
        cross: ``C = X_k^T X_d``, ``(k, n)``: the kept inputs against the dense inputs.
        weight: ``W_d``, ``(out, n)``: the dense weight (in ``nn.Linear``'s layout).
        damping: ``lambda`` relative to the mean diagonal of ``G`` (absolute where that is
            zero: no kept input was ever nonzero); ``>= 0``.

    Returns:
        ``W``, ``(out, k)``.

    Raises:
        ValueError: Shapes that do not fit together, or a negative or non-finite ``damping``.

    Example:
        >>> import torch
        >>> g = torch.eye(2, dtype=torch.float64)
        >>> ridge_solve(g, torch.eye(2, dtype=torch.float64), torch.ones(1, 2), 1.0)
        tensor([[0.5000, 0.5000]])
    """
    _check(gram, cross, weight, damping)
    g = gram.to(torch.float64)
    scale = float(g.diagonal().mean()) if g.numel() else 0.0
    lam = damping * (scale if scale > 0 else 1.0)
    system = g + lam * torch.eye(g.shape[0], dtype=torch.float64, device=g.device)
    rhs = cross.to(device=g.device, dtype=torch.float64) @ weight.to(g.device, torch.float64).T
    factor, info = torch.linalg.cholesky_ex(system)
    if int(info) == 0:
        solved = torch.cholesky_solve(rhs, factor)
    else:
        solved = torch.linalg.pinv(system, hermitian=True) @ rhs
    return solved.T.to(device=weight.device, dtype=weight.dtype)


def _check(gram: Tensor, cross: Tensor, weight: Tensor, damping: float) -> None:
    if gram.dim() != 2 or gram.shape[0] != gram.shape[1]:
        raise ValueError(f"Expected `gram` to be square, but got shape {tuple(gram.shape)}.")
    if cross.dim() != 2 or cross.shape[0] != gram.shape[0]:
        raise ValueError(
            f"Expected `cross` to have {gram.shape[0]} rows (the kept inputs of `gram`), but "
            f"got shape {tuple(cross.shape)}."
        )
    if weight.dim() != 2 or weight.shape[1] != cross.shape[1]:
        raise ValueError(
            f"Expected `weight` to have {cross.shape[1]} columns (the dense inputs of `cross`), "
            f"but got shape {tuple(weight.shape)}."
        )
    check_damping("damping", damping)


def check_damping(name: str, damping: object) -> float:
    """``damping`` as a float, refused unless a finite number ``>= 0``.

    Raises:
        TypeError: Not a number.
        ValueError: Negative or not finite, naming the argument.

    Example:
        >>> check_damping("reconstruct_damping", -1.0)
        Traceback (most recent call last):
        ...
        ValueError: Expected `reconstruct_damping` to be a finite float >= 0, but got -1.0.
    """
    if isinstance(damping, bool) or not isinstance(damping, (int, float)):
        raise TypeError(f"Expected `{name}` to be a finite float >= 0, but got {damping!r}.")
    if not math.isfinite(damping) or damping < 0:
        raise ValueError(f"Expected `{name}` to be a finite float >= 0, but got {damping!r}.")
    return float(damping)
