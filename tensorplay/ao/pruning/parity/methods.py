"""The pruning methods of ``torch.nn.utils.prune``, their functional forms, remove, is_pruned.

Each method prunes one tensor; :func:`~tensorplay.ao.pruning.global_unstructured` prunes many
under one budget. ``amount`` follows one rule everywhere (see
:mod:`tensorplay.ao.pruning.parity.amount`): a float is a fraction, an int a count, of the units not
yet pruned.

Where scores tie at the threshold, the unit with the lower flat index (channel index for
structured methods) is pruned first, so a call always gives the same mask; torch leaves that
choice to ``topk``.
"""

from __future__ import annotations

import numbers
import weakref
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.parity.amount import (
    PruningAmount,
    compute_nparams_to_prune,
    validate_pruning_amount,
    validate_pruning_amount_init,
)
from tensorplay.ao.pruning.parity.base import (
    BasePruningMethod,
    PruningShapeError,
    PruningType,
    own_hook,
)

__all__ = [
    "CustomFromMask",
    "Identity",
    "L1Unstructured",
    "LnStructured",
    "RandomStructured",
    "RandomUnstructured",
    "custom_from_mask",
    "identity",
    "is_pruned",
    "l1_unstructured",
    "ln_structured",
    "random_structured",
    "random_unstructured",
    "remove",
]

NormOrder = int | float | str


class Identity(BasePruningMethod):
    """Add the reparametrization without pruning anything (a mask of ones).

    Example:
        >>> Identity.apply(nn.Linear(2, 2), "weight").compute_mask(torch.ones(2), torch.ones(2))
        tensor([1., 1.])
    """

    PRUNING_TYPE: ClassVar[PruningType] = "unstructured"

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Return ``default_mask`` unchanged.

        Args:
            t: the importance scores (unused).
            default_mask: the earlier mask.

        Returns:
            ``default_mask`` itself.
        """
        return default_mask

    @classmethod
    def apply(cls, module: nn.Module, name: str) -> Identity:  # type: ignore[override]
        """Reparametrize ``module.<name>`` with a mask of ones.

        Args:
            module: the module that holds the tensor.
            name: the parameter's name inside ``module``.

        Returns:
            The hook registered for the tensor.
        """
        return super().apply(module, name)  # type: ignore[return-value]


class RandomUnstructured(BasePruningMethod):
    """Prune units not yet pruned, chosen uniformly at random.

    Args:
        amount: a fraction (float in ``[0, 1]``) or a count (int) of the units not yet pruned.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> RandomUnstructured(amount=2).compute_mask(torch.zeros(4), torch.ones(4)).sum()
        tensor(2.)
    """

    PRUNING_TYPE: ClassVar[PruningType] = "unstructured"

    def __init__(self, amount: PruningAmount) -> None:
        validate_pruning_amount_init(amount)
        self.amount = amount

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Zero ``amount`` units of ``default_mask`` at random (from the global RNG, as torch).

        Args:
            t: the scores (only their shape and device matter).
            default_mask: the earlier mask.

        Returns:
            The new mask.
        """
        nparams_to_prune = _checked_count(self.amount, t.nelement())
        mask = default_mask.clone(memory_format=torch.contiguous_format)
        if nparams_to_prune != 0:
            # The k highest of one draw, as torch does, so a seed gives torch's mask.
            prob = torch.rand_like(t)
            mask.view(-1)[lowest_k_indices(-prob.view(-1), nparams_to_prune)] = 0
        return mask

    @classmethod
    def apply(  # type: ignore[override]
        cls, module: nn.Module, name: str, amount: PruningAmount
    ) -> BasePruningMethod:
        """Prune ``module.<name>`` at random.

        Args:
            module: the module that holds the tensor.
            name: the parameter's name inside ``module``.
            amount: a fraction or count of the units not yet pruned.

        Returns:
            The hook registered for the tensor.
        """
        return super().apply(module, name, amount=amount)


class L1Unstructured(BasePruningMethod):
    """Prune the units not yet pruned with the lowest absolute value.

    Args:
        amount: a fraction (float in ``[0, 1]``) or a count (int) of the units not yet pruned.

    Example:
        >>> scores = torch.tensor([0.5, -3.0, 0.1, 2.0])
        >>> L1Unstructured(amount=2).compute_mask(scores, torch.ones(4))
        tensor([0., 1., 0., 1.])
    """

    PRUNING_TYPE: ClassVar[PruningType] = "unstructured"

    def __init__(self, amount: PruningAmount) -> None:
        validate_pruning_amount_init(amount)
        self.amount = amount

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Zero the ``amount`` units of smallest ``|t|`` (ties: lowest flat index first).

        Args:
            t: the importance scores.
            default_mask: the earlier mask.

        Returns:
            The new mask.
        """
        nparams_to_prune = _checked_count(self.amount, t.nelement())
        mask = default_mask.clone(memory_format=torch.contiguous_format)
        if nparams_to_prune != 0:
            mask.view(-1)[lowest_k_indices(torch.abs(t).view(-1), nparams_to_prune)] = 0
        return mask

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: nn.Module,
        name: str,
        amount: PruningAmount,
        importance_scores: Tensor | None = None,
    ) -> BasePruningMethod:
        """Prune the smallest-magnitude units of ``module.<name>``.

        Args:
            module: the module that holds the tensor.
            name: the parameter's name inside ``module``.
            amount: a fraction or count of the units not yet pruned.
            importance_scores: scores of the tensor's shape ranking the units, or ``None``.

        Returns:
            The hook registered for the tensor.
        """
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)


class RandomStructured(BasePruningMethod):
    """Prune whole channels not yet pruned, chosen at random.

    Args:
        amount: a fraction (float in ``[0, 1]``) or a count (int) of the channels.
        dim: the dimension whose slices are the channels.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> method = RandomStructured(amount=1, dim=1)
        >>> mask = method.compute_mask(torch.ones(2, 3), torch.ones(2, 3))
        >>> int((mask.sum(dim=0) == 0).sum())
        1
    """

    PRUNING_TYPE: ClassVar[PruningType] = "structured"

    def __init__(self, amount: PruningAmount, dim: int = -1) -> None:
        validate_pruning_amount_init(amount)
        self.amount = amount
        self.dim = dim

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Zero ``amount`` random channels along ``dim`` (drawn on the CPU, as in torch).

        Args:
            t: the tensor (only its shape matters).
            default_mask: the earlier mask.

        Returns:
            The new mask.

        Raises:
            ValueError: if ``t`` has fewer than two dimensions.
            IndexError: if ``dim`` is out of range.
            TypeError: if ``dim`` is not an int.
        """
        nchannels, nparams_to_prune = _structured_count(t, self.amount, self.dim)
        if nparams_to_prune == 0:
            return default_mask
        prob = torch.rand(nchannels)
        threshold = torch.kthvalue(prob, k=nparams_to_prune).values
        mask = _channel_mask(t, self.dim, prob > threshold)
        mask *= default_mask.to(dtype=mask.dtype)
        return mask

    @classmethod
    def apply(  # type: ignore[override]
        cls, module: nn.Module, name: str, amount: PruningAmount, dim: int = -1
    ) -> BasePruningMethod:
        """Prune random channels of ``module.<name>``.

        Args:
            module: the module that holds the tensor.
            name: the parameter's name inside ``module``.
            amount: a fraction or count of the channels.
            dim: the dimension whose slices are the channels.

        Returns:
            The hook registered for the tensor.
        """
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(BasePruningMethod):
    """Prune whole channels not yet pruned with the lowest L\\ ``n``-norm.

    Args:
        amount: a fraction (float in ``[0, 1]``) or a count (int) of the channels.
        n: the norm order, any ``p`` that :func:`torch.norm` accepts.
        dim: the dimension whose slices are the channels.

    Example:
        >>> t = torch.tensor([[1.0, 5.0, 2.0], [1.0, 5.0, 2.0]])
        >>> LnStructured(amount=1, n=2, dim=1).compute_mask(t, torch.ones(2, 3))
        tensor([[0., 1., 1.],
                [0., 1., 1.]])
    """

    PRUNING_TYPE: ClassVar[PruningType] = "structured"

    def __init__(self, amount: PruningAmount, n: NormOrder, dim: int = -1) -> None:
        validate_pruning_amount_init(amount)
        self.amount = amount
        self.n = n
        self.dim = dim

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Zero the ``amount`` channels of lowest norm (ties: lowest channel index first).

        Args:
            t: the importance scores.
            default_mask: the earlier mask.

        Returns:
            The new mask.

        Raises:
            ValueError: if ``t`` has fewer than two dimensions.
            IndexError: if ``dim`` is out of range.
            TypeError: if ``dim`` is not an int.
        """
        nchannels, nparams_to_prune = _structured_count(t, self.amount, self.dim)
        if nparams_to_prune == 0:
            return default_mask
        norm = _compute_norm(t, self.n, self.dim)
        keep = torch.ones(nchannels, dtype=torch.bool, device=norm.device)
        keep[lowest_k_indices(norm, nparams_to_prune)] = False
        mask = _channel_mask(t, self.dim, keep)
        mask *= default_mask.to(dtype=mask.dtype)
        return mask

    @classmethod
    def apply(  # type: ignore[override]
        cls,
        module: nn.Module,
        name: str,
        amount: PruningAmount,
        n: NormOrder,
        dim: int,
        importance_scores: Tensor | None = None,
    ) -> BasePruningMethod:
        """Prune the lowest-norm channels of ``module.<name>``.

        Args:
            module: the module that holds the tensor.
            name: the parameter's name inside ``module``.
            amount: a fraction or count of the channels.
            n: the norm order.
            dim: the dimension whose slices are the channels.
            importance_scores: scores of the tensor's shape, or ``None``.

        Returns:
            The hook registered for the tensor.
        """
        return super().apply(
            module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores
        )


class CustomFromMask(BasePruningMethod):
    """Prune with a mask given in advance (multiplied into any earlier mask).

    Args:
        mask: a tensor of the pruned tensor's shape, ``0`` where a unit is pruned.

    Example:
        >>> CustomFromMask(torch.tensor([0, 1, 1])).compute_mask(torch.ones(3), torch.ones(3))
        tensor([0., 1., 1.])
    """

    PRUNING_TYPE: ClassVar[PruningType] = "global"
    _mask: Tensor | None = None
    _module: weakref.ref[nn.Module] | None = None

    def __init__(self, mask: Tensor) -> None:
        self.mask = mask

    @classmethod
    def of_buffer(cls, module: nn.Module, name: str) -> CustomFromMask:
        """A hook for ``module.<name>`` whose mask is the module's current ``<name>_mask`` buffer.

        It holds no tensor of its own, so after ``module.half()``, ``.to(...)`` or
        ``load_state_dict`` (which replace buffers) no earlier mask stays alive or is pickled
        with the module. :func:`~tensorplay.ao.pruning.global_unstructured` and
        :func:`~tensorplay.ao.pruning.restore_pruning` install these; a later global call updates
        the buffer and keeps the hook (see :attr:`reads_buffer`).

        Example:
            >>> module = custom_from_mask(nn.Linear(2, 1), "bias", torch.tensor([0.0]))
            >>> hook = CustomFromMask.of_buffer(module, "bias")
            >>> hook.mask is module.bias_mask, hook.reads_buffer
            (True, True)
        """
        hook = cls.__new__(cls)
        hook._tensor_name = name
        hook._module = weakref.ref(module)
        return hook

    @property
    def reads_buffer(self) -> bool:
        """Whether :attr:`mask` is the module's ``<name>_mask`` buffer (see :meth:`of_buffer`)."""
        return self._module is not None

    @property
    def mask(self) -> Tensor:
        """The mask given, or the module's current ``<name>_mask`` buffer (:meth:`of_buffer`)."""
        if self._module is None:
            assert self._mask is not None  # for mypy: set by __init__
            return self._mask
        module = self._module()
        buffer = None if module is None else module._buffers.get(self._tensor_name + "_mask")
        if buffer is None:
            raise AttributeError(
                f"Expected the module of this CustomFromMask to hold {self._tensor_name}_mask, "
                "but it is gone (the module was freed or its pruning removed)."
            )
        return buffer

    @mask.setter
    def mask(self, value: Tensor) -> None:
        self._mask, self._module = value, None

    def __getstate__(self) -> dict[str, Any]:
        """The state, the module held strongly (a weak reference does not pickle)."""
        state = self.__dict__.copy()
        if self._module is not None:
            state["_module"] = self._module()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        module = state.get("_module")
        self.__dict__.update(state)
        if isinstance(module, nn.Module):
            self._module = weakref.ref(module)

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        """Return ``default_mask * mask``.

        Args:
            t: the tensor (unused).
            default_mask: the earlier mask.

        Returns:
            The product, in ``default_mask``'s dtype.

        Raises:
            PruningShapeError: if the two masks differ in shape.
        """
        if default_mask.shape != self.mask.shape:
            raise PruningShapeError(
                f"Expected `mask` to have the tensor's shape {tuple(default_mask.shape)}, "
                f"but got {tuple(self.mask.shape)}."
            )
        return default_mask * self.mask.to(dtype=default_mask.dtype)

    @classmethod
    def apply(  # type: ignore[override]
        cls, module: nn.Module, name: str, mask: Tensor
    ) -> BasePruningMethod:
        """Prune ``module.<name>`` with ``mask``.

        Args:
            module: the module that holds the tensor.
            name: the parameter's name inside ``module``.
            mask: the mask to apply.

        Returns:
            The hook registered for the tensor.
        """
        return super().apply(module, name, mask=mask)


def identity(module: nn.Module, name: str) -> nn.Module:
    """Reparametrize ``module.<name>`` without pruning anything.

    Args:
        module: the module that holds the tensor.
        name: the parameter's name inside ``module``.

    Returns:
        ``module``, modified in place.

    Example:
        >>> sorted(identity(nn.Linear(2, 3), "bias").state_dict())
        ['bias_mask', 'bias_orig', 'weight']
    """
    Identity.apply(module, name)
    return module


def random_unstructured(module: nn.Module, name: str, amount: PruningAmount) -> nn.Module:
    """Prune ``amount`` of the units not yet pruned of ``module.<name>`` at random.

    Args:
        module: the module that holds the tensor.
        name: the parameter's name inside ``module``.
        amount: a fraction (float) or a count (int) of the units not yet pruned.

    Returns:
        ``module``, modified in place.

    Example:
        >>> m = random_unstructured(nn.Linear(2, 3), "weight", amount=1)
        >>> int(torch.sum(m.weight_mask == 0))
        1
    """
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(
    module: nn.Module, name: str, amount: PruningAmount, importance_scores: Tensor | None = None
) -> nn.Module:
    """Prune the ``amount`` units of ``module.<name>`` with the lowest absolute score.

    Args:
        module: the module that holds the tensor.
        name: the parameter's name inside ``module``.
        amount: a fraction (float) or a count (int) of the units not yet pruned.
        importance_scores: scores of the tensor's shape ranking the units; ``None`` uses the
            tensor itself.

    Returns:
        ``module``, modified in place.

    Example:
        >>> m = l1_unstructured(nn.Linear(2, 3), "weight", amount=0.2)
        >>> list(m.state_dict().keys())
        ['bias', 'weight_orig', 'weight_mask']
    """
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(module: nn.Module, name: str, amount: PruningAmount, dim: int) -> nn.Module:
    """Prune ``amount`` random channels of ``module.<name>`` along ``dim``.

    Args:
        module: the module that holds the tensor.
        name: the parameter's name inside ``module``.
        amount: a fraction (float) or a count (int) of the channels not yet pruned.
        dim: the dimension whose slices are the channels.

    Returns:
        ``module``, modified in place.

    Example:
        >>> m = random_structured(nn.Linear(5, 3), "weight", amount=3, dim=1)
        >>> int(sum(torch.sum(m.weight, dim=0) == 0))
        3
    """
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(
    module: nn.Module,
    name: str,
    amount: PruningAmount,
    n: NormOrder,
    dim: int,
    importance_scores: Tensor | None = None,
) -> nn.Module:
    """Prune the ``amount`` channels of ``module.<name>`` with the lowest L\\ ``n``-norm.

    Args:
        module: the module that holds the tensor.
        name: the parameter's name inside ``module``.
        amount: a fraction (float) or a count (int) of the channels not yet pruned.
        n: the norm order, any ``p`` that :func:`torch.norm` accepts.
        dim: the dimension whose slices are the channels.
        importance_scores: scores of the tensor's shape, or ``None`` for the tensor itself.

    Returns:
        ``module``, modified in place.

    Example:
        >>> m = ln_structured(nn.Conv2d(5, 3, 2), "weight", amount=0.3, dim=1, n=float("-inf"))
        >>> int((m.weight_mask.sum(dim=(0, 2, 3)) == 0).sum())
        2
    """
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module: nn.Module, name: str, mask: Tensor) -> nn.Module:
    """Prune ``module.<name>`` with a precomputed ``mask``.

    Args:
        module: the module that holds the tensor.
        name: the parameter's name inside ``module``.
        mask: a tensor of the parameter's shape, ``0`` where a unit is pruned.

    Returns:
        ``module``, modified in place.

    Example:
        >>> m = custom_from_mask(nn.Linear(5, 3), name="bias", mask=torch.tensor([0, 1, 0]))
        >>> m.bias_mask
        tensor([0., 1., 0.])
    """
    CustomFromMask.apply(module, name, mask)
    return module


def remove(module: nn.Module, name: str) -> nn.Module:
    """Make the pruning of ``module.<name>`` permanent: drop ``_orig``, ``_mask`` and the hook.

    ``module.<name>`` becomes a plain parameter holding the pruned values (zeros included);
    the pruning is not undone.

    Args:
        module: the module that holds the tensor.
        name: the parameter's name inside ``module``.

    Returns:
        ``module``, modified in place.

    Raises:
        ValueError: if ``module.<name>`` is not pruned.

    Example:
        >>> m = random_unstructured(nn.Linear(5, 7), name="weight", amount=0.2)
        >>> m = remove(m, name="weight")
        >>> sorted(m.state_dict())
        ['bias', 'weight']
    """
    key, hook = own_hook(module, name)
    if key is not None and hook is not None:
        hook.remove(module)
        del module._forward_pre_hooks[key]
        return module
    raise ValueError(
        f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed"
    )


def is_pruned(module: nn.Module) -> bool:
    """Whether ``module`` or any of its submodules carries a pruning hook.

    Args:
        module: the module to inspect.

    Returns:
        ``True`` if some submodule has a :class:`BasePruningMethod` forward pre-hook.

    Example:
        >>> m = nn.Linear(5, 7)
        >>> is_pruned(m)
        False
        >>> is_pruned(random_unstructured(m, name="weight", amount=0.2))
        True
    """
    return any(
        isinstance(hook, BasePruningMethod)
        for submodule in module.modules()
        for hook in submodule._forward_pre_hooks.values()
    )


def lowest_k_indices(scores: Tensor, k: int) -> Tensor:
    """Flat indices of the ``k`` lowest entries of a 1-D tensor; ties go to the lower index.

    NaN ranks above every number (``+inf`` included), as in :func:`torch.topk`.

    Args:
        scores: a 1-D tensor.
        k: how many indices, ``0 <= k <= scores.numel()``.

    Returns:
        A 1-D int64 tensor of ``k`` indices, on ``scores``' device.

    Example:
        >>> lowest_k_indices(torch.tensor([2.0, 1.0, 1.0, 0.0]), 2)
        tensor([3, 1])
    """
    if k == 0:
        return torch.empty(0, dtype=torch.long, device=scores.device)
    if k == scores.numel():
        return torch.arange(k, device=scores.device)
    keys = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    threshold = torch.kthvalue(keys, k).values
    if torch.isnan(threshold):
        # NaN ranks above every number, as in torch.topk; NaN == NaN is False, so match by isnan.
        is_nan = torch.isnan(keys)
        below, ties = torch.nonzero(~is_nan).view(-1), torch.nonzero(is_nan).view(-1)
    else:
        below = torch.nonzero(keys < threshold).view(-1)
        ties = torch.nonzero(keys == threshold).view(-1)
    return torch.cat([below, ties[: k - below.numel()]])


def _checked_count(amount: PruningAmount, size: int) -> int:
    count = compute_nparams_to_prune(amount, size)
    validate_pruning_amount(count, size)
    return count


def _structured_count(t: Tensor, amount: PruningAmount, dim: int) -> tuple[int, int]:
    """The number of channels along ``dim`` and how many of them to prune."""
    _validate_structured_pruning(t)
    _validate_pruning_dim(t, dim)
    nchannels = t.shape[dim]
    return nchannels, _checked_count(amount, nchannels)


def _channel_mask(t: Tensor, dim: int, keep_channel: Tensor) -> Tensor:
    mask = torch.zeros_like(t)
    index: list[Any] = [slice(None)] * t.dim()
    index[dim] = keep_channel
    mask[tuple(index)] = 1
    return mask


def _validate_structured_pruning(t: Tensor) -> None:
    if t.dim() <= 1:
        raise ValueError(
            "Structured pruning can only be applied to multidimensional tensors. Found tensor of "
            f"shape {t.shape} with {t.dim()} dims"
        )


def _validate_pruning_dim(t: Tensor, dim: int) -> None:
    if not isinstance(dim, numbers.Integral):
        # torch fails here with a TypeError from indexing t.shape; say so plainly.
        raise TypeError(f"Expected `dim` to be an int, but got {dim!r}.")
    if not -t.dim() <= dim < t.dim():  # torch checks only the upper bound, then fails indexing
        raise IndexError(f"Invalid index {dim} for tensor of size {t.shape}")


def _compute_norm(t: Tensor, n: NormOrder, dim: int) -> Tensor:
    dims = list(range(t.dim()))
    dims.remove(dims[dim])
    norm: Tensor = torch.norm(t, p=n, dim=dims)  # type: ignore[arg-type]
    return norm
