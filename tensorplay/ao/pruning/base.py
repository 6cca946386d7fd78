"""The reparametrization mechanics shared by every pruning method.

Pruning the tensor ``name`` of a module replaces it by three things, exactly as
``torch.nn.utils.prune`` does:

* ``name + '_orig'``: the original :class:`~torch.nn.Parameter`, still trained;
* ``name + '_mask'``: a buffer of the parameter's dtype, ``0`` where a unit is pruned;
* ``name``: a plain attribute ``mask * orig``, recomputed before every forward by the pruning
  method itself, registered as the module's forward pre-hook.

Pruning one tensor again turns its hook into one :class:`PruningContainer` that remembers every
method in order. Unlike torch, :meth:`BasePruningMethod.apply` computes the new mask before it
touches the module, so a failed call leaves the module exactly as it was.
"""

from __future__ import annotations

import copy
import functools
import numbers
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.aliases import _unmasked_holders, _warn_unmasked_holders

__all__ = ["BasePruningMethod", "PruningContainer", "PruningShapeError"]

PruningType = Literal["unstructured", "structured", "global"]


class PruningShapeError(AssertionError, ValueError):
    """Importance scores or a mask whose shape differs from the tensor they describe.

    It is an :class:`AssertionError`, the type torch raises for this mistake, and a
    :class:`ValueError`, the type it is.

    Example:
        >>> [issubclass(PruningShapeError, kind) for kind in (ValueError, AssertionError)]
        [True, True]
    """


class BasePruningMethod(ABC):
    """Abstract base class of pruning techniques (the API of ``torch.nn.utils.prune``).

    Subclasses set :attr:`PRUNING_TYPE` and implement :meth:`compute_mask`; :meth:`apply` adds
    the reparametrization to a module and registers the method as its forward pre-hook.

    Example:
        >>> class PruneEveryOther(BasePruningMethod):
        ...     PRUNING_TYPE = "unstructured"
        ...
        ...     def compute_mask(self, t, default_mask):
        ...         mask = default_mask.clone()
        ...         mask.view(-1)[::2] = 0
        ...         return mask
        >>> module = nn.Linear(2, 2)
        >>> hook = PruneEveryOther.apply(module, "weight")
        >>> module.weight_mask
        tensor([[0., 1.],
                [0., 1.]])
    """

    PRUNING_TYPE: ClassVar[PruningType]
    _tensor_name: str

    def __call__(self, module: nn.Module, inputs: Any) -> None:
        """Recompute ``module.<name>`` from its ``_orig`` parameter and ``_mask`` buffer.

        Args:
            module: the module whose tensor this method prunes.
            inputs: the forward inputs (unused).
        """
        setattr(module, self._tensor_name, self.apply_mask(module))

    @abstractmethod
    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Compute a mask for ``t`` on top of ``default_mask``.

        Args:
            t: the importance scores of the tensor to prune.
            default_mask: the mask from earlier pruning (ones if none), same shape as ``t``;
                units it has pruned must stay pruned.

        Returns:
            The new mask, same shape as ``t``.
        """

    def apply_mask(self, module: nn.Module) -> Tensor:
        """Return the pruned tensor ``mask * orig`` of ``module``.

        Args:
            module: a module this method has been applied to.

        Returns:
            The product of the ``_mask`` buffer and the ``_orig`` parameter.

        Raises:
            AttributeError: if the method has never been applied to a tensor.
        """
        name = self._require_tensor_name(module)
        mask: Tensor = getattr(module, name + "_mask")
        orig: Tensor = getattr(module, name + "_orig")
        return mask.to(dtype=orig.dtype) * orig

    @classmethod
    def apply(
        cls,
        module: nn.Module,
        name: str,
        *args: Any,
        importance_scores: Tensor | None = None,
        **kwargs: Any,
    ) -> BasePruningMethod:
        """Prune ``module.<name>`` with a new instance of this method and reparametrize it.

        The mask is computed from ``importance_scores`` (default: the tensor itself) on top of
        any earlier mask; then ``name + '_orig'``, ``name + '_mask'`` and the forward pre-hook
        are put in place. Every check happens before the module is modified.

        Args:
            module: the module that holds the tensor.
            name: the name of the parameter to prune inside ``module``.
            *args: positional arguments of the method's constructor.
            importance_scores: scores of the same shape as the tensor, or ``None``.
            **kwargs: keyword arguments of the method's constructor.

        Returns:
            The hook now registered for the tensor: the new method, or the
            :class:`PruningContainer` holding it and the earlier ones.

        Raises:
            PruningShapeError: if ``importance_scores`` has another shape than the tensor.
            TypeError: if ``name`` is a tensor that is not a parameter (on first pruning).
        """
        old_key, old_method = _find_pruning_hook(module, name)
        method = cls(*args, **kwargs)
        method._tensor_name = name
        tensor = _get_tensor(module, name, first_pruning=old_method is None)
        scores = _check_importance_scores(importance_scores, tensor, module, name)
        if old_method is None:
            mask = method.compute_mask(scores, default_mask=torch.ones_like(tensor))
        else:
            mask = combine_masks(method, scores, getattr(module, name + "_mask").detach())
        del tensor, scores  # so the parameter's reference count tells whether others hold it
        left = _unmasked_holders([[(module, name)]]) if old_method is None else []
        hook = _install(module, name, method, mask, old_key, old_method)
        _warn_unmasked_holders(left)
        return hook

    def prune(
        self, t: Tensor, default_mask: Tensor | None = None, importance_scores: Tensor | None = None
    ) -> Tensor:
        """Return a pruned copy of ``t`` (``t * mask``), leaving every module alone.

        Args:
            t: the tensor to prune.
            default_mask: the mask from earlier pruning, or ``None`` for ones.
            importance_scores: scores of the same shape as ``t``, or ``None`` to use ``t``.

        Returns:
            ``t`` multiplied by the mask of :meth:`compute_mask`.

        Raises:
            PruningShapeError: if ``importance_scores`` has another shape than ``t``.
        """
        if importance_scores is not None and importance_scores.shape != t.shape:
            raise PruningShapeError(
                "Expected `importance_scores` to have the shape of the tensor, "
                f"{tuple(t.shape)}, but got {tuple(importance_scores.shape)}."
            )
        scores = t if importance_scores is None else importance_scores
        base = default_mask if default_mask is not None else torch.ones_like(t)
        return t * self.compute_mask(scores, default_mask=base)

    def remove(self, module: nn.Module) -> None:
        """Make the pruning of this method's tensor permanent and drop the reparametrization.

        ``module.<name>`` becomes a parameter again, holding ``mask * orig``; ``_orig`` and
        ``_mask`` are deleted. The pruning itself is not undone.

        Args:
            module: the module this method was applied to.

        Raises:
            AttributeError: if the method has never been applied to a tensor.
        """
        name = self._require_tensor_name(module)
        weight = self.apply_mask(module)
        if hasattr(module, name):
            delattr(module, name)
        orig = module._parameters[name + "_orig"]
        assert orig is not None  # for mypy: _orig is always a Parameter here
        orig.data = weight.data
        del module._parameters[name + "_orig"]
        del module._buffers[name + "_mask"]
        setattr(module, name, orig)
        if not _pruned_tensor_names(module, excluding=self):
            module.__dict__.pop("__deepcopy__", None)

    def _require_tensor_name(self, module: nn.Module) -> str:
        name = getattr(self, "_tensor_name", None)
        if name is None:
            raise AttributeError(
                f"{type(self).__name__} has not been applied to a tensor of {module} yet."
            )
        return str(name)


class PruningContainer(BasePruningMethod):
    """The sequence of methods that pruned one tensor, in order (iterative pruning).

    Its :meth:`compute_mask` applies the latest method to the units that earlier ones left.

    Args:
        *args: the pruning methods, all acting on the same tensor name.

    Example:
        >>> from tensorplay.ao.pruning import l1_unstructured
        >>> module = l1_unstructured(nn.Linear(4, 4), "weight", amount=0.5)
        >>> module = l1_unstructured(module, "weight", amount=0.5)
        >>> hook = next(iter(module._forward_pre_hooks.values()))
        >>> type(hook).__name__, len(hook), int((module.weight_mask == 0).sum())
        ('PruningContainer', 2, 12)
    """

    PRUNING_TYPE: ClassVar[PruningType] = "unstructured"

    def __init__(self, *args: BasePruningMethod) -> None:
        self._pruning_methods: tuple[BasePruningMethod, ...] = ()
        if args:
            self._tensor_name = args[0]._tensor_name
        for method in args:
            self.add_pruning_method(method)

    def add_pruning_method(self, method: BasePruningMethod | None) -> None:
        """Append ``method`` to the container.

        Args:
            method: a pruning method acting on the container's tensor.

        Raises:
            TypeError: if ``method`` is not a :class:`BasePruningMethod`.
            ValueError: if ``method`` acts on another tensor name.
        """
        if method is not None and not isinstance(method, BasePruningMethod):
            raise TypeError(f"{type(method)} is not a BasePruningMethod subclass")
        if method is not None and getattr(self, "_tensor_name", None) != method._tensor_name:
            raise ValueError(
                "Can only add pruning methods acting on the parameter named "
                f"'{getattr(self, '_tensor_name', None)}' to PruningContainer {self}. "
                f"Found '{method._tensor_name}'"
            )
        self._pruning_methods += (method,)  # type: ignore[operator]

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self) -> Iterator[BasePruningMethod]:
        return iter(self._pruning_methods)

    def __getitem__(self, idx: int) -> BasePruningMethod:
        return self._pruning_methods[idx]

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Apply the latest method to the units (or channels) ``default_mask`` left.

        Args:
            t: the importance scores of the tensor.
            default_mask: the mask from earlier pruning.

        Returns:
            The combined mask.
        """
        return combine_masks(self._pruning_methods[-1], t, default_mask)


def combine_masks(method: BasePruningMethod, t: Tensor, mask: Tensor) -> Tensor:
    """Compute ``method``'s mask on the part of ``t`` that ``mask`` left, and merge the two.

    For ``'unstructured'`` methods the part is the units where ``mask == 1`` (so ``amount``
    counts units not yet pruned); for ``'structured'`` ones, the channels along ``method.dim``
    not yet entirely pruned; for ``'global'`` ones, the whole tensor.

    Args:
        method: the method being applied.
        t: the importance scores, same shape as ``mask``.
        mask: the earlier mask.

    Returns:
        A new mask in ``t``'s dtype; ``mask`` itself is left unchanged.

    Raises:
        AttributeError: if a structured method has no ``dim``.
        IndexError: if ``method.dim`` is out of range.
        TypeError: if ``method.dim`` is not an int.
        ValueError: if ``method.PRUNING_TYPE`` is not recognised, or if a structured method is
            given a tensor of fewer than two dimensions.

    Example:
        >>> from tensorplay.ao.pruning import L1Unstructured
        >>> method = L1Unstructured(amount=1)
        >>> combine_masks(method, torch.tensor([3.0, 1.0, 2.0]), torch.tensor([1.0, 0.0, 1.0]))
        tensor([1., 0., 0.])
    """
    # torch writes into the mask it is given; a copy leaves the caller's (and the buffer) alone.
    mask = mask.clone(memory_format=torch.contiguous_format)
    new_mask = mask.to(dtype=t.dtype)
    slc: Tensor | tuple[Any, ...]
    if method.PRUNING_TYPE == "unstructured":
        slc = mask == 1
    elif method.PRUNING_TYPE == "structured":
        if not hasattr(method, "dim"):
            raise AttributeError(
                'Pruning methods of PRUNING_TYPE "structured" need to have the attribute `dim` '
                "defined."
            )
        n_dims = t.dim()
        if n_dims <= 1:
            # torch indexes on regardless and prunes a 1-D tensor as if it had one channel.
            raise ValueError(
                "Structured pruning can only be applied to multidimensional tensors. Found tensor "
                f"of shape {t.shape} with {n_dims} dims"
            )
        if not isinstance(method.dim, numbers.Integral):
            raise TypeError(f"Expected `dim` to be an int, but got {method.dim!r}.")
        dim = int(method.dim)
        if dim < 0:
            dim = n_dims + dim
        if dim < 0:
            raise IndexError(f"Index is out of bounds for tensor with dimensions {n_dims}")
        if dim >= n_dims:
            raise IndexError(f"Invalid index {method.dim} for tensor of size {t.shape}")
        keep_channel = mask.sum(dim=[d for d in range(n_dims) if d != dim]) != 0
        index: list[Any] = [slice(None)] * n_dims
        index[dim] = keep_channel
        slc = tuple(index)
    elif method.PRUNING_TYPE == "global":
        slc = tuple([slice(None)] * t.dim())
    else:
        raise ValueError(f"Unrecognized PRUNING_TYPE {method.PRUNING_TYPE}")
    partial_mask = method.compute_mask(t[slc], default_mask=mask[slc])
    new_mask[slc] = partial_mask.to(dtype=new_mask.dtype)
    return new_mask


def _find_pruning_hook(module: nn.Module, name: str) -> tuple[int | None, BasePruningMethod | None]:
    found = [
        (key, hook)
        for key, hook in module._forward_pre_hooks.items()
        if isinstance(hook, BasePruningMethod) and hook._tensor_name == name
    ]
    if len(found) > 1:
        raise AssertionError(
            f"Avoid adding multiple pruning hooks to the same tensor {name} of module {module}. "
            "Use a PruningContainer."
        )
    return found[0] if found else (None, None)


def _get_tensor(module: nn.Module, name: str, *, first_pruning: bool) -> Tensor:
    if not isinstance(name, str):
        raise TypeError(f"Expected `name` to be a str, but got {name!r} for module {module}.")
    tensor: Tensor = getattr(
        module, name
    )  # AttributeError names the missing attribute, as in torch
    if first_pruning and not isinstance(tensor, nn.Parameter):
        raise TypeError(
            f"Expected ({type(module).__name__}, {name!r}) to name a parameter, but it is "
            f"{type(tensor).__name__}: only parameters can be pruned."
        )
    return tensor


def _check_importance_scores(
    scores: Tensor | None, tensor: Tensor, module: nn.Module, name: str
) -> Tensor:
    if scores is None:
        return tensor
    if scores.shape != tensor.shape:
        raise PruningShapeError(
            f"Expected `importance_scores` for ({type(module).__name__}, {name!r}) to have its "
            f"shape {tuple(tensor.shape)}, but got {tuple(scores.shape)}."
        )
    return scores


def _install(
    module: nn.Module,
    name: str,
    method: BasePruningMethod,
    mask: Tensor,
    old_key: int | None,
    old_method: BasePruningMethod | None,
) -> BasePruningMethod:
    """Commit a computed mask: nothing in here can fail on valid input."""
    if old_method is None:
        hook = method
        orig = module._parameters.pop(name)
        module.register_parameter(name + "_orig", orig)
    else:
        assert old_key is not None  # for mypy: found together
        if isinstance(old_method, PruningContainer):
            old_method.add_pruning_method(method)
            hook = old_method
        else:
            hook = PruningContainer(old_method)
            hook.add_pruning_method(method)
        del module._forward_pre_hooks[old_key]
    module.register_buffer(name + "_mask", mask)
    setattr(module, name, hook.apply_mask(module))
    module.register_forward_pre_hook(hook)
    module.__dict__["__deepcopy__"] = functools.partial(_deepcopy_pruned_module, module)
    return hook


def _pruned_tensor_names(
    module: nn.Module, excluding: BasePruningMethod | None = None
) -> list[str]:
    return [
        hook._tensor_name
        for hook in module._forward_pre_hooks.values()
        if isinstance(hook, BasePruningMethod) and hook is not excluding
    ]


def _deepcopy_pruned_module(module: nn.Module, memo: dict[int, Any]) -> nn.Module:
    """Deep-copy a pruned module, which torch cannot do.

    ``module.<name>`` is ``mask * orig``, a non-leaf tensor that ``copy.deepcopy`` refuses. The
    copy gets a detached value instead (its own forward pre-hook recomputes it from the copied
    ``_orig`` and ``_mask``), so ``copy.deepcopy`` works on pruned models, as EMA/SWA wrappers
    and teacher models need. ``copy.deepcopy`` finds this function in the instance dict.
    """
    state = module.__dict__
    masked = {name: state[name] for name in _pruned_tensor_names(module) if name in state}
    copier = state.pop("__deepcopy__")
    state.update({name: tensor.detach() for name, tensor in masked.items()})
    try:
        clone = copy.deepcopy(module, memo)
    finally:
        state.update(masked)
        state["__deepcopy__"] = copier
    clone.__dict__["__deepcopy__"] = functools.partial(_deepcopy_pruned_module, clone)
    return clone
