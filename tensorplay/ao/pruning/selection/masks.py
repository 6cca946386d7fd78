"""The entry points: from a ``k`` to the keep mask of every source, and keep factors applied."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from tensorplay.ao.pruning.selection import tuning
from tensorplay.ao.pruning.selection.checks import count_eligible
from tensorplay.ao.pruning.selection.cut import find_cut
from tensorplay.ao.pruning.selection.keys import KeySpec
from tensorplay.ao.pruning.selection.passes import fused_pass
from tensorplay.ao.pruning.selection.plan import Selection, chunk_size
from tensorplay.ao.pruning.selection.scans import Speculative
from tensorplay.ao.pruning.selection.threads import own_threads, run_on_own_thread
from tensorplay.ao.pruning.selection.write import apply_cut

__all__ = ["keep_masks", "multiply_in_place"]


def keep_masks(
    scores: Sequence[Tensor],
    eligible: Sequence[Tensor | None],
    k: int,
    keys: KeySpec,
    out_dtypes: Sequence[torch.dtype],
    *,
    labels: Sequence[str] | None = None,
    n_eligible: int | None = None,
) -> list[Tensor]:
    """Keep masks that prune the ``k`` eligible units of lowest key across all sources.

    Exact and deterministic (tie rule in :mod:`tensorplay.ao.pruning.selection`); streams over
    the sources, never concatenates them; works on any device and past ``2**31`` units; changes
    no thread setting, and may be called from several threads at once.

    Args:
        scores: the sources' scores, any shapes, dtypes and devices.
        eligible: per source, its earlier mask (units equal to ``1`` are eligible) or ``None``
            (all eligible); same shape as the scores.
        k: how many eligible units to prune, ``0 <= k <= eligible units``.
        keys: how keys follow from scores (:class:`~.keys.AbsKeys`, :class:`~.keys.UniformKeys`).
        out_dtypes: the dtype of each returned mask.
        labels: names of the sources for error messages (default: ``source <index>``).
        n_eligible: the number of eligible units, if the caller has counted them already.

    Returns:
        Per source, a mask of the scores' shape and device: ``0`` for the ``k`` selected units,
        ``1`` everywhere else (units not eligible included).

    Raises:
        ValueError: if an eligible key is NaN or infinite (the message names the source), or
            ``k`` is out of range.

    Example:
        >>> from tensorplay.ao.pruning.selection import AbsKeys
        >>> masks = keep_masks(
        ...     [torch.tensor([0.5, -0.1, 2.0]), torch.tensor([[0.1, 3.0]])],
        ...     [None, None],
        ...     k=2,
        ...     keys=AbsKeys(),
        ...     out_dtypes=[torch.float32, torch.bool],
        ... )
        >>> masks[0], masks[1]
        (tensor([1., 0., 1.]), tensor([[False,  True]]))
    """
    selection = Selection(scores, eligible, keys, out_dtypes, labels)
    if n_eligible is None:
        n_eligible = count_eligible(selection.eligible, selection.sizes)
    if not 0 <= k <= n_eligible:
        raise ValueError(
            f"Expected `k` to be between 0 and the {n_eligible} eligible units, but got {k}."
        )
    outs = [
        torch.empty(s.shape, dtype=dtype, device=s.device)
        for s, dtype in zip(scores, selection.out_dtypes, strict=True)
    ]
    selection.threads = own_threads(selection.cpu_units)
    flat = [out.view(-1) for out in outs]
    run_on_own_thread(selection.threads, lambda: select_into(selection, k, n_eligible, flat))
    return outs


def select_into(selection: Selection, k: int, n_eligible: int, flat: list[Tensor]) -> None:
    """Write the keep masks of :func:`keep_masks` into the flat views ``flat``.

    The cut is :func:`~.cut.find_cut`'s; its band pass writes the speculative keep masks
    (``key >= lo``), so a band that brackets the ``k``-th key leaves only its candidates at or
    below the cut to clear.

    Args:
        selection: the selection.
        k: how many eligible units to prune (in range).
        n_eligible: the number of eligible units.
        flat: the flat keep masks, written in full.
    """
    if k in (0, n_eligible):  # nothing or everything eligible: no band to resolve
        fused_pass(selection, -math.inf if k == 0 else math.inf, -math.inf, flat, check=True)
        return
    cut = find_cut(selection, k, n_eligible, Speculative(flat))
    apply_cut(selection, cut, flat, factors=True)


def multiply_in_place(mask: Tensor, keep: Tensor) -> None:
    """``mask *= keep`` piece by piece, on the calling thread (no whole-tensor temporary).

    On the CPU each piece has torch's grain size, so each op runs on the calling thread alone
    without a thread to start (this memory-bound product gains nothing from more threads).

    Args:
        mask: the mask to update in place (any strides).
        keep: the keep factors, of ``mask``'s shape (any dtype, e.g. the ``uint8`` masks of
            :func:`keep_masks`).

    Example:
        >>> mask = torch.tensor([1.0, 1.0, 0.0])
        >>> multiply_in_place(mask, torch.tensor([0, 1, 1], dtype=torch.uint8))
        >>> mask
        tensor([0., 1., 0.])
    """
    if not mask.is_contiguous():  # no flat view: one multiply, element by element
        mask.mul_(keep.view(mask.shape))
        return
    step = chunk_size(mask.device)
    if mask.device.type == "cpu":
        step = min(step, tuning.TORCH_GRAIN)
    for part, factor in zip(
        torch.split(mask.view(-1), step), torch.split(keep.view(-1), step), strict=True
    ):
        part.mul_(factor)
