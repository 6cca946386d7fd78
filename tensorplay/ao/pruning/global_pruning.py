"""``global_unstructured``: prune many tensors under one unstructured budget.

Behaves as :func:`torch.nn.utils.prune.global_unstructured` does (``amount`` counts the units
not yet pruned, pruned units stay pruned, the ``name_orig`` parameter, the ``name_mask`` buffer
in the parameter's dtype, a :class:`~tensorplay.ao.pruning.CustomFromMask` forward pre-hook that
a second pruning turns into a :class:`~tensorplay.ao.pruning.PruningContainer`), and differs
where torch is fragile:

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
  :class:`~tensorplay.ao.pruning.CustomFromMask` hooks hold that very buffer, so a pruned module
  holds exactly its mask and masked tensor however often it is pruned (torch's hook keeps a
  view of the whole concatenated mask of every call). Like any in-place update, do not prune
  between a forward and its backward pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.aliases import _unmasked_holders, _warn_unmasked_holders
from tensorplay.ao.pruning.amount import compute_nparams_to_prune, validate_pruning_amount
from tensorplay.ao.pruning.base import (
    BasePruningMethod,
    PruningContainer,
    PruningShapeError,
    _find_pruning_hook,
    _install,
)
from tensorplay.ao.pruning.methods import CustomFromMask, L1Unstructured, RandomUnstructured
from tensorplay.ao.pruning.selection import (
    AbsKeys,
    KeySpec,
    UniformKeys,
    check_finite_scores,
    count_eligible,
    keep_masks,
    multiply_in_place,
)

__all__ = ["global_unstructured"]

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
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    scores = {} if importance_scores is None else importance_scores
    if not isinstance(scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    targets = _targets(list(parameters), scores)
    method = pruning_method(**kwargs)
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(
            'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. '
            f"Found method {pruning_method} of type {method.PRUNING_TYPE}"
        )
    masks = _select(targets, method)
    plan = [(target.pairs, target.mask) for target in targets]
    del targets  # the parameters' reference counts then tell whether others hold them
    left = _unmasked_holders([pairs for pairs, mask in plan if mask is None])
    _apply(plan, masks)
    _warn_unmasked_holders(left)


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
        score = _check_scores(scores.get((module, name)), param, label)
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
    _, hook = _find_pruning_hook(module, name)
    if hook is not None:
        param = module._parameters.get(name + "_orig")
        mask = module._buffers.get(name + "_mask")
        if not isinstance(param, nn.Parameter) or mask is None:
            raise ValueError(
                f"Expected {label} to have the parameter {name}_orig and the buffer {name}_mask "
                "of its pruning hook, but one is missing."
            )
        return param, getattr(module, name), mask
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


def _check_scores(score: Any, param: Tensor, label: str) -> Tensor | None:
    if score is None:
        return None
    if not isinstance(score, Tensor):
        raise TypeError(
            f"Expected the importance scores of {label} to be a Tensor, but got "
            f"{type(score).__name__}."
        )
    if score.shape != param.shape:
        raise PruningShapeError(
            f"Expected the importance scores of {label} to have its shape "
            f"{tuple(param.shape)}, but got {tuple(score.shape)}."
        )
    return score


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


def _select(targets: list[_Target], method: BasePruningMethod) -> list[Tensor]:
    """Per target: its new mask (first pruning) or the keep factor of its mask (later)."""
    compute_mask = type(method).compute_mask
    keys: KeySpec | None = None
    if compute_mask is _L1_COMPUTE_MASK:
        keys = AbsKeys(_key_dtype([t.scores.dtype for t in targets]))
    elif compute_mask is _RANDOM_COMPUTE_MASK:
        # One draw from the global RNG, so torch.manual_seed makes the masks reproducible.
        keys = UniformKeys(int(torch.randint(0, 2**62, (1,)).item()))
    if keys is None:
        return _select_by_method(targets, method)
    scores = [t.scores.to(t.param.device) for t in targets]
    eligible = [t.mask for t in targets]
    n_eligible = count_eligible(
        [None if e is None else e.reshape(-1) for e in eligible], [s.numel() for s in scores]
    )
    amount = method.amount  # type: ignore[attr-defined]
    count = compute_nparams_to_prune(amount, n_eligible)
    validate_pruning_amount(count, n_eligible)
    out_dtypes = [t.param.dtype if t.mask is None else torch.uint8 for t in targets]
    labels = [t.label for t in targets]
    return keep_masks(
        scores, eligible, count, keys, out_dtypes, labels=labels, n_eligible=n_eligible
    )


def _key_dtype(dtypes: list[torch.dtype]) -> torch.dtype:
    """A float dtype that holds every score exactly: float32 unless one needs float64."""
    exact_in_float32 = {torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.uint8}
    exact_in_float32 |= {torch.int16, torch.bool}
    return torch.float32 if set(dtypes) <= exact_in_float32 else torch.float64


def _select_by_method(targets: list[_Target], method: BasePruningMethod) -> list[Tensor]:
    """The reference path (user-defined methods): concatenate, as torch does, and slice."""
    check_finite_scores(
        [t.scores for t in targets], [t.mask for t in targets], [t.label for t in targets]
    )
    scores = torch.cat([t.scores.detach().reshape(-1).to(targets[0].param.device) for t in targets])
    default_mask = torch.cat(
        [
            (torch.ones_like(t.param) if t.mask is None else t.mask)
            .detach()
            .reshape(-1)
            .to(device=scores.device, dtype=scores.dtype)
            for t in targets
        ]
    )
    method._tensor_name = "global"
    final = PruningContainer(method).compute_mask(scores, default_mask)
    masks = []
    for target, part in zip(
        targets, torch.split(final, [t.param.numel() for t in targets]), strict=True
    ):
        mask = part.reshape(target.param.shape).to(target.param.device, target.param.dtype)
        masks.append(mask.clone(memory_format=torch.contiguous_format))
    return masks


def _apply(plan: list[tuple[list[Pair], Tensor | None]], masks: list[Tensor]) -> None:
    """Install the masks, one per ``(pairs, mask so far)``; nothing here fails on checked input.

    The scores (possibly the old ``name`` tensors) were released with the targets, before any
    successor exists.
    """
    for index, (pairs, old) in enumerate(plan):
        mask, masks[index] = masks[index], _RELEASED
        if old is None:
            shared = mask
        else:
            shared = old
            if mask.dtype == torch.uint8:  # a keep factor (fast path)
                multiply_in_place(shared, mask)
            else:
                shared.copy_(mask)
        del mask
        _share_mask(pairs, shared)


def _share_mask(pairs: list[Pair], mask: Tensor) -> None:
    """Make ``mask`` the one ``name_mask`` buffer of every pair of one parameter.

    A pair not pruned yet is reparametrized with ``mask`` itself as its buffer (a
    :class:`~tensorplay.ao.pruning.CustomFromMask` hook holding it); a pair pruned before keeps
    its buffer, which gets ``mask``'s values, and its hook becomes a container. Nothing is
    checked: the caller checked the pairs and the mask's shape, dtype and device.
    """
    for module, name in pairs:
        own = module._buffers.get(name + "_mask")
        if own is not None and own is not mask:
            own.copy_(mask)  # a tied pair pruned on its own before: same values
        buffer = mask if own is None else own
        hook = CustomFromMask(buffer)
        hook._tensor_name = name
        old_key, old_method = _find_pruning_hook(module, name)
        _install(module, name, hook, buffer, old_key, old_method)
