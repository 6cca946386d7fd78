"""Sparsity statistics: per tensor and over a whole selection, against a target.

A pruned tensor's sparsity is read from its ``<name>_mask`` buffer, in either format
(:func:`~tensorplay.ao.pruning.masking.mask_of`): a unit is pruned when its mask is 0 and the
tensor the model computes with holds 0 there (always so for ``mask * orig``; a lean weight that
was trained back is not counted). A tensor that is not pruned counts its zeros, so a model made
permanent with ``remove`` reports the same numbers as before.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.methods import l1_unstructured
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> _ = l1_unstructured(model[0], "weight", amount=8)
    >>> report = sparsity_report(model, names=["0.weight", "2.weight"], target=0.5)
    >>> report.pruned, report.total, round(report.sparsity, 4)
    (8, 24, 0.3333)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.masking.readers import mask_of, pruned_count_of
from tensorplay.ao.pruning.parity.aliases import parameter_groups
from tensorplay.ao.pruning.parity.reparametrization import count_pruned
from tensorplay.ao.pruning.targets.parameters import resolve_parameters, select_parameters

__all__ = [
    "SparsityReport",
    "TensorSparsity",
    "pruned_units",
    "sparsity_report",
    "tensor_sparsity",
]


def tensor_sparsity(t: Tensor) -> float:
    """The fraction of entries of ``t`` equal to zero (0.0 for an empty tensor).

    Args:
        t: Any tensor.

    Returns:
        A float in [0, 1].

    Example:
        >>> import torch
        >>> tensor_sparsity(torch.tensor([0.0, 1.0, 0.0, 2.0]))
        0.5
    """
    numel = t.numel()
    if numel == 0:
        return 0.0
    return (numel - int(torch.count_nonzero(t))) / numel


def pruned_units(module: nn.Module, name: str, *, count_zeros: bool) -> tuple[int, Tensor]:
    """``(pruned, tensor)`` for ``module.<name>``: the tensor is the mask if pruned (in either
    format), and then the zeros of the mask that the tensor holds as zeros are counted; if not
    pruned, the tensor's zeros when ``count_zeros``, else 0.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2, bias=False)
        >>> pruned_units(layer, "weight", count_zeros=False)[0]
        0
    """
    mask = mask_of(module, name)
    if mask is not None:
        return pruned_count_of(module, name) or 0, mask
    tensor: Tensor = getattr(module, name)
    return (count_pruned(tensor) if count_zeros else 0), tensor


def _pruned_names(model: nn.Module) -> list[str]:
    """The first name of every pruned parameter: a tied one is listed once."""
    return [
        group.name
        for group in parameter_groups(model)
        if any(mask_of(module, name) is not None for module, name in group.pairs)
    ]


def _percent(value: float) -> str:
    return f"{100 * value:.2f}%"


@dataclass(frozen=True)
class TensorSparsity:
    """One row of a :class:`SparsityReport`.

    Args:
        name: The tensor's fully qualified name, e.g. ``"net.0.weight"``.
        shape: Its shape.
        numel: Its number of units.
        pruned: How many are pruned.

    Example:
        >>> TensorSparsity("fc.weight", (2, 5), 10, 4).sparsity
        0.4
    """

    name: str
    shape: tuple[int, ...]
    numel: int
    pruned: int

    @property
    def sparsity(self) -> float:
        """``pruned / numel`` (0.0 for an empty tensor)."""
        return self.pruned / self.numel if self.numel else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the fields and the sparsity.

        Example:
            >>> TensorSparsity("w", (2,), 2, 1).to_dict()
            {'name': 'w', 'shape': [2], 'numel': 2, 'pruned': 1, 'sparsity': 0.5}
        """
        return {
            "name": self.name,
            "shape": list(self.shape),
            "numel": self.numel,
            "pruned": self.pruned,
            "sparsity": self.sparsity,
        }


@dataclass(frozen=True)
class SparsityReport:
    """Sparsity per tensor (or per group of structured units) and over all of them, optionally
    against a target.

    ``str(report)`` is an aligned table, one row per tensor and a total row; its first column is
    headed by what a row is (:attr:`row_label`).

    Args:
        rows: One :class:`TensorSparsity` per tensor, or per group of units.
        target: The target sparsity the numbers are compared with, if any.
        row_label: What a row is: ``"tensor"``, or with a pruner's ``structure`` of channels,
            heads or layers ``"channel group"``, ``"head group"`` or ``"layer group"`` (a
            row's numbers then count units of that kind).
        notes: Lines shown under the table (a pruner's: the selected tensors its structure
            leaves dense).

    Example:
        >>> report = SparsityReport((TensorSparsity("fc.weight", (2, 5), 10, 4),), target=0.5)
        >>> print(report)
        tensor     shape   numel  pruned  sparsity
        fc.weight  (2, 5)     10       4    40.00%
        total                 10       4    40.00%  (target 50.00%)
        >>> print(SparsityReport((TensorSparsity("mlp", (8,), 8, 2),), row_label="channel group",
        ...                      notes=("dense: 1 selected tensor ...",)))
        channel group  shape  numel  pruned  sparsity
        mlp            (8,)       8       2    25.00%
        total                     8       2    25.00%
        dense: 1 selected tensor ...
    """

    rows: tuple[TensorSparsity, ...]
    target: float | None = None
    row_label: str = "tensor"
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        """The number of units over all rows."""
        return sum(row.numel for row in self.rows)

    @property
    def pruned(self) -> int:
        """The number of pruned units over all rows."""
        return sum(row.pruned for row in self.rows)

    @property
    def sparsity(self) -> float:
        """``pruned / total``, the global sparsity (0.0 when there are no units)."""
        return self.pruned / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the rows, the totals, the sparsity and the target.

        Example:
            >>> SparsityReport((TensorSparsity("w", (2,), 2, 1),)).to_dict()["sparsity"]
            0.5
        """
        return {
            "row_label": self.row_label,
            "rows": [row.to_dict() for row in self.rows],
            "total": self.total,
            "pruned": self.pruned,
            "sparsity": self.sparsity,
            "target": self.target,
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        header = (self.row_label, "shape", "numel", "pruned", "sparsity")
        lines = [
            (row.name, str(row.shape), str(row.numel), str(row.pruned), _percent(row.sparsity))
            for row in self.rows
        ]
        lines.append(("total", "", str(self.total), str(self.pruned), _percent(self.sparsity)))
        table = [header, *lines]
        widths = [max(len(line[i]) for line in table) for i in range(len(header))]
        rendered = []
        for line in table:
            left = [cell.ljust(width) for cell, width in zip(line[:2], widths[:2], strict=True)]
            right = [cell.rjust(width) for cell, width in zip(line[2:], widths[2:], strict=True)]
            rendered.append("  ".join(left + right).rstrip())
        if self.target is not None:
            rendered[-1] += f"  (target {_percent(self.target)})"
        return "\n".join([*rendered, *self.notes])


def sparsity_report(
    model: nn.Module, names: Sequence[str] | None = None, target: float | None = None
) -> SparsityReport:
    """Measure the sparsity of ``model``'s tensors.

    Args:
        model: The model.
        names: Fully qualified tensor names; default: every pruned tensor of the model (a tied
            parameter once, under its first name), or if none is pruned,
            :func:`~tensorplay.ao.pruning.targets.select_parameters` with its defaults.
        target: A target sparsity to show next to the measured one.

    Returns:
        The report, rows in the order of ``names``.

    Raises:
        ValueError: A name that is not a parameter of the model.

    Example:
        >>> from torch import nn
        >>> print(sparsity_report(nn.Sequential(nn.Linear(3, 2, bias=False))))
        tensor    shape   numel  pruned  sparsity
        0.weight  (2, 3)      6       0     0.00%
        total                 6       0     0.00%
    """
    if names is None:
        names = _pruned_names(model) or select_parameters(model)
    pairs = resolve_parameters(model, names)
    rows = []
    for fq_name, (module, name) in zip(names, pairs, strict=True):
        pruned, tensor = pruned_units(module, name, count_zeros=True)
        rows.append(TensorSparsity(fq_name, tuple(tensor.shape), tensor.numel(), pruned))
    return SparsityReport(tuple(rows), target)
