"""Calibration data is checked as it is read: a non-finite value is refused where it appears.

A calibration pass (:func:`~tensorplay.ao.pruning.pruner.one_shot.calibrate`, the reconstruction
of :mod:`~tensorplay.ao.pruning.structured.reconstruction`) turns a few batches into scores and
weights. One ``NaN`` in one batch would reach them silently: a NaN score ranks nowhere, a NaN Gram
matrix re-solves a layer into NaN weights. So every batch is read under a :class:`FiniteWatch`:

* its floating-point inputs are checked first (:func:`check_inputs`), naming the batch (its
  index in the pass) and where in the batch the value is;
* every module's output is checked as the forward computes it (a forward hook on each module,
  run before any other hook of the module), and after the batch the first module, in the order
  the forward finished them, whose output holds a ``NaN`` or an infinity is named with the batch.

Both raise a ``ValueError`` before the pass changes anything. The check reads each output once
more (its least and greatest value: a ``NaN`` makes both ``NaN``) and synchronises once per
batch. Each rank of a process group checks the batches it reads.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    >>> with FiniteWatch(model) as watch:
    ...     _ = model(torch.ones(1, 2))
    ...     watch.check(0)
    ...     _ = model(torch.tensor([[float("nan"), 1.0]]))
    ...     watch.check(1)
    Traceback (most recent call last):
    ...
    ValueError: Expected finite calibration data, but batch 1 first gives a non-finite value (nan) in the output of '0' (Linear): ...
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.edits import changes

__all__ = [
    "FiniteWatch",
    "NonFiniteCalibrationError",
    "check_inputs",
    "check_read",
    "nonfinite_kind",
]

_FIX = (
    "clean or drop that batch (a NaN in the data, a token id out of range, a loss scaled to "
    "overflow), or run the pass in a wider dtype."
)


class NonFiniteCalibrationError(ValueError):
    """A calibration batch gave a non-finite value where a pass reads it: the input of
    ``module``, the ``batch``-th that ``module`` saw (a pass that knows its own count of batches
    says it with :meth:`at_batch`).

    Args:
        module: The module whose input holds the value, by name.
        batch: The index of the batch, as the reader counted them.
        kind: ``"nan"``, ``"inf"`` or ``"-inf"``.

    Example:
        >>> error = NonFiniteCalibrationError("layers.0.mlp.up_proj", 3, "nan")
        >>> isinstance(error, ValueError), error.at_batch(7).batch
        (True, 7)
    """

    def __init__(self, module: str, batch: int, kind: str) -> None:
        self.module, self.batch, self.kind = module, batch, kind
        super().__init__(
            f"Expected finite calibration data, but batch {batch} gives a non-finite value "
            f"({kind}) in the input of {module!r}: {_FIX}"
        )

    def at_batch(self, batch: int) -> NonFiniteCalibrationError:
        """The same error, naming the batch by ``batch``."""
        return NonFiniteCalibrationError(self.module, batch, self.kind)


def check_read(value: Tensor, module: str, batch: int) -> None:
    """Refuse what a pass is about to read from ``module``'s input if it is not all finite.

    Raises:
        NonFiniteCalibrationError: Naming ``module``, ``batch`` and the kind of value.

    Example:
        >>> import torch
        >>> check_read(torch.ones(3), "fc", 0)
        >>> check_read(torch.tensor([float("nan")]), "fc", 2)
        Traceback (most recent call last):
        ...
        tensorplay.ao.pruning.calibration.finite.NonFiniteCalibrationError: Expected finite calibration data, but batch 2 gives a non-finite value (nan) in the input of 'fc': ...
    """  # noqa: E501
    local = _local(value)
    if local.is_meta:  # a traced forward on the meta device computes no value to check
        return
    if not bool(torch.isfinite(local).all()):
        raise NonFiniteCalibrationError(module, batch, nonfinite_kind(value))


def _tensors(value: Any, where: str = "") -> Iterator[tuple[str, Tensor]]:
    """The floating-point tensors in ``value`` (nested tuples, lists, mappings and model
    outputs), each with where it is (``[0]``, ``['pixel_values']``)."""
    if isinstance(value, Tensor):
        if value.is_floating_point() or value.is_complex():
            yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _tensors(item, f"{where}[{key!r}]")
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from _tensors(item, f"{where}[{index}]")


def _local(tensor: Tensor) -> Tensor:
    to_local = getattr(tensor, "to_local", None)
    return (tensor if to_local is None else to_local()).detach()


def nonfinite_kind(tensor: Tensor) -> str:
    """``"nan"``, ``"inf"`` or ``"-inf"``: the first kind of non-finite value ``tensor`` holds
    (``"finite"`` if none).

    Example:
        >>> import torch
        >>> nonfinite_kind(torch.tensor([1.0, -float("inf")])), nonfinite_kind(torch.ones(2))
        ('-inf', 'finite')
    """
    local = _local(tensor)
    if bool(torch.isnan(local).any()):
        return "nan"
    if bool(torch.isposinf(local).any()):
        return "inf"
    if bool(torch.isneginf(local).any()):
        return "-inf"
    return "finite"


def check_inputs(batch: Any, index: int) -> None:
    """Refuse a batch whose floating-point inputs are not all finite.

    Raises:
        ValueError: Naming the batch's ``index`` and where in it the value is.

    Example:
        >>> import torch
        >>> check_inputs({"x": torch.ones(2), "ids": torch.arange(2)}, 0)
        >>> check_inputs((torch.ones(2), torch.tensor([float("inf")])), 4)
        Traceback (most recent call last):
        ...
        ValueError: Expected finite calibration data, but batch 4 holds a non-finite value (inf) in its input [1]: ...
    """  # noqa: E501
    for where, tensor in _tensors(batch):
        kind = nonfinite_kind(tensor)
        if kind != "finite":
            raise ValueError(
                f"Expected finite calibration data, but batch {index} holds a non-finite value "
                f"({kind}) in its input{' ' + where if where else ''}: {_FIX}"
            )


class FiniteWatch:
    """Every module's output checked for finite values while batches run (see the module).

    Use it as a context manager around the pass; call :meth:`check` after each batch. The
    hooks go through :mod:`~tensorplay.ao.pruning.edits.changes` and are removed on leaving.

    Args:
        model: The model the batches run through.
    """

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._flags: list[tuple[str, nn.Module, Tensor]] = []  # each output's (min, max) pairs
        self._handles: list[Any] = []

    def __enter__(self) -> FiniteWatch:
        for name, module in self._model.named_modules():
            self._handles.append(
                changes.hook(module.register_forward_hook, self._noter(name), prepend=True)
            )
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._flags.clear()

    def _noter(self, name: str) -> Any:
        def note(module: nn.Module, args: Any, output: Any) -> None:
            tensors = [
                _local(t)
                for _, t in _tensors(output)
                if t.is_floating_point() and not t.is_meta and t.numel()
            ]
            if tensors:
                # One reduction per output: a NaN makes both ends NaN, an infinity an end.
                ends = torch.stack([torch.stack(torch.aminmax(t)).float() for t in tensors])
                self._flags.append((name, module, ends))

        return note

    def check(self, index: int) -> None:
        """Refuse batch ``index`` if some module's output held a non-finite value; forget the
        batch's notes either way.

        Raises:
            ValueError: Naming the batch and the first module (in the order the forward
                finished them) whose output is not finite, and the kind of value.
        """
        flags, self._flags = self._flags, []
        if not flags:
            return
        read = [ends.to("cpu") for _, _, ends in flags]  # one synchronisation
        finite = torch.stack([torch.isfinite(ends).all() for ends in read])
        if bool(finite.all()):
            return
        first = int(torch.nonzero(~finite)[0])
        name, module, _ = flags[first]
        kind = "nan" if bool(torch.isnan(read[first]).any()) else "inf"
        raise ValueError(
            f"Expected finite calibration data, but batch {index} first gives a non-finite "
            f"value ({kind}) in the output of {name!r} ({type(module).__name__}): {_FIX}"
        )
