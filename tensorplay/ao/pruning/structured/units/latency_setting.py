"""``target_latency=``: a budget on inference latency, and the inputs it is measured with.

A model's latency depends on where and how it runs: the device, the dtype, the batch and the
sequence length. :class:`LatencyBudget` holds the budget (a fraction of the dense model's
latency) with the inputs its latency is measured on, one value, so the setting travels with the
budget through every entry point (``prune_one_shot``, the ``Pruner``, the callbacks, a
``LightningCLI`` YAML file) and cannot be given without it. The latency is measured once, on the
model's own device and in its dtype, and each candidate's latency is estimated from that table:
:mod:`~tensorplay.ao.pruning.structured.units.latency`.

Example:
    >>> budget = LatencyBudget(0.5, input_shape=(1, 128))
    >>> budget.repeats, budget.warmup
    (10, 2)
    >>> budget.to_dict()
    {'fraction': 0.5, 'input_shape': [1, 128], 'repeats': 10, 'warmup': 2}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

__all__ = ["LatencyBudget", "check_target_latency"]


@dataclass(frozen=True, eq=False)
class LatencyBudget:
    """The latency a model may take at inference, as a fraction of the dense model's, measured
    on given inputs.

    Args:
        fraction: A float in (0, 1]: the shrunk model's estimated latency over the dense
            model's, both on these inputs, on the model's device and in its dtype.
        example_inputs: What the model's forward is called with when it is timed: a tensor
            (``model(x)``; a language model's token ids), a tuple (``model(*x)``) or a mapping
            (``model(**x)``), moved to the model's device. Give this or ``input_shape``.
        input_shape: The shape of the inputs instead (plain data, for YAML): token ids drawn
            uniformly from the vocabulary where the model has input embeddings
            (``get_input_embeddings()``), else a float tensor of standard normal values in the
            model's dtype; drawn from a fixed seed, so every measurement sees the same inputs.
        repeats: Timed forwards; each time is the least over them (the time the work takes
            when nothing else interrupts it).
        warmup: Forwards run first and not timed (caches, allocator, lazy kernels).

    Raises:
        TypeError, ValueError: A field of the wrong type or out of range, or both or neither
            of ``example_inputs`` and ``input_shape``, naming it.

    Example:
        >>> import torch
        >>> LatencyBudget(0.7, example_inputs=torch.zeros(1, 16, dtype=torch.long)).fraction
        0.7
        >>> LatencyBudget(1.5, input_shape=(1, 8))
        Traceback (most recent call last):
        ...
        ValueError: Expected `target_latency.fraction` to be a float in (0, 1], but got 1.5.
    """

    fraction: float
    example_inputs: Tensor | tuple[Any, ...] | Mapping[str, Any] | None = field(
        default=None, repr=False
    )
    input_shape: Sequence[int] | None = None
    repeats: int = 10
    warmup: int = 2

    def __post_init__(self) -> None:
        value = self.fraction
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"Expected `target_latency.fraction` to be a float in (0, 1], but got {value!r}."
            )
        if not 0.0 < value <= 1.0:
            raise ValueError(
                f"Expected `target_latency.fraction` to be a float in (0, 1], but got {value}."
            )
        object.__setattr__(self, "fraction", float(value))
        if (self.example_inputs is None) == (self.input_shape is None):
            which = "neither" if self.example_inputs is None else "both"
            raise ValueError(
                "Expected exactly one of `target_latency.example_inputs` and "
                f"`target_latency.input_shape` (what the model is timed on), but got {which}."
            )
        if self.example_inputs is not None and not isinstance(
            self.example_inputs, (Tensor, tuple, Mapping)
        ):
            raise TypeError(
                "Expected `target_latency.example_inputs` to be a tensor, a tuple or a mapping "
                f"of the model's inputs, but got {type(self.example_inputs).__name__}."
            )
        if self.input_shape is not None:
            object.__setattr__(self, "input_shape", _shape(self.input_shape))
        _check_count("repeats", self.repeats, 1)
        _check_count("warmup", self.warmup, 0)

    def __eq__(self, other: object) -> bool:
        """Equal fields; example inputs equal only if they are the same object (tensors have
        no one truth value)."""
        if not isinstance(other, LatencyBudget):
            return NotImplemented
        mine = (self.fraction, self.input_shape, self.repeats, self.warmup)
        theirs = (other.fraction, other.input_shape, other.repeats, other.warmup)
        return mine == theirs and self.example_inputs is other.example_inputs

    def __hash__(self) -> int:
        return hash((self.fraction, self.input_shape, self.repeats, self.warmup))

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, plain data (what a YAML or JSON file holds).

        Raises:
            TypeError: A budget given ``example_inputs`` (tensors have no plain-data form).

        Example:
            >>> LatencyBudget(0.5, input_shape=[2, 64]).to_dict()["input_shape"]
            [2, 64]
        """
        if self.input_shape is None:
            raise TypeError(
                "Expected a LatencyBudget given `input_shape` for plain data, but got one given "
                "`example_inputs`: tensors have no plain-data form."
            )
        return {
            "fraction": self.fraction,
            "input_shape": list(self.input_shape),
            "repeats": self.repeats,
            "warmup": self.warmup,
        }


def check_target_latency(value: object) -> LatencyBudget | None:
    """``target_latency`` as a :class:`LatencyBudget`: one as given, a mapping of its fields (a
    YAML or JSON configuration) built into one, ``None`` as ``None``.

    Raises:
        TypeError: Neither a :class:`LatencyBudget`, a mapping nor ``None``; as
            :class:`LatencyBudget`.

    Example:
        >>> check_target_latency({"fraction": 0.5, "input_shape": [1, 32]}).input_shape
        (1, 32)
    """
    if value is None or isinstance(value, LatencyBudget):
        return value
    if isinstance(value, Mapping):
        return LatencyBudget(**value)
    raise TypeError(
        "Expected `target_latency` to be a LatencyBudget (fraction, example_inputs or "
        f"input_shape, repeats, warmup) or a mapping of its fields, but got {value!r}."
    )


def _shape(value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise TypeError(
            f"Expected `target_latency.input_shape` to be a sequence of positive ints, but got "
            f"{value!r}."
        )
    for size in value:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(
                "Expected `target_latency.input_shape` to be a sequence of positive ints, but "
                f"got {list(value)!r}."
            )
    return tuple(value)


def _check_count(field: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"Expected `target_latency.{field}` to be an int >= {minimum}, but got {value!r}."
        )
    if value < minimum:
        raise ValueError(
            f"Expected `target_latency.{field}` to be an int >= {minimum}, but got {value}."
        )
