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

import numbers
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.parity.aliases import unmasked_holders, warn_unmasked_holders
from tensorplay.ao.pruning.parity.reparametrization import find_hook, install, remove_parts

__all__ = [
    "BasePruningMethod",
    "PruningContainer",
    "PruningShapeError",
    "chain_hooks",
    "check_importance_scores",
    "own_hook",
]

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
        old_key, old_method = own_hook(module, name)
        method = cls(*args, **kwargs)
        method._tensor_name = name
        tensor = _get_tensor(module, name, first_pruning=old_method is None)
        scores = check_importance_scores(importance_scores, tensor, module, name)
        if old_method is None:
            mask = method.compute_mask(scores, default_mask=torch.ones_like(tensor))
        else:
            mask = combine_masks(method, scores, getattr(module, name + "_mask").detach())
        del tensor, scores  # so the parameter's reference count tells whether others hold it
        left = unmasked_holders([[(module, name)]]) if old_method is None else []
        hook = chain_hooks(old_method, method)
        install(module, name, hook, mask, old_key)
        warn_unmasked_holders(left)
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
        remove_parts(module, name, self, self.apply_mask(module))

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


def own_hook(module: nn.Module, name: str) -> tuple[int | None, BasePruningMethod | None]:
    """``(key, hook)`` of the tensorplay pruning hook of ``module.<name>``, or ``(None, None)``.

    Raises:
        TypeError: if ``torch.nn.utils.prune`` pruned the tensor (tensorplay cannot add to a
            reparametrization it did not make): the message says how to proceed.
        AssertionError: if the tensor has several pruning hooks (torch's type).

    Example:
        >>> import torch.nn.utils.prune as torch_prune
        >>> module = torch_prune.identity(nn.Linear(2, 2), "weight")
        >>> own_hook(module, "weight")
        Traceback (most recent call last):
        ...
        TypeError: Expected (Linear, 'weight') to be unpruned or pruned by tensorplay, ...
    """
    key, hook = find_hook(module, name)
    if hook is not None and not isinstance(hook, BasePruningMethod):
        raise TypeError(
            f"Expected ({type(module).__name__}, {name!r}) to be unpruned or pruned by "
            f"tensorplay, but it was pruned by {type(hook).__module__} (its hook is "
            f"{type(hook).__name__}), whose reparametrization tensorplay does not extend. Make "
            f"that pruning permanent first with torch.nn.utils.prune.remove(module, {name!r}), "
            "or carry it over: build the model afresh, call "
            "tensorplay.ao.pruning.restore_pruning(model, state_dict) with the pruned "
            "state_dict, then model.load_state_dict(state_dict)."
        )
    return key, hook


def chain_hooks(old: BasePruningMethod | None, method: BasePruningMethod) -> BasePruningMethod:
    """The hook of a tensor pruned by ``old`` (``None``: not yet) and then by ``method``.

    ``method`` itself on first pruning, else ``old`` turned into (or extended as) a
    :class:`PruningContainer` ending with ``method``, as torch does.

    Example:
        >>> from tensorplay.ao.pruning import Identity
        >>> first, second = Identity(), Identity()
        >>> first._tensor_name = second._tensor_name = "weight"
        >>> chain_hooks(None, first) is first, len(chain_hooks(first, second))
        (True, 2)
    """
    if old is None:
        return method
    if isinstance(old, PruningContainer):
        old.add_pruning_method(method)
        return old
    container = PruningContainer(old)
    container.add_pruning_method(method)
    return container


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


def check_importance_scores(scores: object, tensor: Tensor, module: nn.Module, name: str) -> Tensor:
    """``scores`` checked against ``module.<name>`` (``tensor``): ``tensor`` itself if ``None``.

    Raises:
        TypeError: ``scores`` is not a tensor.
        PruningShapeError: ``scores`` has another shape than the tensor.

    Example:
        >>> check_importance_scores(None, torch.ones(2), nn.Linear(2, 1), "bias")
        tensor([1., 1.])
    """
    label = f"({type(module).__name__}, {name!r})"
    if scores is None:
        return tensor
    if not isinstance(scores, Tensor):
        raise TypeError(
            f"Expected `importance_scores` for {label} to be a Tensor, but got "
            f"{type(scores).__name__}."
        )
    if scores.shape != tensor.shape:
        raise PruningShapeError(
            f"Expected `importance_scores` for {label} to have its shape "
            f"{tuple(tensor.shape)}, but got {tuple(scores.shape)}."
        )
    return scores
