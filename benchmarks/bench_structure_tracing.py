"""Time to find the channel groups of a ResNet-18 by tracing, against one forward pass.

Run (about a minute on a 2-core machine)::

    python benchmarks/bench_structure_tracing.py            # ResNet-18 (11.7M parameters), 224x224
    python benchmarks/bench_structure_tracing.py --tiny     # widths 4-32 at 32x32, for the tests

The model is a ResNet-18 built by hand (basic blocks, depths 2-2-2-2, widths 64-512, 1000
classes; random init). Measured, in one process and alternated, each the median of
``--repeats``:

* **analysis**: ``trace_channels(model, example)`` with a 1x3x224x224 example (shapes run on
  the meta device: no data computed);
* **analysis, no example**: ``trace_channels(model)`` (no shapes: the last stage's channels,
  flattened into the classifier, are left out);
* **torch.fx trace**: ``torch.fx.symbolic_trace(model)`` alone;
* **forward**: one ``model(example)`` in eval mode under ``torch.no_grad()``, the reference.

**first call** runs in a fresh process: ``import torch``, then the parts of torch that the
first operation on the meta device imports (``torch._refs``, ``torch._dynamo``; paid once per
process, and not at all by one that has compiled or traced anything), then the first analysis.
Everything runs on one thread. Results go to ``benchmarks/results/structure_tracing.json``
and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, worker_json, write_results

RESULTS = Path(__file__).resolve().parent / "results"


def resnet18(widths: tuple[int, ...], classes: int) -> Any:
    """A ResNet-18 of basic blocks with the given stage widths."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, channels_in: int, channels: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(channels)
            self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(channels)
            self.down = None
            if stride != 1 or channels_in != channels:
                self.down = nn.Sequential(
                    nn.Conv2d(channels_in, channels, 1, stride, bias=False),
                    nn.BatchNorm2d(channels),
                )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
                nn.BatchNorm2d(widths[0]),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            )
            blocks, channels = [], widths[0]
            for stage, width in enumerate(widths):
                blocks += [Block(channels, width, 1 if stage == 0 else 2), Block(width, width, 1)]
                channels = width
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(channels, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1)
            return self.fc(torch.flatten(x, 1))

    torch.manual_seed(0)
    return ResNet18().eval()


def _setup(tiny: bool) -> tuple[Any, Any]:
    import torch

    widths, classes, side = ((4, 8, 16, 32), 10, 32) if tiny else ((64, 128, 256, 512), 1000, 224)
    return resnet18(widths, classes), torch.randn(1, 3, side, side)


def first_call(tiny: bool) -> dict[str, float]:
    """In this (fresh) process: ``import torch``, torch's meta-execution modules, then the
    first analysis."""
    start = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    seconds = {"import torch": time.perf_counter() - start}
    start = time.perf_counter()
    import torch._dynamo
    import torch._refs

    seconds["import torch._refs, torch._dynamo"] = time.perf_counter() - start
    from tensorplay.ao.pruning.structured.dependency.tracing import trace_channels

    model, example = _setup(tiny)
    start = time.perf_counter()
    trace_channels(model, example)
    seconds["first analysis"] = time.perf_counter() - start
    return seconds


def measure(tiny: bool, repeats: int) -> dict[str, Any]:
    """Median seconds per variant (alternated, one process) and the groups found."""
    import torch
    from torch import fx

    from tensorplay.ao.pruning.structured.dependency.tracing import trace_channels

    torch.set_num_threads(1)
    model, example = _setup(tiny)
    variants = {
        "analysis": lambda: trace_channels(model, example),
        "analysis, no example": lambda: trace_channels(model),
        "torch.fx trace": lambda: fx.symbolic_trace(model),
        "forward": lambda: model(example),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    with torch.no_grad():
        for run in variants.values():  # warm-up: lazy imports, allocator, threads
            run()
        for _ in range(repeats):
            for name, run in variants.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
    found = trace_channels(model, example)
    return {
        "seconds": {name: statistics.median(values) for name, values in times.items()},
        "groups": len(found.groups),
        "units": sum(group.size for group in found.groups),
        "parameters": sum(p.numel() for p in model.parameters()),
        "unprunable": found.unprunable,
    }


def table(results: dict[str, Any]) -> str:
    seconds, forward = results["seconds"], results["seconds"]["forward"]
    rows = ["| measured | seconds | x one forward |", "|---|---|---|"]
    for name, value in seconds.items():
        rows.append(f"| {name} | {value:.3f} | {value / forward:.1f}x |")
    for name, value in results["first_call"].items():
        rows.append(f"| fresh process: {name} | {value:.3f} | {value / forward:.1f}x |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="widths 4-32 at 32x32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--first-call", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_call:
        print(json.dumps(first_call(args.tiny)))
        return
    results = measure(args.tiny, args.repeats)
    results["first_call"] = worker_json(
        __file__, "--first-call", *(["--tiny"] if args.tiny else [])
    )
    results["machine"] = machine("platform", "python")
    markdown = table(results)
    write_results(args.out, "structure_tracing", results, markdown)
    print(
        f"{results['parameters'] / 1e6:.1f}M parameters: {results['groups']} channel groups, "
        f"{results['units']} units"
    )
    print(markdown, end="")


if __name__ == "__main__":
    main()
