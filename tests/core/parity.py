"""The reference harness: tensorplay against ``torch.nn.utils.prune`` on deep copies of one module.

:class:`Twins` holds two deep copies of one module, made before any pruning: ``ours`` is pruned by
``tensorplay.ao.pruning``, ``theirs`` by ``torch.nn.utils.prune``, call for call, with the same
seed before each call. After every call it compares the masks, the ``_orig`` values, the dtypes,
the forward pre-hooks (``PruningContainer`` lengths and member types), the state_dict keys in order
and, when asked, the forward outputs.

Masks must be identical, except where tied scores make torch's choice arbitrary (``topk`` is free
to pick any of the tied units; a half-precision random draw ties too). There both libraries must
prune exactly the count asked, torch must prune no unit (or channel) scored above one it keeps,
and tensorplay must match :func:`reference_mask`: a stable sort of the scores, so the lowest index
goes first among ties.

Import it from a test module in this folder (pytest puts the folder on ``sys.path``)::

    from parity import Call, Twins, run_parity
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

import tensorplay.ao.pruning as tp_prune

__all__ = [
    "CLASS_OF",
    "Call",
    "LIBRARIES",
    "Twins",
    "assert_same_reparametrization",
    "hook_signature",
    "reference_mask",
    "run_parity",
    "seed_cpu",
    "count_to_prune",
]

LIBRARIES: dict[str, ModuleType] = {"tensorplay": tp_prune, "torch": torch_prune}

CLASS_OF = {
    "identity": "Identity",
    "random_unstructured": "RandomUnstructured",
    "l1_unstructured": "L1Unstructured",
    "random_structured": "RandomStructured",
    "ln_structured": "LnStructured",
    "custom_from_mask": "CustomFromMask",
}
STRUCTURED = ("random_structured", "ln_structured")
DETERMINISTIC = ("l1_unstructured", "ln_structured")


@dataclass(frozen=True)
class Call:
    """One pruning call, made the same way in both libraries.

    Args:
        method: the functional form's name, e.g. ``"l1_unstructured"``.
        name: the tensor to prune.
        kwargs: the keyword arguments (``amount``, ``n``, ``dim``, ``mask``, ...).
        form: ``"function"`` calls ``lib.<method>``, ``"class"`` calls ``lib.<Class>.apply``.
        target: a dotted submodule path inside the twins (``""``: the module itself).
    """

    method: str
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    form: str = "function"
    target: str = ""

    def __call__(self, lib: ModuleType, module: nn.Module) -> None:
        """Make the call with ``lib`` on ``module``'s target."""
        owner = module.get_submodule(self.target)
        if self.form == "function":
            getattr(lib, self.method)(owner, self.name, **self.kwargs)
        else:
            getattr(lib, CLASS_OF[self.method]).apply(owner, self.name, **self.kwargs)

    def __repr__(self) -> str:
        shown = {
            k: (tuple(v.shape) if isinstance(v, Tensor) else v) for k, v in self.kwargs.items()
        }
        return f"{self.form}:{self.method}({self.target or '.'}.{self.name}, {shown})"


class Twins:
    """Two deep copies of one module, pruned by tensorplay (``ours``) and torch (``theirs``)."""

    def __init__(self, module: nn.Module) -> None:
        self.ours = copy.deepcopy(module)
        self.theirs = copy.deepcopy(module)
        self.calls: list[Call] = []
        self.diverged = False  # tied scores led the two libraries to different masks

    def available(self, name: str, dim: int | None = None, target: str = "") -> int:
        """Units (``dim=None``) or channels along ``dim`` still unpruned, the fewer of the two."""
        return min(
            _available(_mask_of(m.get_submodule(target), name), dim)
            for m in (self.ours, self.theirs)
        )

    def masks_equal(self) -> bool:
        """Whether every mask of ``ours`` equals the one of ``theirs``, value and dtype."""
        ours, theirs = _masks(self.ours), _masks(self.theirs)
        return list(ours) == list(theirs) and all(
            ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]) for k in ours
        )

    def apply(self, call: Call, seed: int = 0) -> None:
        """Make ``call`` on both twins from the same seed and compare the results."""
        before = [_step_state(m, call) for m in (self.ours, self.theirs)]
        for lib, module in ((tp_prune, self.ours), (torch_prune, self.theirs)):
            seed_cpu(seed)
            call(lib, module)
        self.calls.append(call)
        after = [
            _mask_of(m.get_submodule(call.target), call.name) for m in (self.ours, self.theirs)
        ]
        _compare_step(call, before, after, self.calls)
        self.diverged = self.diverged or not self.masks_equal()
        assert_same_reparametrization(self.ours, self.theirs, values=not self.diverged)

    def remove(self, name: str, target: str = "") -> None:
        """Make the pruning of ``name`` permanent in both twins and compare."""
        tp_prune.remove(self.ours.get_submodule(target), name)
        torch_prune.remove(self.theirs.get_submodule(target), name)
        assert_same_reparametrization(self.ours, self.theirs, values=not self.diverged)

    def check_forward(self, *inputs: Tensor) -> None:
        """Outputs bitwise equal unless ties diverged the masks; ``name == mask * orig`` always."""
        out_ours, out_theirs = self.ours(*inputs), self.theirs(*inputs)
        if not self.diverged:
            _assert_outputs_equal(out_ours, out_theirs)
        for module in (self.ours, self.theirs):
            for owner, name in _pruned_pairs(module):
                expected = getattr(owner, name + "_mask").to(
                    getattr(owner, name + "_orig").dtype
                ) * getattr(owner, name + "_orig")
                assert torch.equal(getattr(owner, name), expected), (owner, name)


def seed_cpu(seed: int) -> None:
    """Seed the CPU generator that the random methods draw from.

    Cheaper than ``torch.manual_seed``, which also queues a lazy CUDA seeding that records a
    stack trace on every call.
    """
    torch.default_generator.manual_seed(seed)


def run_parity(
    module: nn.Module, calls: Iterable[Call], *, seed: int = 0, inputs: Sequence[Tensor] = ()
) -> Twins:
    """Prune deep copies of ``module`` with both libraries, ``calls`` in order, and compare.

    Args:
        module: the module to copy (left untouched).
        calls: the pruning calls, in order.
        seed: the seed set before call ``i`` is ``seed + i``, the same in both libraries.
        inputs: forward inputs; when given, the outputs are compared after the last call.

    Returns:
        The twins, for further checks.
    """
    twins = Twins(module)
    for i, call in enumerate(calls):
        twins.apply(call, seed=seed + i)
    if inputs:
        twins.check_forward(*inputs)
    return twins


def hook_signature(module: nn.Module) -> list[tuple[str, str, tuple[str, ...]]]:
    """The pruning hooks of ``module`` in order: (type name, tensor name, member type names)."""
    signature = []
    for hook in module._forward_pre_hooks.values():
        if not isinstance(hook, (tp_prune.BasePruningMethod, torch_prune.BasePruningMethod)):
            continue
        members: tuple[str, ...] = ()
        if type(hook).__name__ == "PruningContainer":
            members = tuple(type(m).__name__ for m in hook)
            assert len(hook) == len(members)
        signature.append((type(hook).__name__, hook._tensor_name, members))
    return signature


def bounded(
    signature: list[tuple[str, str, tuple[str, ...]]],
) -> list[tuple[str, str, tuple[str, ...]]]:
    """Torch's hook signature as tensorplay's global pruning leaves it: repeated global calls
    keep one ``CustomFromMask`` (its buffer holds the combined mask) where torch appends one per
    call, so a run of ``CustomFromMask`` members is one, and a container of one is that hook."""
    out = []
    for kind, name, members in signature:
        collapsed: list[str] = []
        for member in members:
            if not (member == "CustomFromMask" and collapsed[-1:] == ["CustomFromMask"]):
                collapsed.append(member)
        if kind == "PruningContainer" and collapsed == ["CustomFromMask"]:
            out.append(("CustomFromMask", name, ()))
        else:
            out.append((kind, name, tuple(collapsed)))
    return out


def assert_same_reparametrization(
    ours: nn.Module, theirs: nn.Module, values: bool = True, bounded_global: bool = False
) -> None:
    """State_dict keys in order, dtypes, shapes, ``_orig`` values and hooks are the same.

    With ``values``, every other entry but the masks must be equal too (they are compared on
    their own, where ties allow it); without, only the ``_orig`` ones. With ``bounded_global``
    (modules pruned by ``global_unstructured``), torch's hooks are compared :func:`bounded`.
    """
    sd_ours, sd_theirs = ours.state_dict(), theirs.state_dict()
    assert list(sd_ours) == list(sd_theirs)
    for key in sd_ours:
        assert sd_ours[key].dtype == sd_theirs[key].dtype, key
        assert sd_ours[key].shape == sd_theirs[key].shape, key
        if key.endswith("_orig") or (values and not key.endswith("_mask")):
            assert torch.equal(sd_ours[key], sd_theirs[key]), key
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    for sub_ours, sub_theirs in zip(ours.modules(), theirs.modules(), strict=True):
        theirs_signature = hook_signature(sub_theirs)
        if bounded_global:
            theirs_signature = bounded(theirs_signature)
        assert hook_signature(sub_ours) == theirs_signature
        for hook in sub_ours._forward_pre_hooks.values():
            assert isinstance(hook, tp_prune.BasePruningMethod)
    assert tp_prune.is_pruned(ours) == torch_prune.is_pruned(theirs)


def reference_mask(call: Call, scores: Tensor, before: Tensor) -> Tensor:
    """The mask tensorplay must give for a deterministic ``call``: a stable sort of the scores.

    Args:
        call: an ``l1_unstructured`` or ``ln_structured`` call.
        scores: the importance scores it sees (the tensor itself by default).
        before: the mask before the call.

    Returns:
        ``before`` with the ``k`` lowest-scored available units (or channels) zeroed, the lowest
        index first among equal scores, as a float64 tensor.
    """
    amount = call.kwargs["amount"]
    mask = before.double().clone()
    if call.method == "l1_unstructured":
        available = torch.nonzero(before.reshape(-1) == 1).view(-1)
        values = scores.reshape(-1)[available].abs()
        k = count_to_prune(amount, available.numel())
        order = torch.sort(values, stable=True).indices[:k]
        mask.view(-1)[available[order]] = 0
        return mask
    dim = _normalized(call.kwargs["dim"], before.dim())
    channels, norms = _channel_norms(call, scores, before)
    k = count_to_prune(amount, channels.numel())
    pruned = channels[torch.sort(norms, stable=True).indices[:k]]
    mask.index_fill_(dim, pruned, 0)
    return mask


def _mask_of(module: nn.Module, name: str) -> Tensor:
    mask = getattr(module, name + "_mask", None)
    if mask is None:
        return torch.ones_like(getattr(module, name), dtype=torch.float64)
    return mask.detach().clone()


def _masks(module: nn.Module) -> dict[str, Tensor]:
    return {k: v for k, v in module.state_dict().items() if k.endswith("_mask")}


def _pruned_pairs(module: nn.Module) -> list[tuple[nn.Module, str]]:
    return [
        (owner, hook._tensor_name)
        for owner in module.modules()
        for hook in owner._forward_pre_hooks.values()
        if isinstance(hook, (tp_prune.BasePruningMethod, torch_prune.BasePruningMethod))
    ]


def _available(mask: Tensor, dim: int | None) -> int:
    if dim is None:
        return int((mask == 1).sum())
    dim = _normalized(dim, mask.dim())
    others = [d for d in range(mask.dim()) if d != dim]
    return int((mask.sum(dim=others) != 0).sum())


def _normalized(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def count_to_prune(amount: int | float, available: int) -> int:
    """The count torch prunes for ``amount`` of ``available`` units (restated, not imported)."""
    return amount if isinstance(amount, int) else round(amount * available)


def _channel_norms(call: Call, scores: Tensor, before: Tensor) -> tuple[Tensor, Tensor]:
    """The available channels along ``dim`` and their norms, computed as the methods do."""
    dim = _normalized(call.kwargs["dim"], before.dim())
    others = [d for d in range(before.dim()) if d != dim]
    keep = before.sum(dim=others) != 0
    index: list[Any] = [slice(None)] * before.dim()
    index[dim] = keep
    # The methods see only the channels left (all of them on a first pruning).
    norms = torch.norm(scores[tuple(index)], p=call.kwargs["n"], dim=others)
    return torch.nonzero(keep).view(-1), norms


def _step_state(module: nn.Module, call: Call) -> tuple[Tensor, Tensor]:
    owner = module.get_submodule(call.target)
    scores = call.kwargs.get("importance_scores")
    if scores is None:
        scores = getattr(owner, call.name).detach().clone()
    return _mask_of(owner, call.name), scores


def _sorted_scores(call: Call, scores: Tensor, before: Tensor) -> Tensor:
    if call.method == "l1_unstructured":
        return scores.reshape(-1)[before.reshape(-1) == 1].abs().sort().values
    return _channel_norms(call, scores, before)[1].sort().values


def _tie_at_threshold(call: Call, scores: Tensor, before: Tensor) -> bool:
    values = _sorted_scores(call, scores, before)
    k = count_to_prune(call.kwargs["amount"], values.numel())
    if not 0 < k < values.numel():
        return False
    pair = values[k - 1 : k + 1]
    return bool(pair[0] == pair[1]) or bool(pair.isnan().all())


def _newly_pruned(call: Call, before: Tensor, after: Tensor) -> int:
    if call.method in STRUCTURED:
        dim = call.kwargs.get("dim", -1)
        return _available(before, dim) - _available(after, dim)
    return int(((before == 1) & (after == 0)).sum())


def _assert_lowest_pruned(call: Call, scores: Tensor, before: Tensor, after: Tensor) -> None:
    """No unit (channel) pruned by ``call`` scores above one that ``call`` left unpruned."""
    if call.method == "l1_unstructured":
        values = scores.abs().reshape(-1)
        pruned = values[((before == 1) & (after == 0)).reshape(-1)]
        kept = values[((before == 1) & (after == 1)).reshape(-1)]
    else:
        dim = call.kwargs["dim"]
        channels, norms = _channel_norms(call, scores, before)
        others = [d for d in range(before.dim()) if d != _normalized(dim, before.dim())]
        still = after.sum(dim=others)[channels] != 0
        pruned, kept = norms[~still], norms[still]
    if pruned.numel() and kept.numel():
        # NaN ranks above every number, as in torch.topk.
        assert pruned.nan_to_num(nan=math.inf).max() <= kept.nan_to_num(nan=math.inf).min(), call


def _draw_may_tie(call: Call, scores: Tensor) -> bool:
    """``random_unstructured`` draws ``torch.rand_like(t)``: in half precision the draw holds ties
    (bfloat16 has 8 significant bits), among which torch's ``topk`` picks arbitrarily and
    tensorplay by its tie rule; only the counts can be compared then."""
    return call.method == "random_unstructured" and scores.dtype in (torch.float16, torch.bfloat16)


def _compare_step(
    call: Call,
    before: list[tuple[Tensor, Tensor]],
    after: list[Tensor],
    history: list[Call],
) -> None:
    (mask_ours, scores_ours), (mask_theirs, scores_theirs) = before
    assert after[0].dtype == after[1].dtype, history
    same_start = torch.equal(mask_ours, mask_theirs) and torch.equal(scores_ours, scores_theirs)
    arbitrary = (
        call.method in DETERMINISTIC and _tie_at_threshold(call, scores_ours, mask_ours)
    ) or _draw_may_tie(call, scores_ours)
    if same_start and not arbitrary:
        assert torch.equal(after[0], after[1]), history
    for (mask, scores), result in zip(before, after, strict=True):
        if call.method in ("identity",):
            assert torch.equal(result.double(), mask.double()), history
        elif call.method == "custom_from_mask":
            expected = mask.double() * call.kwargs["mask"].double()
            assert torch.equal(result.double(), expected), history
        else:
            available = _available(
                mask, call.kwargs.get("dim") if call.method in STRUCTURED else None
            )
            expected_count = count_to_prune(call.kwargs["amount"], available)
            assert _newly_pruned(call, mask, result) == expected_count, history
        if call.method in DETERMINISTIC:
            _assert_lowest_pruned(call, scores, mask, result)
    if call.method in DETERMINISTIC:
        assert torch.equal(after[0].double(), reference_mask(call, scores_ours, mask_ours)), history


def _assert_outputs_equal(ours: Any, theirs: Any) -> None:
    if isinstance(ours, Tensor):
        assert torch.equal(ours, theirs)
        return
    assert type(ours) is type(theirs) and len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        _assert_outputs_equal(a, b)
