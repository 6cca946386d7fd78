"""``target_memory=``: a budget in bytes, and the setting those bytes are counted at.

The memory a model needs at inference is its weights plus its key/value cache, and both
depend on how it is run: the weights on the dtype, the cache on the dtype, the batch size and
the context length. :class:`MemoryBudget` holds the budget with that setting, one value, so the
setting travels with the budget through every entry point (``prune_one_shot``, the ``Pruner``,
the callbacks, a ``LightningCLI`` YAML file, a saved configuration) and cannot be given without
it. How the bytes are counted: :mod:`~tensorplay.ao.pruning.structured.units.measures`.

Example:
    >>> budget = MemoryBudget(2_000_000, context_length=4096)
    >>> budget.batch_size, budget.dtype, budget.element_size
    (1, 'bfloat16', 2)
    >>> MemoryBudget(0.8, context_length=4096, batch_size=8, dtype="float16").to_dict()
    {'bytes': 0.8, 'context_length': 4096, 'batch_size': 8, 'dtype': 'float16'}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["MemoryBudget", "check_target_memory"]


@dataclass(frozen=True)
class MemoryBudget:
    """The bytes a model may take at inference: its weights and its key/value cache.

    Args:
        bytes: An int, the bytes of the shrunk model's weights and cache together, or a float
            in (0, 1], that fraction of the model's bytes now (in the same setting).
        context_length: Positions the cache holds per sequence.
        batch_size: Sequences cached at once.
        dtype: The dtype of the weights and the cache, by name (``"bfloat16"``,
            ``"float16"``, ``"float8_e4m3fn"``, ``"int8"``...) or a ``torch.dtype``
            (kept by name, so the budget reads back as plain data in YAML or JSON).

    Raises:
        TypeError, ValueError: A field of the wrong type or out of range, naming it.

    Example:
        >>> import torch
        >>> MemoryBudget(10**9, context_length=2048, dtype=torch.float16).dtype
        'float16'
        >>> MemoryBudget(10**9, context_length=0)
        Traceback (most recent call last):
        ...
        ValueError: Expected `target_memory.context_length` to be a positive int, but got 0.
    """

    bytes: int | float
    context_length: int
    batch_size: int = 1
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        _check_amount(self.bytes)
        for field in ("context_length", "batch_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(
                    f"Expected `target_memory.{field}` to be a positive int, but got {value!r}."
                )
            if value < 1:
                raise ValueError(
                    f"Expected `target_memory.{field}` to be a positive int, but got {value}."
                )
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))

    @property
    def element_size(self) -> int:
        """Bytes per element of :attr:`dtype`.

        Example:
            >>> MemoryBudget(1, context_length=8, dtype="float32").element_size
            4
        """
        return int(getattr(torch, self.dtype).itemsize)

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, plain data (what a YAML or JSON file holds).

        Example:
            >>> MemoryBudget(1, context_length=8).to_dict()["dtype"]
            'bfloat16'
        """
        return asdict(self)


def check_target_memory(value: object) -> MemoryBudget | None:
    """``target_memory`` as a :class:`MemoryBudget`: one as given, a mapping of its fields (a
    YAML or JSON configuration) built into one, ``None`` as ``None``.

    Raises:
        TypeError: Neither a :class:`MemoryBudget`, a mapping nor ``None``; as
            :class:`MemoryBudget`.

    Example:
        >>> check_target_memory({"bytes": 4096, "context_length": 16}).context_length
        16
    """
    if value is None or isinstance(value, MemoryBudget):
        return value
    if isinstance(value, Mapping):
        return MemoryBudget(**value)
    raise TypeError(
        "Expected `target_memory` to be a MemoryBudget (bytes, context_length, batch_size, "
        f"dtype) or a mapping of its fields, but got {value!r}."
    )


def _check_amount(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            "Expected `target_memory.bytes` to be an int (bytes) or a float in (0, 1], but got "
            f"{value!r}."
        )
    if isinstance(value, int) and value < 1:
        raise ValueError(f"Expected `target_memory.bytes` to be a positive int, but got {value}.")
    if isinstance(value, float) and not 0.0 < value <= 1.0:
        raise ValueError(
            f"Expected `target_memory.bytes` as a float to be in (0, 1], but got {value}."
        )


def _dtype_name(dtype: object) -> str:
    """``dtype`` (a ``torch.dtype`` or its name) as the name of a real dtype."""
    name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype
    found = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(found, torch.dtype) or found.is_complex or found == torch.bool:
        raise ValueError(
            "Expected `target_memory.dtype` to be a real torch dtype or its name "
            f"('bfloat16', 'float16', 'float8_e4m3fn', 'int8'...), but got {dtype!r}."
        )
    return str(name)
