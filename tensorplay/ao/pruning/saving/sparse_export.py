"""A compressed export of pruned weights: a bitmask and the non-zero values, in safetensors.

A pruned checkpoint holds every weight twice (``_orig`` and a float ``_mask``); even a permanent
one stores each pruned zero in full. :func:`save_sparse` writes a model's permanent weights
with each sparse floating-point tensor as one bit per unit and its non-zero values only: at 90%
sparsity an fp32 model takes about 0.13 of its dense size. :func:`load_sparse` reads it back
bit-exact, as a plain state_dict (zeros in place) that loads strictly into the unpruned model.

Needs the optional ``safetensors`` package (``pip install 'tensorplay[safetensors]'``), imported
only when these functions run.

**File format** (``tensorplay.sparse``, version 1): a ``.safetensors`` file whose
``__metadata__`` has ``"format": "tensorplay.sparse"``, ``"format_version": "1"`` and
``"tensors"``, a JSON object that maps every tensor name, in state_dict order, to
``{"shape": [...], "dtype": "float32", "encoding": ...}``:

* ``"dense"``: stored as is under its name (integer, bool and empty tensors, and floating-point
  ones the bitmask would not make smaller);
* ``"bitmask"``: stored as ``<name>:bitmask``, ``uint8`` of ``ceil(numel / 8)`` bytes, and
  ``<name>:values``, 1-D in the tensor's dtype. Unit ``i`` of the tensor in row-major order is
  bit ``i % 8`` (least significant first) of byte ``i // 8``; it is 1 when the unit's bits are not
  all zero (so ``-0.0`` and NaN are values, kept bit for bit), and the values are those units in
  row-major order. Padding bits are 0. A floating-point tensor is stored this way when that is
  smaller: when ``ceil(numel / 8) + nnz * itemsize < numel * itemsize``;
* ``"alias"`` with ``"of": "<earlier name>"``: a tied weight stored once, under the earlier name.

Example:
    >>> import tempfile
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.parity.methods import l1_unstructured
    >>> model = l1_unstructured(nn.Linear(64, 64), "weight", amount=0.9)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = save_sparse(model, f"{tmp}/model.safetensors")
    ...     state = load_sparse(f"{tmp}/model.safetensors")
    >>> fresh = nn.Linear(64, 64)
    >>> fresh.load_state_dict(state, strict=True)
    <All keys matched successfully>
    >>> torch.equal(fresh.weight, model.weight)
    True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.masking.permanent import (
    masked_tensor,
    permanent_state_dict,
    share_storage,
    view_identity,
)
from tensorplay.ao.pruning.masking.readers import saved_mask_keys

__all__ = ["is_sparse_export", "load_sparse", "save_sparse"]

_FORMAT = "tensorplay.sparse"
_VERSION = "1"
_MASK, _VALUES = ":bitmask", ":values"
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def save_sparse(model_or_state_dict: nn.Module | Mapping[str, Tensor], path: str | Path) -> Path:
    """Write the permanent weights of a model as a compressed ``.safetensors`` file.

    Args:
        model_or_state_dict: A model (under pruning or not: its
            :func:`~tensorplay.ao.pruning.masking.permanent.permanent_state_dict` is written), a
            pruned state_dict (``<name>_orig``/``<name>_mask`` keys, or a lean ``<name>`` with a
            bool ``<name>_mask``; made permanent first) or a
            plain one.
        path: The file to write (conventionally ``*.safetensors``).

    Returns:
        ``path``.

    Raises:
        ImportError: ``safetensors`` is not installed.
        TypeError: Neither a module nor a mapping of names to tensors.
        ValueError: A name ending in ``:bitmask`` or ``:values`` that clashes with a stored key.

    Example:
        >>> import tempfile, torch
        >>> state = {"w": torch.tensor([[0.0, 0.0, 3.0, 0.0]] * 8), "step": torch.tensor(7)}
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = save_sparse(state, f"{tmp}/w.safetensors")
        ...     loaded = load_sparse(path)
        >>> torch.equal(loaded["w"], state["w"]), loaded["step"]
        (True, tensor(7))
    """
    safetensors_torch = _import_safetensors("save_sparse")
    state = _permanent(model_or_state_dict)
    tensors: dict[str, Tensor] = {}
    entries: dict[str, dict[str, Any]] = {}
    stored: dict[int, str] = {}  # id of a tensor already written -> its name
    memory: set[int] = set()  # storages written, so no two stored tensors share one
    for name, tensor in state.items():
        if id(tensor) in stored:
            entries[name] = {"encoding": "alias", "of": stored[id(tensor)]}
            continue
        stored[id(tensor)] = name
        entries[name], parts = _encode(name, tensor)
        for key, part in parts.items():
            if key in tensors:
                raise ValueError(
                    f"Expected tensor names without the suffixes {_MASK!r} and {_VALUES!r}, but "
                    f"{key!r} is both a tensor and a part of one."
                )
            if part.numel() and part.untyped_storage().data_ptr() in memory:
                part = part.clone()  # safetensors refuses two tensors in one storage
            if part.numel():
                memory.add(part.untyped_storage().data_ptr())
            tensors[key] = part
    metadata = {"format": _FORMAT, "format_version": _VERSION, "tensors": json.dumps(entries)}
    path = Path(path)
    safetensors_torch.save_file(tensors, str(path), metadata=metadata)
    return path


def load_sparse(path: str | Path) -> dict[str, Tensor]:
    """Read a file written by :func:`save_sparse`: a plain state_dict, bit-exact, on the CPU.

    Tied weights stored once come back as one tensor object under all their names.

    Args:
        path: The ``.safetensors`` file.

    Returns:
        The tensors by name, in the order they were saved.

    Raises:
        ImportError: ``safetensors`` is not installed.
        FileNotFoundError: ``path`` is not a file.
        ValueError: The file is not a readable safetensors file, not a ``tensorplay.sparse``
            export, or inconsistent (the message names ``path``).

    Example:
        >>> import tempfile, torch
        >>> weight = torch.tensor([0.0, -0.0, 2.5, 0.0])
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     loaded = load_sparse(save_sparse({"a": weight, "b": weight}, f"{tmp}/w.safetensors"))
        >>> loaded["a"] is loaded["b"], torch.equal(loaded["a"].view(torch.int32), weight.view(torch.int32))
        (True, True)
    """  # noqa: E501
    safetensors_torch = _import_safetensors("load_sparse")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Expected `path` to be a file, but got {str(path)!r}.")
    try:
        raw = safetensors_torch.load_file(str(path), device="cpu")
        metadata = _read_metadata(path)
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise ValueError(
            f"Expected {str(path)!r} to be a readable safetensors file, but: {error}"
        ) from error
    entries = _entries(metadata, path)
    out: dict[str, Tensor] = {}
    for name, entry in entries.items():
        try:
            out[name] = _decode(name, entry, raw, out)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(
                f"Expected {str(path)!r} to be a consistent {_FORMAT} export, but tensor "
                f"{name!r}: {error}"
            ) from error
    return out


def _encode(name: str, tensor: Tensor) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The metadata entry of one tensor and the tensors to store for it, on the CPU."""
    entry: dict[str, Any] = {"shape": list(tensor.shape), "dtype": _dtype_name(tensor.dtype)}
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    bits = _nonzero_bits(flat)
    if bits is not None and _bitmask_is_smaller(flat, bits):
        entry["encoding"] = "bitmask"
        return entry, {name + _MASK: _pack_bits(bits), name + _VALUES: flat[bits]}
    entry["encoding"] = "dense"
    return entry, {name: flat.reshape(tensor.shape)}


def _read_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file (empty if it has none)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as file:
        return dict(file.metadata() or {})


def _is_sparse_export(metadata: Mapping[str, str]) -> bool:
    return metadata.get("format") == _FORMAT


def is_sparse_export(path: str | Path) -> bool:
    """Whether the safetensors file ``path`` was written by :func:`save_sparse`.

    Raises:
        Exception: safetensors' own error for a file that is not a readable safetensors file.

    Example:
        >>> import tempfile, torch
        >>> from pathlib import Path
        >>> from safetensors.torch import save_file
        >>> folder = Path(tempfile.mkdtemp())
        >>> save_file({"w": torch.zeros(2)}, folder / "plain.safetensors")
        >>> is_sparse_export(folder / "plain.safetensors")
        False
        >>> is_sparse_export(save_sparse({"w": torch.zeros(2)}, folder / "sparse.safetensors"))
        True
    """
    return _is_sparse_export(_read_metadata(Path(path)))


def _entries(metadata: Mapping[str, str], path: Path) -> dict[str, dict[str, Any]]:
    if not _is_sparse_export(metadata):
        raise ValueError(
            f"Expected {str(path)!r} to be a {_FORMAT} export (written by save_sparse), but its "
            f"metadata has format {metadata.get('format')!r}; read a plain .safetensors file "
            "with safetensors.torch.load_file."
        )
    if metadata.get("format_version") != _VERSION:
        raise ValueError(
            f"Expected {str(path)!r} to have {_FORMAT} version {_VERSION!r}, but got "
            f"{metadata.get('format_version')!r}."
        )
    try:
        entries = json.loads(metadata["tensors"])
    except (KeyError, json.JSONDecodeError) as error:
        raise ValueError(
            f"Expected {str(path)!r} to hold a JSON 'tensors' table in its metadata, but: {error!r}"
        ) from error
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise ValueError(
            f"Expected the 'tensors' table of {str(path)!r} to map names to objects, but got "
            f"{type(entries).__name__}."
        )
    return entries


def _decode(
    name: str, entry: Mapping[str, Any], raw: Mapping[str, Tensor], done: Mapping[str, Tensor]
) -> Tensor:
    encoding = entry.get("encoding")
    if encoding == "alias":
        if entry.get("of") not in done:
            raise ValueError(f"an alias of {entry.get('of')!r}, which is no earlier tensor")
        return done[entry["of"]]
    shape, dtype = _shape(entry.get("shape")), _dtype(entry.get("dtype"))
    if encoding == "dense":
        tensor = _stored(raw, name)
        _expect(tensor.dtype == dtype and tuple(tensor.shape) == shape, "dtype or shape", tensor)
        return tensor
    if encoding != "bitmask":
        raise ValueError(f"unknown encoding {encoding!r}")
    packed, values = _stored(raw, name + _MASK), _stored(raw, name + _VALUES)
    numel = int(torch.Size(shape).numel())
    _expect(packed.dtype == torch.uint8 and packed.shape == ((numel + 7) // 8,), "bitmask", packed)
    all_bits = _unpack_bits(packed)
    bits = all_bits[:numel]
    _expect(not bool(all_bits[numel:].any()), "bitmask padding", packed)
    _expect(values.dtype == dtype and values.shape == (int(bits.sum()),), "values", values)
    flat = torch.zeros(numel, dtype=dtype)
    flat[bits] = values
    return flat.reshape(shape)


def _stored(raw: Mapping[str, Tensor], key: str) -> Tensor:
    if key not in raw:
        raise ValueError(f"the file holds no tensor {key!r}")
    return raw[key]


def _expect(ok: bool, what: str, got: Tensor) -> None:
    if not ok:
        raise ValueError(
            f"its {what} does not match the metadata ({got.dtype}, {tuple(got.shape)})"
        )


def _permanent(obj: nn.Module | Mapping[str, Tensor]) -> dict[str, Tensor]:
    if isinstance(obj, nn.Module):
        return permanent_state_dict(obj)
    if not isinstance(obj, Mapping):
        raise TypeError(
            f"Expected `model_or_state_dict` to be an nn.Module or a state_dict, but got "
            f"{type(obj).__name__}."
        )
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise TypeError(
                f"Expected a state_dict of str keys and tensors, but {key!r} holds "
                f"{type(value).__name__}."
            )
    state = share_storage(obj)
    saved = saved_mask_keys(state)
    by_values = {values: (name, mask) for name, (values, mask) in saved.items()}
    masks = {mask for _, mask in saved.values()}
    masked: dict[tuple[object, ...], Tensor] = {}
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if key in by_values:  # a lean tensor is zero already, but maybe -0.0
            name, mask_key = by_values[key]
            mask = state[mask_key]
            identity = (view_identity(value) or id(value), view_identity(mask) or id(mask))
            if identity not in masked:
                masked[identity] = masked_tensor(value, mask)
            out[name] = masked[identity]
        elif key not in masks:
            out[key] = value
    return out


def _nonzero_bits(flat: Tensor) -> Tensor | None:
    """Where the units of a 1-D floating-point tensor are not bitwise zero; None otherwise."""
    if not flat.is_floating_point() or flat.numel() == 0:
        return None
    return flat.view(_INT_OF_SIZE[flat.element_size()]) != 0


def _bitmask_is_smaller(flat: Tensor, bits: Tensor) -> bool:
    size = flat.element_size()
    return (flat.numel() + 7) // 8 + int(bits.sum()) * size < flat.numel() * size


def _pack_bits(bits: Tensor) -> Tensor:
    """``uint8``, unit ``i`` in bit ``i % 8`` (least significant first) of byte ``i // 8``."""
    padded = torch.zeros((bits.numel() + 7) // 8 * 8, dtype=torch.uint8)
    padded[: bits.numel()] = bits
    rows = padded.view(-1, 8)
    packed = rows[:, 0].clone()
    for bit in range(1, 8):
        packed |= rows[:, bit] << bit
    return packed


def _unpack_bits(packed: Tensor) -> Tensor:
    """The inverse of :func:`_pack_bits`, padding bits included."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((packed.unsqueeze(1) >> shifts) & 1).bool().reshape(-1)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: object) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _shape(shape: object) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"shape {shape!r} is not a list of sizes")
    return tuple(shape)


def _import_safetensors(caller: str) -> Any:
    try:
        import safetensors.torch
    except ImportError as error:
        raise ImportError(
            f"`{caller}` needs the optional package safetensors: "
            "pip install 'tensorplay[safetensors]'"
        ) from error
    return safetensors.torch
