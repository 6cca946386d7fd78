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
  still append to the container exactly as torch does;
* layer collapse is not silent: a call that prunes every unit of a tensor it did not find
  empty warns, naming the tensor and the fixes (:mod:`~tensorplay.ao.pruning.parity.collapse`);
  the masks are torch's all the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.pair import Pair
from tensorplay.ao.pruning.parity.aliases import unmasked_holders, warn_unmasked_holders
from tensorplay.ao.pruning.parity.amount import compute_nparams_to_prune, validate_pruning_amount
from tensorplay.ao.pruning.parity.base import (
    BasePruningMethod,
    PruningContainer,
    chain_hooks,
    check_importance_scores,
    own_hook,
)
from tensorplay.ao.pruning.parity.collapse import keeps_any, warn_emptied
from tensorplay.ao.pruning.parity.method_selection import Sources, select_units

# Moved to method_selection; still importable from here.
from tensorplay.ao.pruning.parity.method_selection import concatenated_masks as concatenated_masks
from tensorplay.ao.pruning.parity.method_selection import has_streaming_keys as has_streaming_keys
from tensorplay.ao.pruning.parity.method_selection import streaming_keys as streaming_keys
from tensorplay.ao.pruning.parity.methods import CustomFromMask
from tensorplay.ao.pruning.parity.reparametrization import install, pruned_parts
from tensorplay.ao.pruning.selection import (
    KeySpec,
    capped_keep_masks,
    clear_lowest,
    count_eligible,
    keep_masks,
    multiply_in_place,
)

__all__ = [
    "global_unstructured",
    "prune_globally",
    "reads_buffer",
    "share_mask",
]

_RELEASED = torch.empty(0)


@dataclass
class _Target:
    """One tensor to prune and every pair that reaches it."""

    pairs: list[Pair]
    param: nn.Parameter
    scores: Tensor
    mask: Tensor | None
    labels: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.labels[0]

    def described(self) -> tuple[str, str]:
        """The tensor as the caller finds it: its first pair's module (with the module's
        ``extra_repr``) and name, and where its pairs are in ``parameters``."""
        module, name = self.pairs[0]
        positions = " and ".join(str(p) for p in self.positions)
        plural = "s" if len(self.positions) > 1 else ""
        return (
            f"({type(module).__name__}({module.extra_repr()}), {name!r})",
            f"the pair{plural} at position{plural} {positions} of `parameters`",
        )


def global_unstructured(
    parameters: Iterable[Pair],
    pruning_method: type[BasePruningMethod],
    importance_scores: dict[Pair, Tensor] | None = None,
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

    Ranking every tensor together can prune a small layer away (all its weights rank low): the
    masks are torch's all the same, but the call warns (a ``UserWarning`` pointing at your line)
    for each tensor it left with no unit, naming it and the fixes.

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

    Warns:
        UserWarning: for each tensor that kept a unit before the call and none after it
            (layer collapse).

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
    prune_globally(parameters, pruning_method, importance_scores, kwargs, warn_collapse=True)


def prune_globally(
    parameters: Iterable[Pair],
    pruning_method: type[BasePruningMethod],
    importance_scores: dict[Pair, Tensor] | None,
    kwargs: dict[str, Any],
    caps: dict[Pair, int] | None = None,
    warn_collapse: bool = False,
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
        warn_collapse: warn, as :func:`global_unstructured` does, for each tensor the call
            empties (the pruner's global scope passes ``False``: it warns once per target
            itself).

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
    for mask in [target.mask for target in targets if target.mask is not None]:
        changes.keep_values(mask)  # written in place from here on
    # The tensors that keep a unit now, and so may be emptied by this call.
    watched = [
        (index, target.described(), target.param.numel())
        for index, target in enumerate(targets)
        if warn_collapse and (target.mask is None or keeps_any(target.mask))
    ]
    masks, factors = _select(targets, method, caps)
    plan = [(target.pairs, target.mask) for target in targets]
    del targets  # the parameters' reference counts then tell whether others hold them
    left = unmasked_holders([pairs for pairs, mask in plan if mask is None])
    installed = _apply(plan, masks, factors)
    warn_unmasked_holders(left)
    for index, (name, where), numel in watched:
        if not keeps_any(installed[index]):
            warn_emptied("global_unstructured", name, numel, _CALL_FIX, where=where)


_CALL_FIX = (
    "Prune less (a smaller `amount`), leave this pair out of `parameters` (and prune it on its "
    "own, with l1_unstructured say), or prune with a Pruner, whose min_density=0.05 (say) keeps "
    "a share of every tensor and keep_dense=['last'] leaves the last layer dense."
)


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
                [(module, name)],
                param,
                tensor if score is None else score,
                mask,
                [label],
                [position],
            )
            continue
        _check_tie(target, mask, score, label)
        target.pairs.append((module, name))
        target.labels.append(label)
        target.positions.append(position)
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


def _select(
    targets: list[_Target], method: BasePruningMethod, caps: dict[Pair, int] | None
) -> tuple[list[Tensor], bool]:
    """The masks of :class:`_Masks`, as :func:`~.method_selection.select_units` decides."""
    limits = None if caps is None else _target_caps(targets, caps)
    count = None if limits is None else _count(method, sum(limits))
    sources = Sources(
        [t.scores for t in targets],
        [t.mask for t in targets],
        [t.label for t in targets],
        [t.param.device for t in targets],
    )
    selector = _Masks(targets, method, count)
    return select_units(type(method), count, sources, selector, limits, instance=method)


class _Masks:
    """``global_unstructured``'s selector: per target, its new mask (first pruning) or, if the
    flag returned is true, the keep factor of its mask (pruned before: a ``bool`` tensor,
    ``False`` for the units pruned now)."""

    def __init__(
        self, targets: list[_Target], method: BasePruningMethod, count: int | None
    ) -> None:
        self.targets, self.method, self.count = targets, method, count

    def stream(self, keys: KeySpec, caps: list[int] | None) -> tuple[list[Tensor], bool]:
        targets = self.targets
        scores = [t.scores.to(t.param.device) for t in targets]
        eligible = [t.mask for t in targets]
        labels = [t.label for t in targets]
        if caps is not None:
            assert self.count is not None  # counted under the caps by prune_globally
            keeps = capped_keep_masks(scores, eligible, self.count, caps, keys, labels=labels)
            return [
                keep.to(t.param.dtype) if t.mask is None else keep
                for t, keep in zip(targets, keeps, strict=True)
            ], True
        n_eligible = count_eligible(
            [None if e is None else e.reshape(-1) for e in eligible], [s.numel() for s in scores]
        )
        count = _count(self.method, n_eligible)
        if any(e is not None for e in eligible) and all(
            e is None or e.is_contiguous() for e in eligible
        ):
            # Pruned before: the masks are cleared in place, as the lean masks are (no keep
            # factor, no pass multiplying it in); a tensor pruned now for the first time
            # starts from all ones.
            masks = [
                torch.ones_like(t.param, memory_format=torch.contiguous_format).detach()
                if t.mask is None
                else t.mask
                for t in targets
            ]
            clear_lowest(scores, masks, count, keys, labels=labels, n_eligible=n_eligible)
            return masks, False
        # A tensor pruned before gets a bool keep factor: a float compare is written to bool
        # vectorised (about 6x faster than to uint8), and it is read back as bytes (_apply).
        out_dtypes = [t.param.dtype if t.mask is None else torch.bool for t in targets]
        masks = keep_masks(
            scores, eligible, count, keys, out_dtypes, labels=labels, n_eligible=n_eligible
        )
        return masks, True

    def apply(self, masks: dict[int, Tensor]) -> tuple[list[Tensor], bool]:
        out = []
        for index, target in enumerate(self.targets):
            param = target.param
            part = masks.get(index)
            if part is None:  # capped out: its mask stays
                kept = torch.ones(param.shape, dtype=param.dtype, device=param.device)
                out.append(kept if target.mask is None else target.mask)
                continue
            mask = part.reshape(param.shape).to(param.device, param.dtype)
            out.append(mask.clone(memory_format=torch.contiguous_format))
        return out, False


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


def _apply(
    plan: list[tuple[list[Pair], Tensor | None]], masks: list[Tensor], factors: bool
) -> list[Tensor]:
    """Install the masks, one per ``(pairs, mask so far)``; nothing here fails on checked input.

    With ``factors``, the mask of a tensor pruned before is a keep factor of its mask so far
    (multiplied in place); otherwise it is the new mask (copied in).

    The scores (possibly the old ``name`` tensors) were released with the targets, before any
    successor exists.

    Returns:
        The ``name_mask`` buffer each entry of ``plan`` holds now.
    """
    installed = []
    for index, (pairs, old) in enumerate(plan):
        mask, masks[index] = masks[index], _RELEASED
        if old is None:
            shared = mask
        else:
            shared = old
            if factors:
                multiply_in_place(shared, _as_bytes(mask, old))
            elif mask is not old:  # cleared in place: nothing to copy
                shared.copy_(mask)
        del mask
        share_mask(pairs, shared)
        installed.append(shared)
    return installed


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
            changes.keep_values(own)
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
