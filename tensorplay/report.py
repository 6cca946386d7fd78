"""The sparsity of a checkpoint or weights file: ``python -m tensorplay.report PATH [--plot PNG]``.

Reads, and says which it read:

* a ``torch.save`` file: a Lightning checkpoint (a dict with a ``"state_dict"``) or a plain
  ``state_dict``;
* a ``.safetensors`` file, plain or a compressed export of
  :func:`~tensorplay.ao.pruning.save_sparse` (recognised by its metadata);
* a Hugging Face model folder: ``model.safetensors``, sharded ``model.safetensors.index.json``,
  or ``pytorch_model.bin`` (sharded too, via ``pytorch_model.bin.index.json``).

It prints one row per tensor (shape, units, pruned units, sparsity) and the global figure;
``--plot`` also saves the per-tensor sparsity as a bar chart (needs matplotlib). Installed as the
console script ``tensorplay-report``.

Which tensors are reported:

* a *pruned* state_dict (``<name>_orig`` and ``<name>_mask`` keys, or the lean mode's
  ``<name>`` and bool ``<name>_mask``): every pruned tensor, a unit counting as pruned where its
  mask is 0 (``False``);
* a *permanent* or dense one (no masks): every floating-point ``weight`` with two or more
  dimensions (the weights of ``Linear`` and convolution layers, the default pruning targets),
  a unit counting as pruned where it is 0.

Zeros are not always pruning. A weight without a mask whose every unit is 0 (a zero-initialised
output layer, LoRA's ``B``) is listed apart, under "not counted", and left out of the table and
of the global figure: a file without masks cannot tell it from a tensor pruned entirely. A tensor
saved under several names (tied weights, such as an embedding and an LM head) is counted once.

Every file is read without running code: ``torch.load(..., weights_only=True)`` (a file holding
anything but tensors and plain data is refused), and safetensors, which holds only tensors.
Reading safetensors needs the optional ``safetensors`` package.

Example:
    >>> import torch
    >>> report = state_dict_report({"fc.weight": torch.tensor([[0.0, 1.0], [0.0, 0.0]])})
    >>> report.pruned, report.total
    (3, 4)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from tensorplay.ao.pruning.masking.permanent import share_storage
from tensorplay.ao.pruning.masking.readers import saved_mask_names
from tensorplay.ao.pruning.masking.stats import SparsityReport, TensorSparsity

__all__ = [
    "all_zero_tensors",
    "load_state_dict",
    "main",
    "plot_layer_sparsity",
    "read_weights",
    "state_dict_report",
]

# The first bytes of torch.save's zip format and of its legacy pickle format.
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")
# Hugging Face folder files, in the order they are looked for.
_HF_FILES = (
    "model.safetensors.index.json",
    "model.safetensors",
    "pytorch_model.bin.index.json",
    "pytorch_model.bin",
)


def read_weights(path: str | Path) -> tuple[dict[str, Tensor], str]:
    """Load the tensors of a checkpoint, a weights file or a Hugging Face folder, safely.

    Args:
        path: A file or a folder (see the module docstring for the formats).

    Returns:
        The ``state_dict`` (only its tensor entries, on the CPU) and a description of the format
        read, e.g. ``"safetensors file"``.

    Raises:
        FileNotFoundError: ``path`` is neither a file nor a folder.
        ValueError: Not one of the formats, corrupt, truncated, holding objects that
            ``weights_only=True`` refuses, or holding no ``state_dict``; or safetensors is needed
            and not installed. The message names the file.

    Example:
        >>> import tempfile, torch
        >>> from safetensors.torch import save_file
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     save_file({"w": torch.ones(2)}, f"{tmp}/model.safetensors")
        ...     read_weights(tmp)
        ({'w': tensor([1., 1.])}, 'Hugging Face folder (model.safetensors)')
    """
    path = Path(path)
    if path.is_dir():
        return _read_folder(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"Expected `path` to be a checkpoint file or a model folder, but got {str(path)!r}."
        )
    return _read_file(path)


def load_state_dict(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a checkpoint, weights file or model folder: :func:`read_weights` without
    the format.

    Example:
        >>> import tempfile, torch
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 3}, f"{tmp}/a.ckpt")
        ...     load_state_dict(f"{tmp}/a.ckpt")
        {'w': tensor([1., 1.])}
    """
    return read_weights(path)[0]


def state_dict_report(state_dict: Mapping[str, Tensor]) -> SparsityReport:
    """The sparsity of the prunable tensors of ``state_dict`` (see the module docstring).

    Left out: weights without a mask that are all zero (see :func:`all_zero_tensors`), and
    every name of a tensor after the first (tied weights are counted once).

    Args:
        state_dict: Tensors by fully qualified name, pruned (``_orig``/``_mask``) or not.

    Returns:
        One row per reported tensor, in key order.

    Raises:
        ValueError: ``state_dict`` holds no prunable tensor.

    Example:
        >>> import torch
        >>> state = {"fc.weight_orig": torch.ones(2, 3), "fc.bias": torch.zeros(2),
        ...          "fc.weight_mask": torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])}
        >>> print(state_dict_report(state))
        tensor     shape   numel  pruned  sparsity
        fc.weight  (2, 3)      6       3    50.00%
        total                  6       3    50.00%
    """
    return SparsityReport(tuple(_classify(state_dict)[0]))


def all_zero_tensors(state_dict: Mapping[str, Tensor]) -> list[TensorSparsity]:
    """The weights of ``state_dict`` without a mask whose every unit is 0.

    Such a tensor was zero-initialised (LoRA's ``B``, some output layers) or pruned entirely
    and then made permanent: without a mask a file cannot tell which, so the report does not
    count it as pruned.

    Example:
        >>> import torch
        >>> state = {"lora_B.weight": torch.zeros(8, 2), "lora_A.weight": torch.ones(2, 8)}
        >>> [(row.name, row.numel) for row in all_zero_tensors(state)]
        [('lora_B.weight', 16)]
        >>> print(state_dict_report(state))
        tensor         shape   numel  pruned  sparsity
        lora_A.weight  (2, 8)     16       0     0.00%
        total                     16       0     0.00%
    """
    return _classify(state_dict)[1]


def plot_layer_sparsity(report: SparsityReport, path: str | Path) -> Path:
    """Save a bar chart of each tensor's sparsity, with the global sparsity as a line.

    Needs matplotlib; it draws on its own figure and leaves pyplot's global state alone.

    Args:
        report: A :class:`~tensorplay.ao.pruning.masking.stats.SparsityReport`.
        path: Where to write the image; the format follows the suffix (``.png``, ``.svg``, ...).

    Returns:
        ``path``.

    Example:
        >>> import tempfile, torch
        >>> report = state_dict_report({"fc.weight": torch.tensor([[0.0, 1.0]])})
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     plot_layer_sparsity(report, f"{tmp}/layers.png").stat().st_size > 0
        True
    """
    from matplotlib.figure import Figure  # optional dependency, only needed here

    path = Path(path)
    names = [row.name for row in report.rows]
    figure = Figure(figsize=(6.4, 1.6 + 0.35 * len(names)), layout="constrained")
    axes = figure.add_subplot()
    bars = axes.barh(names, [100 * row.sparsity for row in report.rows], color="tab:blue")
    axes.bar_label(bars, fmt="%.1f%%", padding=2)
    axes.axvline(
        100 * report.sparsity, color="tab:red", linestyle="--", label="global (all tensors)"
    )
    if report.target is not None:
        axes.axvline(100 * report.target, color="black", linestyle=":", label="target")
    axes.invert_yaxis()  # first tensor on top, like the table
    axes.set_xlim(0, 110)
    axes.set_xlabel("sparsity (% of units pruned)")
    axes.set_title(f"Sparsity per tensor: {report.pruned:,} of {report.total:,} units pruned")
    figure.legend(loc="outside lower center", ncols=2)
    figure.savefig(path, dpi=120)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: print the report of a checkpoint, weights file or model folder.

    Exits with status 2 and a message for a missing path, a file in none of the formats, a
    corrupt or truncated one, and one without prunable tensors.

    Example:
        >>> import tempfile, torch
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     torch.save({"fc.weight": torch.tensor([[0.0, 1.0]])}, f"{tmp}/w.pt")
        ...     main([f"{tmp}/w.pt"])  # doctest: +ELLIPSIS
        torch.save file (state_dict): .../w.pt
        permanent or dense state_dict (zeros counted)
        tensor     shape   numel  pruned  sparsity
        fc.weight  (1, 2)      2       1    50.00%
        total                  2       1    50.00%
        global sparsity 50.00%: 1 of 2 units pruned
        0
    """
    parser = argparse.ArgumentParser(
        prog="tensorplay-report",
        description="Print the per-tensor and global sparsity of a checkpoint, a .safetensors "
        "file or a Hugging Face model folder.",
    )
    parser.add_argument(
        "checkpoint",
        type=Path,
        help="a Lightning .ckpt, a saved state_dict, a .safetensors file or a model folder",
    )
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also save the per-tensor bars")
    args = parser.parse_args(argv)
    try:
        state_dict, source = read_weights(args.checkpoint)
        rows, zeros, aliases = _classify(state_dict)
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))  # prints usage and the message, exits with status 2
    report = SparsityReport(tuple(rows))
    if saved_mask_names(state_dict):
        kind = "pruned state_dict (units whose mask is 0 counted)"
    else:
        kind = "permanent or dense state_dict (zeros counted)"
    print(f"{source}: {args.checkpoint}")
    print(kind)
    print(report)
    print(
        f"global sparsity {100 * report.sparsity:.2f}%: "
        f"{report.pruned:,} of {report.total:,} units pruned"
    )
    if zeros:
        listed = ", ".join(f"{row.name} {row.shape}" for row in zeros)
        units = sum(row.numel for row in zeros)
        print(
            f"not counted: {len(zeros)} all-zero weight(s) without a mask, {units:,} units "
            f"(zero-initialised, or pruned entirely: a file without masks cannot tell): {listed}"
        )
    if aliases:
        listed = ", ".join(f"{name} = {first}" for name, first in aliases.items())
        print(f"counted once (tied): {listed}")
    if args.plot is not None:
        try:
            print(f"plot: {plot_layer_sparsity(report, args.plot)}")
        except ImportError:
            parser.error("--plot needs matplotlib: pip install matplotlib")
    return 0


def _classify(
    state_dict: Mapping[str, Tensor],
) -> tuple[list[TensorSparsity], list[TensorSparsity], dict[str, str]]:
    """``(counted rows, all-zero weights without a mask, {later name: first name})``."""
    state = share_storage(state_dict)  # tied entries become one object
    names = saved_mask_names(state)
    weights = [(key, value) for key, value in state.items() if _is_weight(key, value)]
    tensors = [(name, state[name + "_mask"]) for name in names] if names else weights
    if not tensors:
        raise ValueError(
            "Expected a state_dict with pruned tensors (`<name>_orig` and `<name>_mask` keys) or "
            "floating-point weights of two or more dimensions, but got none among "
            f"{len(state_dict)} keys."
        )
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}

    def rows(pairs: list[tuple[str, Tensor]]) -> list[TensorSparsity]:
        out = []
        for name, tensor in pairs:
            if id(tensor) in first:
                aliases[name] = first[id(tensor)]
            else:
                first[id(tensor)] = name
                out.append(_row(name, tensor))
        return out

    counted = rows([(name, t) for name, t in tensors if names or not _all_zero(t)])
    zeros = rows([(name, t) for name, t in weights if _all_zero(t)])
    return counted, zeros, aliases


def _row(name: str, tensor: Tensor) -> TensorSparsity:
    numel = tensor.numel()
    return TensorSparsity(
        name, tuple(tensor.shape), numel, numel - int(torch.count_nonzero(tensor))
    )


def _all_zero(tensor: Tensor) -> bool:
    return tensor.numel() > 0 and not bool(torch.count_nonzero(tensor))


def _read_file(path: Path) -> tuple[dict[str, Tensor], str]:
    with open(path, "rb") as file:
        head = file.read(9)
    # Safetensors first: its 8-byte header length may start with torch's legacy b"\x80".
    if head[8:9] == b"{":  # a little-endian header length, then the JSON header
        return _read_safetensors(path)
    if head.startswith(_TORCH_MAGIC):
        return _read_torch(path)
    raise ValueError(
        f"Expected {str(path)!r} to be a checkpoint written by torch.save or a .safetensors file, "
        f"but it starts with {head[:4]!r}."
    )


def _read_torch(path: Path) -> tuple[dict[str, Tensor], str]:
    loaded = _safe_load(path)
    lightning = isinstance(loaded, Mapping) and "state_dict" in loaded
    state = loaded["state_dict"] if lightning else loaded  # type: ignore[index]
    if not isinstance(state, Mapping) or not any(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(
            f"Expected {str(path)!r} to hold a state_dict or a dict with a 'state_dict', but got "
            f"{_describe(loaded)}."
        )
    tensors = {str(key): value for key, value in state.items() if isinstance(value, Tensor)}
    return tensors, f"torch.save file ({'Lightning checkpoint' if lightning else 'state_dict'})"


def _read_safetensors(path: Path) -> tuple[dict[str, Tensor], str]:
    try:
        import safetensors.torch

        from tensorplay.ao.pruning.saving.sparse_export import is_sparse_export, load_sparse
    except ImportError as error:
        raise ValueError(
            f"Expected the optional package safetensors, to read {str(path)!r}: "
            "pip install 'tensorplay[safetensors]'"
        ) from error
    try:
        if not is_sparse_export(path):
            return safetensors.torch.load_file(str(path), device="cpu"), "safetensors file"
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise ValueError(
            f"Expected {str(path)!r} to be a readable safetensors file, but: {error}"
        ) from error
    return load_sparse(path), "tensorplay.sparse export (bitmask + non-zero values, safetensors)"


def _read_folder(folder: Path) -> tuple[dict[str, Tensor], str]:
    found = next((folder / name for name in _HF_FILES if (folder / name).is_file()), None)
    if found is None:
        raise ValueError(
            f"Expected {str(folder)!r} to be a Hugging Face model folder holding one of "
            f"{', '.join(_HF_FILES)}, but it holds none."
        )
    if not found.name.endswith(".index.json"):
        return _read_file(found)[0], f"Hugging Face folder ({found.name})"
    weight_map = _read_index(found)
    shards: dict[str, dict[str, Tensor]] = {}
    state: dict[str, Tensor] = {}
    for key, shard in weight_map.items():
        if shard not in shards:
            if Path(shard).name != shard or not (folder / shard).is_file():
                raise ValueError(
                    f"Expected the shard {shard!r} named in {str(found)!r} to be a file in "
                    f"{str(folder)!r}, but it is not."
                )
            shards[shard] = _read_file(folder / shard)[0]
        if key not in shards[shard]:
            raise ValueError(
                f"Expected the shard {str(folder / shard)!r} to hold {key!r}, as "
                f"{found.name} says, but it does not."
            )
        state[key] = shards[shard][key]
    return state, f"Hugging Face folder ({len(shards)} shards via {found.name})"


def _read_index(path: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(path.read_text())["weight_map"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(
            f"Expected {str(path)!r} to be a JSON index with a 'weight_map', but: {error!r}"
        ) from error
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise ValueError(
            f"Expected the 'weight_map' of {str(path)!r} to map tensor names to file names."
        )
    return weight_map


def _safe_load(path: Path) -> object:
    """``torch.load`` with ``weights_only=True``, its failures turned into one clear error each."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for corrupt or unsafe files
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        unsafe = [line for line in lines if "Unsupported global" in line]
        if unsafe:
            raise ValueError(
                f"Expected {str(path)!r} to hold only tensors and plain data, but "
                f"weights_only=True refused it (loading it could run code): {unsafe[0]}"
            ) from error
        reason = lines[0] if lines else type(error).__name__
        raise ValueError(f"Expected {str(path)!r} to be a readable checkpoint: {reason}") from error


def _is_weight(key: str, value: Tensor) -> bool:
    return key.rpartition(".")[2] == "weight" and value.dim() >= 2 and value.is_floating_point()


def _describe(loaded: object) -> str:
    if isinstance(loaded, Mapping):
        keys = list(loaded)[:5]
        return f"a dict with no tensors (keys {keys}{', ...' if len(loaded) > 5 else ''})"
    return f"a {type(loaded).__name__}"


if __name__ == "__main__":
    sys.exit(main())
