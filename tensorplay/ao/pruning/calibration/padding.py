"""Padding tokens left out of what a calibration pass reads.

A batch a Hugging Face tokenizer pads (``padding=True``) holds an ``attention_mask`` whose zeros
mark the padding: positions the model computes but that no real token reads. A score summed
over every position would count them as tokens of the calibration text. So while a one-shot
calibration pass runs a mapping batch whose ``attention_mask`` has a zero
(:func:`padding_of`), the scores that read a layer's inputs or outputs per token ask this module
for the real tokens' rows (:func:`real_rows`) or samples (:func:`real_samples`). A layer whose
tensor is not laid out per token like the mask (the rows a routed expert receives, a
convolution's patches) cannot tell padding apart: it is refused with a ``ValueError`` naming it,
before any score counts the batch. A batch without padding (no mask, or a mask of ones) reads
every position, as a forward in training does.

Example:
    >>> import torch
    >>> batch = {"input_ids": torch.zeros(2, 3, dtype=torch.long),
    ...          "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}
    >>> states = torch.arange(12.0).reshape(2, 3, 2)  # (batch, sequence, features)
    >>> with padding_of(batch):
    ...     real_rows(states, "layer").tolist()
    [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]
    >>> real_rows(states, "layer").shape  # outside the pass: every position
    torch.Size([6, 2])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from torch import Tensor

__all__ = ["padding_of", "real_rows", "real_samples", "real_tokens", "refuse_padding"]

_REAL: ContextVar[Tensor | None] = ContextVar("tensorplay_real_tokens", default=None)


def real_tokens(batch: Any) -> Tensor | None:
    """The batch's ``attention_mask`` as bools (``True``: a real token) where it marks some
    padding; ``None`` for a batch without a mask, or whose mask marks every token real.

    Example:
        >>> import torch
        >>> real_tokens({"attention_mask": torch.tensor([[1, 0]])}).tolist()
        [[True, False]]
        >>> real_tokens({"attention_mask": torch.ones(1, 2)}) is None
        True
    """
    if not isinstance(batch, Mapping):
        return None
    mask = batch.get("attention_mask")
    if not isinstance(mask, Tensor):
        return None
    real = mask != 0
    return None if bool(real.all()) else real


@contextmanager
def padding_of(batch: Any) -> Iterator[None]:
    """While the block runs, :func:`real_rows` and :func:`real_samples` leave out the padding
    ``batch`` marks (see the module example)."""
    token = _REAL.set(real_tokens(batch))
    try:
        yield
    finally:
        _REAL.reset(token)


def real_rows(x: Tensor, where: str) -> Tensor:
    """``x`` as ``(tokens, features)`` (its last dimension the features), the padding's rows
    left out: ``x`` laid out ``(batch, sequence, ..., features)`` or ``(batch * sequence,
    features)`` like the mask of the batch being read.

    Raises:
        ValueError: Padding to leave out, and ``x`` laid out otherwise, naming ``where``.
    """
    flat = x.reshape(-1, x.shape[-1])
    real = _REAL.get()
    if real is None:
        return flat
    if x.dim() >= 3 and tuple(x.shape[:2]) == tuple(real.shape):
        rows = real.reshape(*real.shape, *([1] * (x.dim() - 3))).expand(x.shape[:-1])
        return flat[rows.reshape(-1).to(x.device)]
    if x.dim() == 2 and x.shape[0] == real.numel():
        return x[real.reshape(-1).to(x.device)]
    raise _unaligned(x, where, real)


def real_samples(x: Tensor, where: str) -> Tensor:
    """``x`` laid out ``(batch, sequence, ..., features)`` with the padding's positions zero and
    the samples without a real token left out; ``x`` laid out ``(batch * sequence, features)``
    (a sample per token) without the padding's rows.

    Raises:
        ValueError: Padding to leave out, and ``x`` laid out otherwise, naming ``where``.
    """
    real = _REAL.get()
    if real is None:
        return x
    if x.dim() >= 3 and tuple(x.shape[:2]) == tuple(real.shape):
        keep = real.to(x.device).reshape(*real.shape, *([1] * (x.dim() - 2)))
        return (x * keep)[real.any(dim=1).to(x.device)]
    if x.dim() == 2 and x.shape[0] == real.numel():
        return x[real.reshape(-1).to(x.device)]
    raise _unaligned(x, where, real)


def refuse_padding(where: str) -> None:
    """Raise if padding is to be left out: ``where`` reads a tensor not laid out per token (a
    convolution's channels and patches).

    Raises:
        ValueError: Padding to leave out, naming ``where``.
    """
    real = _REAL.get()
    if real is not None:
        raise ValueError(
            f"Expected calibration batches without padding for {where!r}, which does not read "
            f"its input per token, but the batch's attention_mask {tuple(real.shape)} marks "
            "padding: its padding positions cannot be told apart from real ones. Calibrate on "
            "batches without padding (of one length, or packed, without an attention_mask)."
        )


def _unaligned(x: Tensor, where: str, real: Tensor) -> ValueError:
    return ValueError(
        f"Expected the tensor {where!r} reads per token to be laid out like the calibration "
        f"batch's attention_mask {tuple(real.shape)} (batch, sequence, ...) or flattened to "
        f"({real.numel()}, features), but got shape {tuple(x.shape)}: its padding tokens cannot "
        "be told apart from real ones. Calibrate on batches without padding (of one length, or "
        "packed, without an attention_mask)."
    )
