"""A masked expert is never routed to: its router logit is minus infinity.

Zeroing an expert's weights and its router row is not enough: its logit is then ``0``, which
still takes part in the softmax (the other experts' probabilities shrink) and in the top-k (a
token may pick it). The shrunk model, which has no such expert, routes as if its logit were
``-inf``: ``exp(-inf) = 0`` in the softmax, never among the top-k while ``top_k`` experts are
left, and the renormalisation over the top-k (Mixtral; ``norm_topk_prob``) sums the same
values.

:class:`ExpertRouting` is a forward hook on a router module (a module whose ``weight`` holds one
row per expert and whose output is ``(logits, top_k_weights, top_k_indices)``, as every
transformers 5 router of the families of
:mod:`~tensorplay.ao.pruning.structured.dependency.families.moe` returns). Where some expert is
masked (its router row masked in either masking mode, or, with no mask, all zero: the pruning made
permanent; fewer than ``top_k`` rows left by values alone are a router not yet loaded, left as it
is), it sets the masked logits to ``-inf`` and routes again from them, exactly as the router does
(softmax in ``float32``, top-k, renormalisation where the router renormalises, the weights in the
dtype the router returned them in); where none is, it returns the router's output untouched. The
expert structure installs it when the pruner is made (:func:`install_routing`, once per router);
:func:`~tensorplay.ao.pruning.structured.shrinking.shrink.shrink` removes it from the routers it
slices (:func:`remove_routing`): their masked experts are gone.

Example:
    >>> import torch
    >>> from torch import nn
    >>> class Router(nn.Module):  # softmax, top-1, as a transformers router
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.weight = nn.Parameter(torch.tensor([[1.0], [-0.5], [-1.0]]))
    ...     def forward(self, x):
    ...         logits = x @ self.weight.T
    ...         top, index = logits.softmax(-1).topk(1, dim=-1)
    ...         return logits, top, index
    >>> router = Router()
    >>> install_routing(router, top_k=1, normalise=False)
    >>> with torch.no_grad():
    ...     router.weight[0] = 0  # expert 0 pruned: logits 0, -0.5, -1 would pick it
    ...     router(torch.tensor([[1.0]]))[2].item()
    1
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking.readers import mask_of

__all__ = [
    "ExpertRouting",
    "install_routing",
    "kept_experts",
    "remove_routing",
    "routed_around",
]


class ExpertRouting:
    """The forward hook that routes around the masked experts (see the module docstring).

    Args:
        top_k: Experts per token.
        normalise: Whether the router renormalises the top-k weights over their sum.
    """

    def __init__(self, top_k: int, normalise: bool) -> None:
        self.top_k = top_k
        self.normalise = normalise

    def __call__(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        masked_by = mask_of(module, "weight")
        kept = kept_experts(module)
        if bool(kept.all()):
            return None
        if int(kept.sum()) < self.top_k:
            if masked_by is None:
                return None  # zero rows that no pruning left (a router not loaded yet)
            raise RuntimeError(
                f"Expected at least top_k={self.top_k} experts left to route to, but the router "
                f"{type(module).__name__} keeps {int(kept.sum())} of {kept.numel()}."
            )
        logits, weights, _ = output
        masked = logits.masked_fill(~kept.to(logits.device), float("-inf"))
        probabilities = torch.softmax(masked.float(), dim=-1)
        top, indices = torch.topk(probabilities, self.top_k, dim=-1)
        if self.normalise:
            top = top / top.sum(dim=-1, keepdim=True)
        return masked, top.to(weights.dtype), indices


def kept_experts(router: nn.Module) -> Tensor:
    """Per expert, whether its router row is kept: by the row's mask where it has one (either
    masking mode), else by its values (a row of zeros is pruned).

    Example:
        >>> router = nn.Linear(2, 3, bias=False)
        >>> with torch.no_grad():
        ...     router.weight[1] = 0
        >>> kept_experts(router).tolist()
        [True, False, True]
    """
    mask = mask_of(router, "weight")
    rows = router.get_parameter("weight") if mask is None else mask
    return (rows.detach() != 0).flatten(1).any(dim=1)


def install_routing(router: nn.Module, *, top_k: int, normalise: bool) -> None:
    """Hook ``router`` with an :class:`ExpertRouting`, unless it has one (see the module)."""
    if not any(isinstance(hook, ExpertRouting) for hook in router._forward_hooks.values()):
        changes.hook(router.register_forward_hook, ExpertRouting(top_k, normalise))


def remove_routing(router: nn.Module) -> None:
    """Remove the :class:`ExpertRouting` hooks of ``router`` (its masked experts are gone).

    Example:
        >>> router = nn.Linear(2, 3)
        >>> install_routing(router, top_k=1, normalise=True)
        >>> remove_routing(router)
        >>> len(router._forward_hooks)
        0
    """
    changes.touch(router)
    for key, hook in list(router._forward_hooks.items()):
        if isinstance(hook, ExpertRouting):
            del router._forward_hooks[key]
            router._forward_hooks_with_kwargs.pop(key, None)
            router._forward_hooks_always_called.pop(key, None)


def routed_around(model: nn.Module) -> list[str]:
    """The routers of ``model`` that route around masked experts: those an
    :class:`ExpertRouting` hooks that have some expert masked. Only the hook keeps such a model
    computing as it should: a copy saved and loaded without tensorplay still routes tokens to
    the masked experts (their logits are ``0``, not ``-inf``) until
    :func:`~tensorplay.ao.pruning.shrink` removes them.

    Example:
        >>> router = nn.Linear(2, 3, bias=False)
        >>> model = nn.ModuleDict({"gate": router})
        >>> install_routing(router, top_k=1, normalise=False)
        >>> routed_around(model)
        []
        >>> with torch.no_grad():
        ...     router.weight[1] = 0
        >>> routed_around(model)
        ['gate']
    """
    return [
        name
        for name, module in model.named_modules()
        if any(isinstance(hook, ExpertRouting) for hook in module._forward_hooks.values())
        and not bool(kept_experts(module).all())
    ]
