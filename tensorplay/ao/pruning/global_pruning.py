"""``global_unstructured``: prune many tensors under one unstructured budget.

Behaves as :func:`torch.nn.utils.prune.global_unstructured` does (``amount`` counts the units
not yet pruned, pruned units stay pruned, the ``name_orig`` parameter, the ``name_mask`` buffer
in the parameter's dtype, a :class:`~tensorplay.ao.pruning.CustomFromMask` forward pre-hook, put
in a :class:`~tensorplay.ao.pruning.PruningContainer` after a per-tensor method's hook), and
differs where torch is fragile:

* any iterable of pairs works, a generator included;
* everything is checked before anything changes; errors name the ``(module, name)`` pair;
* the count is exact, and ties are broken by a documented rule (see
  :mod:`tensorplay.ao.pruning.selection`): among equal scores the unit of the pair listed first
  is pruned first, then the lower flat index;
* a tensor reached through several pairs (tied weights) counts once, and all its pairs share
  one mask buffer;
* tensors may live on different devices and have different dtypes (scores are compared in a
  dtype that holds them all exactly);
* :class:`~tensorplay.ao.pruning.L1Unstructured` and
  :class:`~tensorplay.ao.pruning.RandomUnstructured` never concatenate the scores (the streaming
  selection); any other unstructured method gets the concatenated scores, as in torch, and its
  own ``compute_mask`` decides;
* memory: a repeated call updates the ``name_mask`` buffer in place, and the
  :class:`~tensorplay.ao.pruning.CustomFromMask` hook reads the module's current buffer
  (:meth:`~tensorplay.ao.pruning.CustomFromMask.of_buffer`), so a pruned module holds exactly
  its mask and masked tensor however often it is pruned, and after ``.half()``, ``.to()`` or
  ``load_state_dict`` no earlier mask stays alive (torch's hook keeps a view of the whole
  concatenated mask of every call). Like any in-place update, do not prune between a forward and
  its backward pass;
* hook state is bounded: a tensor pruned globally again keeps its hook (its buffer holds the
  combined mask) instead of growing its :class:`~tensorplay.ao.pruning.PruningContainer` by
  one hook per call as torch does. Per-tensor methods (``l1_unstructured`` and the others)
  still append to the container exactly as torch does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.aliases import unmasked_holders, warn_unmasked_holders
from tensorplay.ao.pruning.amount import compute_nparams_to_prune, validate_pruning_amount
from tensorplay.ao.pruning.base import (
    BasePruningMethod,
    PruningContainer,
    chain_hooks,
    check_importance_scores,
    own_hook,
)
from tensorplay.ao.pruning.methods import CustomFromMask, L1Unstructured, RandomUnstructured
from tensorplay.ao.pruning.reparametrization import install, pruned_parts
from tensorplay.ao.pruning.selection import (
    AbsKeys,
    KeySpec,
    UniformKeys,
    capped_keep_masks,
    check_finite_scores,
    count_eligible,
    keep_masks,
    multiply_in_place,
    settle_caps,
)

__all__ = [
    "concatenated_masks",
    "global_unstructured",
    "has_streaming_keys",
    "prune_globally",
    "reads_buffer",
    "share_mask",
    "streaming_keys",
]

_RELEASED = torch.empty(0)
# The methods whose order the streaming selection reproduces. Taken at import, so a method
# patched later (``unittest.mock.patch.object(L1Unstructured, "compute_mask")``) or overridden
# in a subclass is honoured through the reference path instead.
_L1_COMPUTE_MASK = L1Unstructured.compute_mask
_RANDOM_COMPUTE_MASK = RandomUnstructured.compute_mask

Pair = tuple[nn.Module, str]


@dataclass
class _Target:
    """One tensor to prune and every pair that reaches it."""

    pairs: list[Pair]
    param: nn.Parameter
    scores: Tensor
    mask: Tensor | None
    labels: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.labels[0]


def global_unstructured(
    parameters: Iterable[tuple[nn.Module, str]],
    pruning_method: type[BasePruningMethod],
    importance_scores: dict[tuple[nn.Module, str], Tensor] | None = None,
    **kwargs: Any,
) -> None:
    """Prune the tensors of ``parameters`` jointly, under one unstructured budget.

    The importance scores of every listed tensor compete together: ``amount`` (a float in
    ``[0, 1]``: a fraction, or an int: a count, of the units not yet pruned over all tensors)
    units of lowest score are pruned, on top of earlier pruning. Each module then has the
    buffer ``name + '_mask'``, the parameter ``name + '_orig'`` and the attribute ``name``
    (``mask * orig``, recomputed before every forward), as with
    :func:`torch.nn.utils.prune.global_unstructured`. The module docstring lists where
    tensorplay is stricter or more general than torch.

    Args:
        parameters: ``(module, name)`` pairs naming parameters (or tensors pruned before); any
            iterable, a generator included.
        pruning_method: an unstructured pruning method class, e.g.
            :class:`~tensorplay.ao.pruning.L1Unstructured`.
        importance_scores: optional scores per pair, each of its parameter's shape; a pair
            without an entry is scored by its tensor ``getattr(module, name)``.
        **kwargs: arguments of ``pruning_method``, e.g. ``amount``.

    Raises:
        TypeError: if ``parameters`` is not iterable, ``importance_scores`` not a dict, an
            entry not an ``(nn.Module, str)`` pair, a pair names a tensor that is not a
            parameter, or the method's ``PRUNING_TYPE`` is not ``'unstructured'``.
        AttributeError: if a pair names nothing.
        ValueError: if ``parameters`` is empty or lists a pair twice, a score is NaN or
            infinite, tied pairs disagree, or an int ``amount`` exceeds the units not yet
            pruned (a :class:`~tensorplay.ao.pruning.PruningShapeError`, also an
            ``AssertionError``, if scores have the wrong shape).

    Example:
        >>> from tensorplay.ao.pruning import L1Unstructured
        >>> net = nn.Sequential(nn.Linear(10, 4), nn.Linear(4, 1))
        >>> global_unstructured(
        ...     ((net[0], "weight"), (net[1], "weight")), L1Unstructured, amount=10
        ... )
        >>> int((net[0].weight_mask == 0).sum() + (net[1].weight_mask == 0).sum())
        10
        >>> sorted(net[0].state_dict())
        ['bias', 'weight_mask', 'weight_orig']
    """
    prune_globally(parameters, pruning_method, importance_scores, kwargs)


def prune_globally(
    parameters: Iterable[tuple[nn.Module, str]],
    pruning_method: type[BasePruningMethod],
    importance_scores: dict[tuple[nn.Module, str], Tensor] | None,
    kwargs: dict[str, Any],
    caps: dict[tuple[nn.Module, str], int] | None = None,
) -> None:
    """:func:`global_unstructured`, optionally with per-tensor caps (``min_density``).

    Args:
        parameters: as in :func:`global_unstructured`.
        pruning_method: as in :func:`global_unstructured`.
        importance_scores: as in :func:`global_unstructured`.
        kwargs: the method's arguments, ``amount`` among them.
        caps: the most units each tensor may lose in this call, by one of its pairs (a tensor
            without an entry is not capped). The units are then taken lowest score first,
            skipping the units of a tensor at its cap (exact: see
            :mod:`tensorplay.ao.pruning.selection.capped`); ``amount`` must not exceed what
            the caps allow.

    Example:
        >>> from tensorplay.ao.pruning import L1Unstructured
        >>> small, large = nn.Linear(2, 1, bias=False), nn.Linear(4, 1, bias=False)
        >>> _ = small.weight.data.fill_(0.1), large.weight.data.fill_(1.0)  # small ranks first
        >>> pairs = [(small, "weight"), (large, "weight")]
        >>> prune_globally(pairs, L1Unstructured, None, {"amount": 3}, caps={pairs[0]: 1})
        >>> int((small.weight_mask == 0).sum()), int((large.weight_mask == 0).sum())
        (1, 2)
    """
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    scores = {} if importance_scores is None else importance_scores
    if not isinstance(scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    if not (isinstance(pruning_method, type) and issubclass(pruning_method, BasePruningMethod)):
        raise TypeError(
            "Expected `pruning_method` to be a BasePruningMethod subclass such as "
            f"L1Unstructured, but got {pruning_method!r} (a name becomes a class with "
            "tensorplay.ao.pruning.targets.resolve_method)."
        )
    targets = _targets(list(parameters), scores)
    method = pruning_method(**kwargs)
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. '
            f"Found method {pruning_method} of type {method.PRUNING_TYPE}"
        )
    if caps is None:
        masks, factors = _select(targets, method)
    else:
        masks, factors = _select_capped(targets, method, _target_caps(targets, caps)), True
    plan = [(target.pairs, target.mask) for target in targets]
    del targets  # the parameters' reference counts then tell whether others hold them
    left = unmasked_holders([pairs for pairs, mask in plan if mask is None])
    _apply(plan, masks, factors)
    warn_unmasked_holders(left)


def _targets(pairs: list[Any], scores: dict[Any, Any]) -> list[_Target]:
    """Check every pair and group the pairs by the tensor they reach (tied weights)."""
    if not pairs:
        raise ValueError(
            "Expected `parameters` to hold at least one (module, name) pair, but got none."
        )
    by_param: dict[int, _Target] = {}
    seen: dict[tuple[int, str], int] = {}
    for position, pair in enumerate(pairs):
        module, name = _check_pair(pair, position)
        label = f"({type(module).__name__}, {name!r})"
        if (id(module), name) in seen:
            raise ValueError(
                f"Expected each (module, name) pair once, but {label} is listed at positions "
                f"{seen[id(module), name]} and {position}."
            )
        seen[id(module), name] = position
        param, tensor, mask = _reparametrization(module, name, label)
        score = _check_scores(scores.get((module, name)), param, module, name)
        target = by_param.get(id(param))
        if target is None:
            by_param[id(param)] = _Target(
                [(module, name)], param, tensor if score is None else score, mask, [label]
            )
            continue
        _check_tie(target, mask, score, label)
        target.pairs.append((module, name))
        target.labels.append(label)
    return list(by_param.values())


def _check_pair(pair: Any, position: int) -> Pair:
    if not (
        isinstance(pair, tuple)
        and len(pair) == 2
        and isinstance(pair[0], nn.Module)
        and isinstance(pair[1], str)
    ):
        raise TypeError(
            "Expected each entry of `parameters` to be an (nn.Module, str) pair, but got "
            f"{pair!r} at position {position}."
        )
    return pair[0], pair[1]


def _reparametrization(
    module: nn.Module, name: str, label: str
) -> tuple[nn.Parameter, Tensor, Tensor | None]:
    """The parameter a pair reaches, its current tensor, and its mask if pruned before."""
    own_hook(module, name)  # a tensor pruned by torch.nn.utils.prune: say so
    parts = pruned_parts(module, name)
    if parts is not None:
        return parts.orig, getattr(module, name), parts.mask
    if not hasattr(module, name):
        raise AttributeError(
            f"Expected {label} to name a parameter, but {type(module).__name__} has no "
            f"attribute {name!r}."
        )
    param = module._parameters.get(name)
    if not isinstance(param, nn.Parameter):
        raise TypeError(
            f"Expected {label} to name a parameter, but it is "
            f"{type(getattr(module, name)).__name__}: only parameters can be pruned."
        )
    return param, param, None


def _check_scores(score: Any, param: Tensor, module: nn.Module, name: str) -> Tensor | None:
    if score is None:
        return None
    checked = check_importance_scores(score, param, module, name)
    if checked.device != param.device and checked.device.type == "meta":
        raise ValueError(
            f"Expected `importance_scores` for ({type(module).__name__}, {name!r}) to hold "
            f"values on a device they can be read from (its parameter is on {param.device}), "
            f"but got a tensor on {checked.device}."
        )
    return checked


def _check_tie(target: _Target, mask: Tensor | None, score: Tensor | None, label: str) -> None:
    """Pairs that reach one tensor must agree on its mask and its scores."""
    first = target.label
    if (mask is None) != (target.mask is None) or (
        mask is not None
        and target.mask is not None
        and mask is not target.mask
        and not torch.equal(mask, target.mask)
    ):
        raise ValueError(
            f"Expected {label} and {first}, which share one parameter, to share its pruning "
            "mask, but they have different masks (one may be unpruned)."
        )
    if score is not None and score is not target.scores:
        raise ValueError(
            f"Expected {label} and {first}, which share one parameter, to have one tensor of "
            "importance scores, but each has its own: give the scores for one of them."
        )


def _select(targets: list[_Target], method: BasePruningMethod) -> tuple[list[Tensor], bool]:
    """Per target: its new mask (first pruning) or, if the flag returned is true, the keep
    factor of its mask (pruned before: a ``bool`` tensor, ``False`` for the units pruned now)."""
    keys = _keys(targets, method)
    if keys is None:
        return _select_by_method(targets, method), False
    scores = [t.scores.to(t.param.device) for t in targets]
    eligible = [t.mask for t in targets]
    n_eligible = count_eligible(
        [None if e is None else e.reshape(-1) for e in eligible], [s.numel() for s in scores]
    )
    count = _count(method, n_eligible)
    # A tensor pruned before gets a bool keep factor: a float compare is written to bool
    # vectorised (about 6x faster than to uint8), and it is read back as bytes (_apply).
    out_dtypes = [t.param.dtype if t.mask is None else torch.bool for t in targets]
    labels = [t.label for t in targets]
    masks = keep_masks(
        scores, eligible, count, keys, out_dtypes, labels=labels, n_eligible=n_eligible
    )
    return masks, True


def _keys(targets: list[_Target], method: BasePruningMethod) -> KeySpec | None:
    """The keys the streaming selection orders units by, or None for other methods."""
    return streaming_keys(type(method), [t.scores.dtype for t in targets])


def has_streaming_keys(method: type[BasePruningMethod]) -> bool:
    """Whether the streaming selection orders ``method``'s units (L1 and random unstructured,
    as taken at import), rather than the method's own ``compute_mask``.

    Example:
        >>> from tensorplay.ao.pruning import L1Unstructured, LnStructured
        >>> has_streaming_keys(L1Unstructured), has_streaming_keys(LnStructured)
        (True, False)
    """
    return method.compute_mask in (_L1_COMPUTE_MASK, _RANDOM_COMPUTE_MASK)


def streaming_keys(
    method: type[BasePruningMethod], dtypes: Sequence[torch.dtype]
) -> KeySpec | None:
    """The keys the streaming selection orders ``method``'s units by, for scores of ``dtypes``;
    ``None`` where the method's own ``compute_mask`` decides (see :func:`has_streaming_keys`).

    A random method draws its seed once from the global RNG here, so ``torch.manual_seed``
    makes the masks reproducible.

    Example:
        >>> from tensorplay.ao.pruning import L1Unstructured, LnStructured
        >>> streaming_keys(L1Unstructured, [torch.bfloat16]).dtype
        torch.float32
        >>> streaming_keys(LnStructured, [torch.float32]) is None
        True
    """
    compute_mask = method.compute_mask
    if compute_mask is _L1_COMPUTE_MASK:
        return AbsKeys(_key_dtype(list(dtypes)))
    if compute_mask is _RANDOM_COMPUTE_MASK:
        return UniformKeys(int(torch.randint(0, 2**62, (1,)).item()))
    return None


def _count(method: BasePruningMethod, n_eligible: int) -> int:
    count = compute_nparams_to_prune(method.amount, n_eligible)  # type: ignore[attr-defined]
    validate_pruning_amount(count, n_eligible)
    return count


def _target_caps(targets: list[_Target], caps: dict[Pair, int]) -> list[int]:
    """Each target's cap, from any of its pairs; an uncapped target may lose all it has."""
    out = []
    for target in targets:
        given = [caps[pair] for pair in target.pairs if pair in caps]
        eligible = target.param.numel() if target.mask is None else int(target.mask.sum())
        out.append(min([eligible, *given]))
    return out


def _select_capped(
    targets: list[_Target], method: BasePruningMethod, caps: list[int]
) -> list[Tensor]:
    """:func:`_select` with at most ``caps[i]`` units from target ``i`` (greedy, exact)."""
    count = _count(method, sum(caps))
    keys = _keys(targets, method)
    if keys is not None:
        scores = [t.scores.to(t.param.device) for t in targets]
        keeps = capped_keep_masks(
            scores, [t.mask for t in targets], count, caps, keys, labels=[t.label for t in targets]
        )
    else:

        def select(indices: list[int], k: int) -> list[Tensor]:
            subset = [targets[i] for i in indices]
            masks = _select_by_method(subset, type(method)(amount=k))  # type: ignore[call-arg]
            return [
                (mask != 0).to(torch.uint8) if t.mask is None else (mask != 0) | (t.mask == 0)
                for t, mask in zip(subset, masks, strict=True)
            ]

        settled = settle_caps(select, count, caps)
        keeps = [
            settled[i].to(torch.uint8)
            if i in settled
            else torch.ones(t.param.shape, dtype=torch.uint8, device=t.param.device)
            for i, t in enumerate(targets)
        ]
    return [
        keep.to(t.param.dtype) if t.mask is None else keep
        for t, keep in zip(targets, keeps, strict=True)
    ]


def _key_dtype(dtypes: list[torch.dtype]) -> torch.dtype:
    """A float dtype that holds every score exactly: float32 unless one needs float64."""
    exact_in_float32 = {torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.uint8}
    exact_in_float32 |= {torch.int16, torch.bool}
    return torch.float32 if set(dtypes) <= exact_in_float32 else torch.float64


def _select_by_method(targets: list[_Target], method: BasePruningMethod) -> list[Tensor]:
    """The reference path (user-defined methods), each target's new mask in its own shape,
    device and dtype."""
    parts = concatenated_masks(
        method,
        [t.scores for t in targets],
        [t.mask for t in targets],
        [t.label for t in targets],
        targets[0].param.device,
    )
    masks = []
    for target, part in zip(targets, parts, strict=True):
        mask = part.reshape(target.param.shape).to(target.param.device, target.param.dtype)
        masks.append(mask.clone(memory_format=torch.contiguous_format))
    return masks


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


def _apply(
    plan: list[tuple[list[Pair], Tensor | None]], masks: list[Tensor], factors: bool
) -> None:
    """Install the masks, one per ``(pairs, mask so far)``; nothing here fails on checked input.

    With ``factors``, the mask of a tensor pruned before is a keep factor of its mask so far
    (multiplied in place); otherwise it is the new mask (copied in).

    The scores (possibly the old ``name`` tensors) were released with the targets, before any
    successor exists.
    """
    for index, (pairs, old) in enumerate(plan):
        mask, masks[index] = masks[index], _RELEASED
        if old is None:
            shared = mask
        else:
            shared = old
            if factors:
                multiply_in_place(shared, _as_bytes(mask, old))
            else:
                shared.copy_(mask)
        del mask
        share_mask(pairs, shared)


def _as_bytes(keep: Tensor, old: Tensor) -> Tensor:
    """A bool keep factor read as ``uint8`` where ``old`` is a float mask (a bool operand of a
    float multiply is not vectorised; its bytes are)."""
    if keep.dtype == torch.bool and old.is_floating_point():
        return keep.view(torch.uint8)
    return keep


def share_mask(pairs: Iterable[Pair], mask: Tensor) -> None:
    """Make ``mask`` the one ``name_mask`` buffer of every pair of one parameter.

    A pair not pruned yet is reparametrized with ``mask`` itself as its buffer and a
    :meth:`CustomFromMask.of_buffer <tensorplay.ao.pruning.CustomFromMask.of_buffer>` hook; a
    pair pruned before keeps its buffer, which gets ``mask``'s values. Its hook is kept as it is
    when it already reads the buffer (:func:`reads_buffer`: the hook state stays bounded however
    often the tensor is pruned globally); otherwise it becomes a container ending with such a
    hook. Nothing is checked: the caller checked the pairs and the mask's shape, dtype, device.

    Example:
        >>> layer = nn.Linear(2, 1, bias=False)
        >>> for _ in range(3):
        ...     share_mask([(layer, "weight")], torch.tensor([[1.0, 0.0]]))
        >>> hook = next(iter(layer._forward_pre_hooks.values()))
        >>> type(hook).__name__, layer.weight_mask
        ('CustomFromMask', tensor([[1., 0.]]))
    """
    for module, name in pairs:
        old_key, old_hook = own_hook(module, name)
        parts = pruned_parts(module, name)
        own = None if parts is None else parts.mask
        if own is not None and own is not mask:
            own.copy_(mask)  # pruned before: the buffer stays, its values change
        buffer = mask if own is None else own
        if old_hook is not None and reads_buffer(old_hook):
            setattr(module, name, old_hook.apply_mask(module))  # the hook already reads it
            continue
        hook = chain_hooks(old_hook, CustomFromMask.of_buffer(module, name))
        install(module, name, hook, buffer, old_key)


def reads_buffer(hook: BasePruningMethod) -> bool:
    """Whether ``hook`` (or the last method of a container) applies the module's current mask
    buffer as it is, so a new global pruning of its tensor needs no new hook.

    Example:
        >>> from tensorplay.ao.pruning import l1_unstructured
        >>> layer = l1_unstructured(nn.Linear(2, 2), "weight", amount=1)
        >>> reads_buffer(next(iter(layer._forward_pre_hooks.values())))
        False
    """
    last = hook[-1] if isinstance(hook, PruningContainer) and len(hook) else hook
    return isinstance(last, CustomFromMask) and last.reads_buffer
