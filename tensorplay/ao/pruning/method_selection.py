"""Which units a pruning method prunes under one budget, on bool keep masks in place.

:func:`select_in_place` is the lean masks' selection: the units ``global_unstructured`` would
prune, cleared from the caller's bool masks (and zeroed in the weights) without building
reparametrized masks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from tensorplay.ao.pruning.base import BasePruningMethod
from tensorplay.ao.pruning.global_pruning import concatenated_masks, streaming_keys
from tensorplay.ao.pruning.masking.lean_masks import apply_masks
from tensorplay.ao.pruning.selection import (
    KeySpec,
    UniformKeys,
    clear_lowest,
    clear_lowest_capped,
    settle_caps,
)
from tensorplay.ao.pruning.sharded import Sharding, shared_seed

__all__ = ["select_in_place"]


def select_in_place(
    method: type[BasePruningMethod],
    count: int,
    scores: Sequence[Tensor],
    keep: Sequence[Tensor],
    labels: Sequence[str],
    caps: Sequence[int] | None = None,
    sharding: Sharding | None = None,
    zero: Sequence[Tensor] | None = None,
) -> None:
    """Clear ``count`` more units of the bool masks ``keep``, chosen by ``method`` over all
    sources together, as ``global_unstructured(..., amount=count)`` chooses them (the same
    units bit for bit, the same draw from the global RNG for random methods); with ``caps``, at
    most ``caps[i]`` from source ``i``. The tensors ``zero`` (the weights) are multiplied by
    the new masks, in the selection's own passes where it streams.

    L1 and random methods use the streaming selection; any other unstructured method gets the
    concatenated scores and its own ``compute_mask``, as in ``global_unstructured``.

    With a ``sharding`` of shards and a group (see :func:`~tensorplay.ao.pruning.sharded.
    sharding_of`), ``scores`` and ``keep`` are this rank's local pieces and ``count`` and
    ``caps`` are global: the ranks select together, exactly as one process would on the full
    tensors. Random methods then use rank zero's draw (broadcast); other methods than L1 and
    random need the full tensors and are refused before anything changes.

    Raises:
        ValueError: with a sharding, a method whose selection needs the full tensors.

    Example:
        >>> import torch
        >>> from tensorplay.ao.pruning import L1Unstructured
        >>> keep = [torch.ones(3, dtype=torch.bool)]
        >>> select_in_place(L1Unstructured, 2, [torch.tensor([0.5, -0.1, 0.2])], keep, ["w"])
        >>> keep[0].tolist()
        [True, False, False]
    """
    shards = None if sharding is None else sharding.shards
    group = None if sharding is None else sharding.group
    keys = _keys(method, [s.dtype for s in scores], group)
    if keys is None and shards is not None:
        raise ValueError(
            f"Expected a method with streaming keys (l1_unstructured, random_unstructured) for "
            f"the sharded tensors {list(labels)}, but got {method.__name__}: its compute_mask "
            "needs the full tensors, which no rank holds."
        )
    if keys is not None and caps is None:
        clear_lowest(
            scores, keep, count, keys, labels=labels, shards=shards, group=group, zero=zero
        )
        return
    if keys is not None:
        assert caps is not None  # for mypy
        clear_lowest_capped(
            scores, keep, count, keys, caps, labels=labels, shards=shards, group=group, zero=zero
        )
        return
    if caps is None:
        _clear_by_method(method, count, scores, keep, labels)
    else:

        def select(indices: list[int], k: int) -> list[Tensor]:
            trial = [keep[i].clone() for i in indices]
            picked = [scores[i] for i in indices]
            _clear_by_method(method, k, picked, trial, [labels[i] for i in indices])
            return [(t | ~keep[i]).to(torch.uint8) for t, i in zip(trial, indices, strict=True)]

        for index, kept in settle_caps(select, count, caps).items():
            keep[index].logical_and_(kept.bool())
    if zero is not None:
        apply_masks(zero, keep)


def _keys(
    method: type[BasePruningMethod], dtypes: list[torch.dtype], group: Any = None
) -> KeySpec | None:
    """``global_unstructured``'s keys for ``method`` (``streaming_keys``), with rank zero's
    random draw on every rank of ``group``."""
    keys = streaming_keys(method, dtypes)
    if isinstance(keys, UniformKeys):
        return UniformKeys(shared_seed(keys.seed, group))
    return keys


def _clear_by_method(
    method: type[BasePruningMethod],
    count: int,
    scores: Sequence[Tensor],
    keep: Sequence[Tensor],
    labels: Sequence[str],
) -> None:
    """The reference path: the method's ``compute_mask`` over the concatenated scores, ANDed in."""
    instance = method(amount=count)  # type: ignore[call-arg]
    parts = concatenated_masks(instance, scores, keep, labels, keep[0].device)
    for mask, part in zip(keep, parts, strict=True):
        mask.logical_and_(part.reshape(mask.shape).to(mask.device) != 0)
