"""The pruner's state as JSON, for the Hugging Face Trainer's ``trainer_state.json``.

The Trainer keeps a callback's state only as JSON (``ExportableState``). The pruner's
:meth:`~tensorplay.ao.pruning.pruner.Pruner.state_dict` is plain data but for the fields that
hold tensors (the rewind snapshot, an importance score's accumulators): each of those is written
as ``{"torch.save": <base64 of its torch.save bytes>}`` and read back with ``weights_only=True``.
:func:`saved_entry` is what the callback saves (its key, the pruner's state and the kept zeros
of the weights saved beside it), :func:`find_saved` finds it again.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["find_entry", "find_saved", "from_json", "saved_entry", "to_json"]

_ENCODED = "torch.save"


def to_json(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` (a pruner's ``state_dict()``) with each field that holds tensors encoded:
    JSON-serialisable.

    Example:
        >>> import json, torch
        >>> state = {"step": 3, "snapshot": {"fc.weight": torch.ones(2)}, "history": []}
        >>> back = from_json(json.loads(json.dumps(to_json(state))))
        >>> back["step"], back["snapshot"]["fc.weight"]
        (3, tensor([1., 1.]))
    """
    return {key: _encode(value) if _holds_tensors(value) else value for key, value in state.items()}


def from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """The pruner's state that :func:`to_json` wrote (JSON read back).

    Raises:
        TypeError: An encoded field whose value is not a base64 string.
    """
    return {
        key: _decode(key, value) if _is_encoded(value) else value for key, value in data.items()
    }


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_holds_tensors(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(item) for item in value)
    return False


def _on_cpu(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().cpu()
    if isinstance(value, Mapping):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(item) for item in value)
    return value


def _encode(value: Any) -> dict[str, str]:
    buffer = io.BytesIO()
    torch.save(_on_cpu(value), buffer)
    return {_ENCODED: base64.b64encode(buffer.getvalue()).decode("ascii")}


def _is_encoded(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) == {_ENCODED}


def _decode(key: str, value: Mapping[str, Any]) -> Any:
    encoded = value[_ENCODED]
    if not isinstance(encoded, str):
        raise TypeError(
            f"Expected the saved pruner state's {key!r} to be a base64 string, but got "
            f"{type(encoded).__name__}."
        )
    return torch.load(io.BytesIO(base64.b64decode(encoded)), weights_only=True)


def saved_entry(
    state_key: str, pruner_state: Mapping[str, Any], kept_zeros: Mapping[str, Tensor]
) -> dict[str, Any]:
    """The JSON a callback saves: its ``state_key``, the pruner's state and the kept zeros of
    the weights saved with it (one encoded field: usually empty).

    Example:
        >>> import json, torch
        >>> entry = saved_entry("key", {"step": 3}, {"fc.weight": torch.tensor([0, 5])})
        >>> find_saved([{"attributes": {"saved_state": json.loads(json.dumps(entry))}}], "key")
        ({'step': 3}, {'fc.weight': tensor([0, 5])})
    """
    kept = to_json({"kept_zeros": dict(kept_zeros)})["kept_zeros"]
    return {"state_key": state_key, "pruner": to_json(pruner_state), "kept_zeros": kept}


def find_entry(entries: Any, state_key: str) -> Mapping[str, Any] | None:
    """The last of ``entries`` saved under ``state_key``, as :func:`saved_entry` made it (with
    any field a callback added); ``None`` if none.

    Example:
        >>> find_entry({"attributes": {"state_key": "k", "pruner": {"step": 2}}}, "k")
        {'state_key': 'k', 'pruner': {'step': 2}}
    """
    found = None
    for entry in entries if isinstance(entries, list) else [entries]:
        attributes = entry.get("attributes", {}) if isinstance(entry, Mapping) else {}
        saved = attributes.get("saved_state") or attributes  # before: the fields themselves
        if saved.get("state_key") == state_key and saved.get("pruner"):
            found = saved
    return found


def find_saved(
    entries: Any, state_key: str
) -> tuple[dict[str, Any], dict[str, Tensor] | None] | None:
    """The pruner's state and the kept zeros (``None``: saved before they were kept) of the
    last of ``entries`` (a callback class's entries in ``trainer_state.json``: one, or a list
    that the Trainer appends to at each checkpoint) saved under ``state_key``; ``None`` if none.

    Example:
        >>> find_saved({"attributes": {"state_key": "k", "pruner": {"step": 2}}}, "k")
        ({'step': 2}, None)
    """
    found = find_entry(entries, state_key)
    if found is None:
        return None
    kept = found.get("kept_zeros")
    kept_zeros = None if kept is None else from_json({"kept_zeros": kept})["kept_zeros"]
    return from_json(found["pruner"]), kept_zeros
