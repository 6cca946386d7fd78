"""Which units a pruning method prunes under one budget: the one place that decides how.

Every global selection, ``global_unstructured``'s masks and the lean masks alike, goes through
:func:`select_units`, which decides once:

* **streaming or reference**: a method whose ``compute_mask`` is in :data:`STREAMING` (L1 and
  random unstructured, as taken at import, so a method patched later or overridden in a subclass
  is honoured through the reference path) is selected by the streaming selection
  (:mod:`tensorplay.ao.pruning.selection`) with that method's keys; any other unstructured
  method gets the concatenated scores and its own ``compute_mask``, as in torch
  (:func:`reference_masks`);
* **capped or not**: with per-source caps (``min_density``) the streaming selection's capped
  variant runs, and the reference path settles the caps with the method itself
  (:func:`~tensorplay.ao.pruning.selection.settle_caps`).

The caller says what the selection writes (a :class:`Selector`): new float masks and keep
factors (:func:`~tensorplay.ao.pruning.parity.global_unstructured.prune_globally`), or bits cleared
in bool keep masks with the weights zeroed (:func:`select_in_place`, the lean masks).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
from torch import Tensor

from tensorplay.ao.pruning.parity.base import BasePruningMethod, PruningContainer
from tensorplay.ao.pruning.parity.methods import L1Unstructured, RandomUnstructured
from tensorplay.ao.pruning.selection import (
    AbsKeys,
    KeySpec,
    UniformKeys,
    check_finite_scores,
    clear_lowest,
    clear_lowest_capped,
    settle_caps,
)
from tensorplay.ao.pruning.selection.shards import Sharding, shared_seed

__all__ = [
    "counts_itself",
    "STREAMING",
    "Selector",
    "Sources",
    "StreamingMethod",
    "concatenated_masks",
    "has_streaming_keys",
    "reference_masks",
    "select_in_place",
    "select_units",
    "streaming_keys",
]

R = TypeVar("R", covariant=True)


def counts_itself(method: type[BasePruningMethod]) -> bool:
    """Whether ``method`` decides how many units it prunes: its constructor takes no ``amount``.

    Such a method (an N:M method, say) is applied to each target on its own on the schedule's
    pruning steps; the schedule then says *when* to prune and the method *how much*.

    Example:
        >>> from tensorplay.ao.pruning.parity.methods import L1Unstructured
        >>> class TwoOfFour(BasePruningMethod):
        ...     PRUNING_TYPE = "unstructured"
        ...     def compute_mask(self, t, default_mask):
        ...         return default_mask
        >>> counts_itself(L1Unstructured), counts_itself(TwoOfFour)
        (False, True)
    """
    params = inspect.signature(method).parameters.values()
    return not any(p.name == "amount" or p.kind is p.VAR_KEYWORD for p in params)


def _key_dtype(dtypes: Sequence[torch.dtype]) -> torch.dtype:
    """A float dtype that holds every score exactly: float32 unless one needs float64."""
    exact_in_float32 = {torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.uint8}
    exact_in_float32 |= {torch.int16, torch.bool}
    return torch.float32 if set(dtypes) <= exact_in_float32 else torch.float64


def _random_keys(dtypes: Sequence[torch.dtype]) -> KeySpec:
    """Uniform keys, their seed drawn once from the global RNG (``torch.manual_seed`` holds)."""
    del dtypes
    return UniformKeys(int(torch.randint(0, 2**62, (1,)).item()))


@dataclass(frozen=True)
class StreamingMethod:
    """A method the streaming selection reproduces.

    Attributes:
        name: its functional name, for messages.
        keys: its keys for scores of the given dtypes.
    """

    name: str
    keys: Callable[[Sequence[torch.dtype]], KeySpec]


#: The methods the streaming selection reproduces, by their ``compute_mask`` as taken at import.
STREAMING: dict[Callable[..., Any], StreamingMethod] = {
    L1Unstructured.compute_mask: StreamingMethod(
        "l1_unstructured", lambda dtypes: AbsKeys(_key_dtype(dtypes))
    ),
    RandomUnstructured.compute_mask: StreamingMethod("random_unstructured", _random_keys),
}


def has_streaming_keys(method: type[BasePruningMethod]) -> bool:
    """Whether the streaming selection orders ``method``'s units (see :data:`STREAMING`),
    rather than the method's own ``compute_mask``.

    Example:
        >>> from tensorplay.ao.pruning import L1Unstructured, LnStructured
        >>> has_streaming_keys(L1Unstructured), has_streaming_keys(LnStructured)
        (True, False)
    """
    return method.compute_mask in STREAMING


def streaming_keys(
    method: type[BasePruningMethod], dtypes: Sequence[torch.dtype], group: Any = None
) -> KeySpec | None:
    """The keys the streaming selection orders ``method``'s units by, for scores of ``dtypes``;
    ``None`` where the method's own ``compute_mask`` decides (see :func:`has_streaming_keys`).

    A random method draws its seed once from the global RNG here, so ``torch.manual_seed``
    makes the masks reproducible; with a process ``group``, every rank gets rank zero's draw.

    Example:
        >>> from tensorplay.ao.pruning import L1Unstructured, LnStructured
        >>> streaming_keys(L1Unstructured, [torch.bfloat16]).dtype
        torch.float32
        >>> streaming_keys(LnStructured, [torch.float32]) is None
        True
    """
    streaming = STREAMING.get(method.compute_mask)
    if streaming is None:
        return None
    keys = streaming.keys(dtypes)
    if isinstance(keys, UniformKeys) and group is not None:
        return UniformKeys(shared_seed(keys.seed, group))
    return keys


@dataclass(frozen=True)
class Sources:
    """The sources of one global selection.

    Attributes:
        scores: per source, its scores.
        masks: per source, its earlier mask (``0`` or ``False``: pruned) or ``None``.
        labels: per source, its name for messages.
        devices: per source, where the reference path concatenates a selection that starts
            with it.

    Example:
        >>> sources = Sources([torch.ones(2)], [None], ["w"], [torch.device("cpu")])
        >>> sources.labels
        ['w']
    """

    scores: Sequence[Tensor]
    masks: Sequence[Tensor | None]
    labels: Sequence[str]
    devices: Sequence[torch.device]


class Selector(Protocol[R]):
    """What a caller's selection writes, for either path :func:`select_units` takes."""

    def stream(self, keys: KeySpec, caps: list[int] | None) -> R:
        """Run the streaming selection with ``keys`` (under ``caps``, if given)."""
        ...

    def apply(self, masks: dict[int, Tensor]) -> R:
        """Apply the reference path's new masks (flat, by source; a source absent is kept)."""
        ...


def select_units(
    method: type[BasePruningMethod],
    count: int | None,
    sources: Sources,
    selector: Selector[R],
    caps: Sequence[int] | None = None,
    *,
    instance: BasePruningMethod | None = None,
    group: Any = None,
    sharded: bool = False,
) -> R:
    """Select with ``method`` over all ``sources`` together: the streaming selection or the
    method's own ``compute_mask``, capped or not (the module docstring).

    Args:
        method: the method's class.
        count: how many units to select; ``None``: ``instance``'s amount (the selector counts).
        sources: the sources.
        selector: what the selection writes.
        caps: per source, the most units it may give, or ``None``.
        instance: what the reference path applies without caps (default:
            ``method(amount=count)``).
        group: the process group of sharded sources (random keys: rank zero's draw).
        sharded: whether the sources are this rank's pieces of sharded tensors.

    Returns:
        What ``selector`` returns.

    Raises:
        ValueError: ``sharded``, and a method whose selection needs the full tensors.

    Example:
        >>> from tensorplay.ao.pruning import L1Unstructured
        >>> class Print:
        ...     def stream(self, keys, caps):
        ...         return type(keys).__name__
        ...     def apply(self, masks):
        ...         return masks
        >>> sources = Sources([torch.tensor([0.5, 0.1])], [None], ["w"], [torch.device("cpu")])
        >>> select_units(L1Unstructured, 1, sources, Print())
        'AbsKeys'
    """
    keys = streaming_keys(method, [s.dtype for s in sources.scores], group)
    if keys is not None:
        return selector.stream(keys, None if caps is None else list(caps))
    if sharded:
        names = ", ".join(streaming.name for streaming in STREAMING.values())
        raise ValueError(
            f"Expected a method with streaming keys ({names}) for the sharded tensors "
            f"{list(sources.labels)}, but got {method.__name__}: its compute_mask needs "
            "the full tensors, which no rank holds."
        )
    return selector.apply(reference_masks(method, count, sources, caps, instance))


def reference_masks(
    method: type[BasePruningMethod],
    count: int | None,
    sources: Sources,
    caps: Sequence[int] | None = None,
    instance: BasePruningMethod | None = None,
) -> dict[int, Tensor]:
    """The reference path: the method over the concatenated scores; with ``caps``, the greedy
    capped result, each round ``method(amount=k)`` for the ``k`` units it selects.

    Args:
        method: the method's class.
        count: how many units to select (needed with ``caps``).
        sources: the sources.
        caps: per source, the most units it may give, or ``None``.
        instance: what is applied without caps (default: ``method(amount=count)``).

    Returns:
        Per source whose mask may change, its new mask, flat, in its scores' dtype.

    Example:
        >>> from tensorplay.ao.pruning import L1Unstructured
        >>> scores = [torch.tensor([0.1, 0.2]), torch.tensor([0.3])]
        >>> sources = Sources(scores, [None, None], ["a", "b"], [torch.device("cpu")] * 2)
        >>> masks = reference_masks(L1Unstructured, 2, sources, caps=[1, 1])
        >>> {i: mask.tolist() for i, mask in masks.items()}
        {0: [0.0, 1.0], 1: [0.0]}
    """
    everything = list(range(len(sources.scores)))
    if caps is None:
        if instance is None:
            instance = method(amount=count)  # type: ignore[call-arg]
        return dict(zip(everything, _by_method(instance, sources, everything), strict=True))
    if count is None:
        raise ValueError("Expected the `count` a capped selection takes, but got None.")

    def select(indices: list[int], k: int) -> list[tuple[Tensor, int]]:
        masks = _by_method(method(amount=k), sources, indices)  # type: ignore[call-arg]
        olds = [sources.masks[i] for i in indices]
        return [(mask, _pruned_now(mask, old)) for mask, old in zip(masks, olds, strict=True)]

    settled = settle_caps(select, count, caps, given=lambda result: result[1])
    return {i: mask for i, (mask, _) in settled.items()}


def _by_method(method: BasePruningMethod, sources: Sources, indices: list[int]) -> list[Tensor]:
    """The new masks of the sources ``indices``, from ``method`` over their scores."""
    return concatenated_masks(
        method,
        [sources.scores[i] for i in indices],
        [sources.masks[i] for i in indices],
        [sources.labels[i] for i in indices],
        sources.devices[indices[0]],
    )


def _pruned_now(mask: Tensor, old: Tensor | None) -> int:
    """The units ``mask`` prunes that ``old`` kept (``old`` zeros stay zeros)."""
    before = 0 if old is None else int(torch.count_nonzero(old.reshape(-1) == 0))
    return int(torch.count_nonzero(mask == 0)) - before


def concatenated_masks(
    method: BasePruningMethod,
    scores: Sequence[Tensor],
    masks: Sequence[Tensor | None],
    labels: Sequence[str],
    device: torch.device,
) -> list[Tensor]:
    """The reference path for methods the streaming selection does not reproduce: concatenate
    the scores on ``device``, as torch does, apply ``method`` over them with the earlier masks
    (``None``: all ones), and split the result.

    Args:
        method: the method instance (its ``amount`` counts across all sources).
        scores: per source, its scores.
        masks: per source, its earlier mask or ``None``.
        labels: per source, its name for errors.
        device: where the scores are concatenated.

    Returns:
        Per source, its new mask, flat, in the scores' dtype, on ``device``.

    Raises:
        ValueError: an eligible score is NaN or infinite (the message names the source).

    Example:
        >>> from tensorplay.ao.pruning import L1Unstructured
        >>> parts = concatenated_masks(
        ...     L1Unstructured(amount=2),
        ...     [torch.tensor([0.5, -0.1]), torch.tensor([0.2])],
        ...     [None, None],
        ...     ["a", "b"],
        ...     torch.device("cpu"),
        ... )
        >>> [part.tolist() for part in parts]
        [[1.0, 0.0], [0.0]]
    """
    check_finite_scores(list(scores), list(masks), list(labels))
    flat = torch.cat([s.detach().reshape(-1).to(device) for s in scores])
    default_mask = torch.cat(
        [
            torch.ones(s.numel(), device=device, dtype=flat.dtype)
            if m is None
            else m.detach().reshape(-1).to(device=device, dtype=flat.dtype)
            for s, m in zip(scores, masks, strict=True)
        ]
    )
    method._tensor_name = "global"
    final = PruningContainer(method).compute_mask(flat, default_mask)
    return list(torch.split(final, [s.numel() for s in scores]))


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

    With a ``sharding`` of shards and a group (see
    :func:`~tensorplay.ao.pruning.selection.shards.sharding_of`), ``scores`` and ``keep`` are this
    rank's local pieces and ``count`` and ``caps`` are global: the ranks select together, exactly as
    one process would on the full tensors. Random methods then use rank zero's draw (broadcast);
    methods the streaming selection does not reproduce need the full tensors and are refused before
    anything changes. With a group and no shards (``Sharding(None, group)``), every rank holds
    the same whole sources (structured units' scores under FSDP2): each selects on its own,
    random methods with rank zero's draw, so every rank clears the same units.

    Raises:
        ValueError: with a sharding, a method whose selection needs the full tensors.

    Example:
        >>> from tensorplay.ao.pruning import L1Unstructured
        >>> keep = [torch.ones(3, dtype=torch.bool)]
        >>> select_in_place(L1Unstructured, 2, [torch.tensor([0.5, -0.1, 0.2])], keep, ["w"])
        >>> keep[0].tolist()
        [True, False, False]
    """
    shards = None if sharding is None else sharding.shards
    group = None if sharding is None else sharding.group
    sources = Sources(scores, keep, labels, [mask.device for mask in keep])
    counted = None if shards is None else group  # whole sources: no counts to sum over ranks
    selector = _InPlace(count, sources, keep, shards, counted, zero)
    select_units(method, count, sources, selector, caps, group=group, sharded=shards is not None)


class _InPlace:
    """The lean masks' selector: bits cleared in the bool masks, the weights zeroed."""

    def __init__(
        self,
        count: int,
        sources: Sources,
        keep: Sequence[Tensor],
        shards: Any,
        group: Any,
        zero: Sequence[Tensor] | None,
    ) -> None:
        self.count, self.sources, self.keep = count, sources, keep
        self.shards, self.group, self.zero = shards, group, zero

    def stream(self, keys: KeySpec, caps: list[int] | None) -> None:
        options: dict[str, Any] = {"shards": self.shards, "group": self.group, "zero": self.zero}
        scores, labels = self.sources.scores, self.sources.labels
        if caps is None:
            clear_lowest(scores, self.keep, self.count, keys, labels=labels, **options)
        else:
            clear_lowest_capped(scores, self.keep, self.count, keys, caps, labels=labels, **options)

    def apply(self, masks: dict[int, Tensor]) -> None:
        for index, part in masks.items():
            mask = self.keep[index]
            mask.logical_and_(part.reshape(mask.shape).to(mask.device) != 0)
        if self.zero is not None:  # the weights' local pieces, as the streaming path zeroes them
            with torch.no_grad():
                for values, keep in zip(self.zero, self.keep, strict=True):
                    values.mul_(keep)
