"""Shrinking a model sharded with FSDP2: gathered once, on rank 0, to the CPU.

:func:`~tensorplay.ao.pruning.shrink` cuts whole tensors, which no rank of an FSDP2 run holds.
:func:`gather_shrunk` makes, on rank 0, an unsharded copy of the model on the CPU (its modules
the classes FSDP wraps, without FSDP's state and hooks), fills it tensor by tensor with the
gathered full tensors (each parameter's ``full_tensor()``, its lean mask's too), and shrinks the
copy with the groups the structured pruner recorded on the model: what is removed is exactly
what the masks hold, as on one device. The sharded model is left as it was (still training, or
to save as a distributed checkpoint). :func:`save_shrunk` writes the copy as a folder:
``save_pretrained`` for a Hugging Face model (plain ``from_pretrained`` loads it where the widths
are equal in every layer, :func:`~tensorplay.ao.pruning.load_shrunk` otherwise), the pickled
module (``model.pt``) for any other.

Memory: rank 0 holds the whole model once on the CPU (its parameters, in ``dtype`` if given,
its bool masks and buffers) plus one gathered tensor at a time; every other rank holds one
gathered tensor at a time. Each tensor crosses the network once per rank (an all-gather).
Measured (``benchmarks/bench_gathered_shrink.py``): 5.4 bytes per parameter above the moment
before on rank 0 for a float32 Llama with half its FFN channels masked, 1.8 on rank 1.

Every rank must call :func:`gather_shrunk` and :func:`save_shrunk` (collectives), in the same
order. A refusal (a masked unit that would stay, a group that does not fit) is raised on every
rank, before the folder is written; the sharded model is never changed.

Example:
    >>> from torch import nn
    >>> gather_shrunk(nn.Linear(2, 2))  # a model FSDP2 did not shard: use shrink()
    Traceback (most recent call last):
    ...
    ValueError: Expected a model sharded with FSDP2 (`fully_shard`), but Linear is not one: ...
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.distillation.sharded_copy import check_gatherable, unsharded_meta_copy
from tensorplay.ao.pruning.selection import is_dtensor
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup
from tensorplay.ao.pruning.structured.shrinking.shrink import shrink
from tensorplay.ao.pruning.structured.shrinking.shrink_report import ShrinkReport

__all__ = ["GatheredShrink", "gather_shrunk", "pretrained_within", "save_shrunk", "write_shrunk"]

PICKLED_MODEL = "model.pt"
"""The file :func:`write_shrunk` writes a model that is not a Hugging Face model to."""


@dataclass(frozen=True)
class GatheredShrink:
    """What :func:`gather_shrunk` gives a rank.

    Args:
        model: The shrunk, unsharded copy on the CPU (rank 0), ``None`` on the other ranks.
        report: What shrinking removed (every rank).
    """

    model: nn.Module | None
    report: ShrinkReport

    def write(self, directory: str | os.PathLike[str]) -> None:
        """Write the copy to ``directory`` on rank 0 (:func:`write_shrunk`); every rank returns
        once the folder is whole. Collective.

        Example:
            >>> import tempfile
            >>> from torch import nn
            >>> from tensorplay.ao.pruning.structured.shrinking.shrink_report import ShrinkReport
            >>> report = ShrinkReport(6, 6, (), 0, "none", ())
            >>> with tempfile.TemporaryDirectory() as folder:
            ...     GatheredShrink(nn.Linear(2, 2), report).write(folder)
            ...     sorted(path.name for path in Path(folder).iterdir())
            ['model.pt']
        """
        import torch.distributed as dist

        if self.model is not None:
            write_shrunk(self.model, directory)
        if dist.is_initialized():
            dist.barrier()  # the folder is whole before any rank goes on


def gather_shrunk(
    model: nn.Module,
    *,
    groups: Iterable[UnitGroup] | None = None,
    dtype: torch.dtype | None = None,
) -> GatheredShrink:
    """Gather the FSDP2-sharded ``model`` on rank 0, to the CPU, and shrink the copy there
    (see the module docstring). Collective.

    Args:
        model: A module sharded with ``fully_shard`` (the root too) on a 1-D mesh, pruned with
            ``masking="inplace"``: its masks are ``DTensor`` s sharded like the weights.
        groups: The unit groups to shrink; by default, as :func:`~tensorplay.ao.pruning.shrink`:
            those the structured pruners recorded on the model, and the dependency graph's.
        dtype: The dtype of the copy's floating-point tensors (``torch.bfloat16`` halves rank
            0's memory for float32 master weights); ``None``: each tensor's own.

    Returns:
        The shrunk copy on rank 0 (``None`` elsewhere) and the report on every rank.

    Raises:
        ValueError: Before anything is gathered: ``model`` is not sharded with FSDP2, on a mesh
            of more than one dimension, or reparametrized. After gathering, on every rank:
            what :func:`~tensorplay.ao.pruning.shrink` refuses (the sharded model unchanged).

    Example:
        See the module docstring.
    """
    import torch.distributed as dist

    chosen = None if groups is None else list(groups)
    check_gatherable(model)  # every rank refuses alike, before the first collective
    copy = None
    if not dist.is_initialized() or dist.get_rank() == 0:
        copy = unsharded_meta_copy(model, keep_masks=True, dtype=dtype)
    _reshard(model)
    if copy is not None:
        copy.to_empty(device="cpu")
    _fill(model, copy)
    outcome: list[Any] = [None]
    if copy is not None:
        try:
            outcome[0] = shrink(copy, groups=chosen)
        except Exception as error:  # every rank raises it, or the others wait forever
            outcome[0] = error
    if dist.is_initialized():
        dist.broadcast_object_list(outcome, src=0)
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    report = outcome[0]
    assert isinstance(report, ShrinkReport)  # what rank 0 sends: a report or a refusal
    return GatheredShrink(copy, report)


def save_shrunk(
    model: nn.Module,
    directory: str | os.PathLike[str],
    *,
    groups: Iterable[UnitGroup] | None = None,
    dtype: torch.dtype | None = None,
) -> ShrinkReport:
    """Gather and shrink the FSDP2-sharded ``model`` (:func:`gather_shrunk`), and write the
    shrunk copy to ``directory`` on rank 0 (:func:`write_shrunk`). Collective: every rank
    returns the report once the folder is written.

    Args:
        model: As :func:`gather_shrunk`.
        directory: The folder to write (made if missing).
        groups: As :func:`gather_shrunk`.
        dtype: As :func:`gather_shrunk`: the dtype the folder is written in.

    Returns:
        What shrinking removed.

    Raises:
        ValueError: As :func:`gather_shrunk`, before anything is written.

    Example:
        >>> from torch import nn
        >>> save_shrunk(nn.Linear(2, 2), "shrunk")
        Traceback (most recent call last):
        ...
        ValueError: Expected a model sharded with FSDP2 (`fully_shard`), but Linear is not one: ...
    """
    gathered = gather_shrunk(model, groups=groups, dtype=dtype)
    gathered.write(directory)
    return gathered.report


def write_shrunk(model: nn.Module, directory: str | os.PathLike[str]) -> Path:
    """Write a shrunk (unsharded) ``model`` to ``directory``: ``save_pretrained`` of the
    Hugging Face model that holds all its parameters (:func:`pretrained_within`), else the
    pickled module to ``model.pt`` (``torch.load(path, weights_only=False)`` loads it).

    Returns:
        The folder, or the ``model.pt`` file written.

    Example:
        >>> import tempfile
        >>> from torch import nn
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     path = write_shrunk(nn.Linear(2, 3), folder)
        ...     torch.load(path, weights_only=False).out_features
        3
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    pretrained = pretrained_within(model)
    if pretrained is not None:
        pretrained.save_pretrained(folder)
        return folder
    path = folder / PICKLED_MODEL
    torch.save(model, path)
    return path


def pretrained_within(model: nn.Module) -> Any:
    """The outermost module of ``model`` with ``save_pretrained`` and a ``config`` (a Hugging
    Face model) that holds every parameter of ``model``, else ``None``: a Lightning module
    around a Hugging Face model saves as that model; one with parameters of its own does not.

    Example:
        >>> from torch import nn
        >>> pretrained_within(nn.Linear(2, 2)) is None
        True
    """
    total = {id(param) for param in model.parameters()}
    for module in model.modules():
        if hasattr(module, "save_pretrained") and hasattr(module, "config"):
            held = {id(param) for param in module.parameters()}
            return module if held == total else None
    return None


def _reshard(model: nn.Module) -> None:
    """Every FSDP module back to its sharded parameters (a root kept unsharded after its
    forward, or a module left unsharded by a failed step, holds others)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _fill(model: nn.Module, copy: nn.Module | None) -> None:
    """Each parameter and buffer of ``copy`` (rank 0) takes ``model``'s full tensor: a
    ``DTensor`` is gathered (every rank, in the model's order), any other tensor copied."""
    sources: dict[str, Tensor] = dict(model.named_parameters())
    sources.update(model.named_buffers())
    targets: dict[str, Tensor] = {}
    if copy is not None:
        targets = dict(copy.named_parameters(remove_duplicate=False))
        targets.update(copy.named_buffers(remove_duplicate=False))
    with torch.no_grad():
        for name, source in sources.items():
            full = source.full_tensor() if is_dtensor(source) else source  # type: ignore[attr-defined]
            if copy is not None:
                targets[name].copy_(full)
            del full
