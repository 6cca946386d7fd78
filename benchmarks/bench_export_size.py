"""File sizes of a 90%-sparse model in each way it can be saved, against the dense file.

Run (about 30 seconds on a 2-core machine; needs ``transformers`` and ``safetensors``)::

    python benchmarks/bench_export_size.py            # ResNet-18 (11.7M parameters)
    python benchmarks/bench_export_size.py --tiny     # a few thousand parameters, for the tests

The model is Hugging Face's ``ResNetForImageClassification`` built from a ResNet-18 config
(``layer_type="basic"``, depths 2-2-2-2, widths 64-512, 1000 classes; random init, nothing
downloaded). Every convolution and the classifier are pruned together with
``global_unstructured(..., L1Unstructured, amount=0.9)``; batch-norm parameters and biases stay
dense. Written, each in fp32, and measured on disk:

* **dense**: ``torch.save(model.state_dict())`` before pruning, the reference;
* **pruned checkpoint**: ``torch.save(model.state_dict())`` under pruning (``_orig`` + ``_mask``);
* **permanent, torch.save** and **permanent, safetensors**: ``permanent_state_dict(model)``;
* **save_sparse**: the compressed export (bitmask + non-zero values).

Each row checks that what it wrote reads back to the model's weights. Results go to
``benchmarks/results/export_size.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import write_results

RESULTS = Path(__file__).resolve().parent / "results"
AMOUNT = 0.9


def _model(tiny: bool) -> Any:
    from transformers import ResNetConfig, ResNetForImageClassification

    widths = [4, 8, 8, 16] if tiny else [64, 128, 256, 512]
    config = ResNetConfig(
        layer_type="basic",
        depths=[2, 2, 2, 2],
        embedding_size=widths[0],
        hidden_sizes=widths,
        num_labels=10 if tiny else 1000,
    )
    torch.manual_seed(0)
    return ResNetForImageClassification(config).eval()


def _prune(model: Any) -> int:
    from tensorplay.ao.pruning import L1Unstructured, global_unstructured

    pairs = [
        (module, "weight")
        for module in model.modules()
        if isinstance(module, torch.nn.Conv2d | torch.nn.Linear)
    ]
    global_unstructured(pairs, L1Unstructured, amount=AMOUNT)
    return sum(module.weight.numel() for module, _ in pairs)


def measure(tiny: bool) -> dict[str, Any]:
    """Write the model every way and return the sizes in bytes, by row."""
    from safetensors.torch import load_file, save_file

    from tensorplay.ao.pruning import load_sparse, permanent_state_dict, save_sparse

    model = _model(tiny)
    dense_state = {k: v.clone() for k, v in model.state_dict().items()}
    pruned_units = _prune(model)
    permanent = permanent_state_dict(model)
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        torch.save(dense_state, folder / "dense.pt")
        torch.save(model.state_dict(), folder / "pruned.pt")
        torch.save(permanent, folder / "permanent.pt")
        save_file({k: v.contiguous() for k, v in permanent.items()}, str(folder / "perm.st"))
        save_sparse(model, folder / "sparse.safetensors")
        checks = {
            "permanent.pt": torch.load(folder / "permanent.pt", weights_only=True),
            "perm.st": load_file(str(folder / "perm.st")),
            "sparse.safetensors": load_sparse(folder / "sparse.safetensors"),
        }
        for name, loaded in checks.items():
            assert sorted(loaded) == sorted(permanent), name
            for key, value in permanent.items():
                assert torch.equal(loaded[key], value), (name, key)
        files = {
            "dense (torch.save)": "dense.pt",
            "pruned checkpoint (_orig + _mask, torch.save)": "pruned.pt",
            "permanent_state_dict (torch.save)": "permanent.pt",
            "permanent_state_dict (safetensors)": "perm.st",
            "save_sparse (bitmask + non-zeros)": "sparse.safetensors",
        }
        sizes = {row: (folder / file).stat().st_size for row, file in files.items()}
    total = sum(v.numel() for v in permanent.values() if v.is_floating_point())
    zeros = sum(int((v == 0).sum()) for v in permanent.values() if v.is_floating_point())
    return {
        "model": "ResNet-18-like (tiny)" if tiny else "ResNet-18 (HF ResNetForImageClassification)",
        "parameters": sum(p.numel() for p in model.parameters()),
        "pruned_tensors_units": pruned_units,
        "float_units": total,
        "zero_fraction": zeros / total,
        "sizes": sizes,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def table(results: dict[str, Any]) -> str:
    """A markdown table: size in MB and ratio to the dense file, per row."""
    dense = results["sizes"]["dense (torch.save)"]
    lines = ["| file | size (MB) | vs dense |", "|---|---|---|"]
    for row, size in results["sizes"].items():
        lines.append(f"| {row} | {size / 1e6:.2f} | {size / dense:.3f}x |")
    lines.append("")
    lines.append(
        f"{results['model']}, {results['parameters']:,} parameters, fp32; convolutions and "
        f"classifier ({results['pruned_tensors_units']:,} weights) pruned to {AMOUNT:.0%} with "
        f"global L1; {results['zero_fraction']:.1%} of all floating-point units are zero."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Measure, print the table, write ``export_size.json`` and ``.md``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny ResNet, for the tests")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and .md")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)  # the 2-core machine of the other benchmarks
    results = measure(args.tiny)
    rendered = table(results)
    print(rendered, end="")
    write_results(args.out, "export_size", results, rendered)


if __name__ == "__main__":
    main()
