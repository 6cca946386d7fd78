"""The pruner's state as JSON, for the Hugging Face Trainer's ``trainer_state.json``.

The Trainer keeps a callback's state only as JSON (``ExportableState``). The pruner's
:meth:`~tensorplay.ao.pruning.pruner.Pruner.state_dict` is plain data but for the rewind
snapshot, whose tensors are written as one base64 string of ``torch.save`` bytes and read back
with ``weights_only=True``.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["from_json", "to_json"]


def to_json(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` (a pruner's ``state_dict()``) with its snapshot encoded: JSON-serialisable.

    Example:
        >>> import json, torch
        >>> state = {"step": 3, "snapshot": {"fc.weight": torch.ones(2)}}
        >>> back = from_json(json.loads(json.dumps(to_json(state))))
        >>> back["step"], back["snapshot"]["fc.weight"]
        (3, tensor([1., 1.]))
    """
    snapshot = state.get("snapshot")
    if snapshot is None:
        return dict(state)
    buffer = io.BytesIO()
    torch.save({name: value.detach().cpu() for name, value in snapshot.items()}, buffer)
    return {**state, "snapshot": base64.b64encode(buffer.getvalue()).decode("ascii")}


def from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """The pruner's state that :func:`to_json` wrote (JSON read back).

    Raises:
        TypeError: A snapshot that is neither ``None`` nor the string :func:`to_json` writes.
    """
    snapshot = data.get("snapshot")
    if snapshot is None:
        return dict(data)
    if not isinstance(snapshot, str):
        raise TypeError(
            f"Expected the saved snapshot to be a base64 string or None, but got {snapshot!r}."
        )
    buffer = io.BytesIO(base64.b64decode(snapshot))
    return {**data, "snapshot": torch.load(buffer, weights_only=True)}
