"""The sparsity of any checkpoint: ``python -m tensorplay.report CKPT [--plot PNG]``.

Reads a Lightning checkpoint (a dict with a ``"state_dict"``) or a plain ``state_dict`` and prints
one row per tensor (shape, units, pruned units, sparsity) and the global figure; ``--plot`` also
saves the per-tensor sparsity as a bar chart (needs matplotlib). Installed as the console script
``tensorplay-report``.

Which tensors are reported:

* a *pruned* state_dict (``<name>_orig`` and ``<name>_mask`` keys): every pruned tensor, a unit
  counting as pruned where its mask is 0;
* a *permanent* or dense one (no masks): every floating-point ``weight`` with two or more
  dimensions (the weights of ``Linear`` and convolution layers, the default pruning targets),
  a unit counting as pruned where it is 0.

The file is read with ``torch.load(path, map_location="cpu", weights_only=True)``: an untrusted
checkpoint cannot run code, and one holding anything but tensors and plain data is refused.

Example:
    >>> import torch
    >>> report = state_dict_report({"fc.weight": torch.tensor([[0.0, 1.0], [0.0, 0.0]])})
    >>> report.pruned, report.total
    (3, 4)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from tensorplay.ao.pruning.checkpoint import pruned_names
from tensorplay.ao.pruning.stats import SparsityReport, TensorSparsity

__all__ = ["load_state_dict", "main", "plot_layer_sparsity", "state_dict_report"]

# The first bytes of torch.save's zip format and of its legacy pickle format.
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")


def load_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Load the tensors of a checkpoint file safely (``weights_only=True``, on the CPU).

    Args:
        path: A Lightning checkpoint or a file written by ``torch.save(model.state_dict())``.

    Returns:
        The ``state_dict``: only its tensor entries, in file order.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        ValueError: The file was not written by ``torch.save``, is corrupt, holds objects that
            ``weights_only=True`` refuses, or holds no ``state_dict``.

    Example:
        >>> import tempfile, torch
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 3}, f"{tmp}/a.ckpt")
        ...     load_state_dict(f"{tmp}/a.ckpt")
        {'w': tensor([1., 1.])}
    """
    path = Path(path)
    loaded = _safe_load(path)
    state = loaded.get("state_dict", loaded) if isinstance(loaded, Mapping) else loaded
    if not isinstance(state, Mapping) or not any(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(
            f"Expected {str(path)!r} to hold a state_dict or a dict with a 'state_dict', but got "
            f"{_describe(loaded)}."
        )
    return {str(key): value for key, value in state.items() if isinstance(value, Tensor)}


def state_dict_report(state_dict: Mapping[str, Tensor]) -> SparsityReport:
    """The sparsity of the prunable tensors of ``state_dict`` (see the module docstring).

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
    names = pruned_names(state_dict)
    if names:
        tensors = [(name, state_dict[name + "_mask"]) for name in names]
    else:
        tensors = [(key, value) for key, value in state_dict.items() if _is_weight(key, value)]
    if not tensors:
        raise ValueError(
            "Expected a state_dict with pruned tensors (`<name>_orig` and `<name>_mask` keys) or "
            "floating-point weights of two or more dimensions, but got none among "
            f"{len(state_dict)} keys."
        )
    rows = tuple(
        TensorSparsity(name, tuple(t.shape), t.numel(), t.numel() - int(torch.count_nonzero(t)))
        for name, t in tensors
    )
    return SparsityReport(rows)


def plot_layer_sparsity(report: SparsityReport, path: str | Path) -> Path:
    """Save a bar chart of each tensor's sparsity, with the global sparsity as a line.

    Needs matplotlib; it draws on its own figure and leaves pyplot's global state alone.

    Args:
        report: A :class:`~tensorplay.ao.pruning.stats.SparsityReport`.
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
    """The command line: print the report of a checkpoint, optionally save its plot.

    Exits with status 2 and a message for a missing file, a file that is no checkpoint and a
    checkpoint without prunable tensors.

    Example:
        >>> import tempfile, torch
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     torch.save({"fc.weight": torch.tensor([[0.0, 1.0]])}, f"{tmp}/w.pt")
        ...     main([f"{tmp}/w.pt"])  # doctest: +ELLIPSIS
        permanent or dense state_dict (zeros counted): .../w.pt
        tensor     shape   numel  pruned  sparsity
        fc.weight  (1, 2)      2       1    50.00%
        total                  2       1    50.00%
        global sparsity 50.00%: 1 of 2 units pruned
        0
    """
    parser = argparse.ArgumentParser(
        prog="tensorplay-report",
        description="Print the per-tensor and global sparsity of a checkpoint or state_dict.",
    )
    parser.add_argument("checkpoint", type=Path, help="a Lightning .ckpt or a saved state_dict")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also save the per-tensor bars")
    args = parser.parse_args(argv)
    try:
        state_dict = load_state_dict(args.checkpoint)
        report = state_dict_report(state_dict)
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))  # prints usage and the message, exits with status 2
    if pruned_names(state_dict):
        kind = "pruned state_dict (units whose mask is 0 counted)"
    else:
        kind = "permanent or dense state_dict (zeros counted)"
    print(f"{kind}: {args.checkpoint}")
    print(report)
    print(
        f"global sparsity {100 * report.sparsity:.2f}%: "
        f"{report.pruned:,} of {report.total:,} units pruned"
    )
    if args.plot is not None:
        try:
            print(f"plot: {plot_layer_sparsity(report, args.plot)}")
        except ImportError:
            parser.error("--plot needs matplotlib: pip install matplotlib")
    return 0


def _safe_load(path: Path) -> object:
    """``torch.load`` with ``weights_only=True``, its failures turned into one clear error each."""
    if not path.is_file():
        raise FileNotFoundError(f"Expected `path` to be a checkpoint file, but got {str(path)!r}.")
    with open(path, "rb") as file:
        head = file.read(4)
    if not head.startswith(_TORCH_MAGIC):
        raise ValueError(
            f"Expected {str(path)!r} to be a checkpoint written by torch.save, but it starts with "
            f"{head!r}."
        )
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
