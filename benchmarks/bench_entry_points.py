"""The time of four entry points a user calls, through the public API alone, to compare commits.

Run::

    python benchmarks/bench_entry_points.py --out benchmarks/results

Four measurements, each the median of ``--repeats`` calls after one warm-up:

* ``global_unstructured``: :func:`tensorplay.ao.pruning.global_unstructured` at 50% over the
  weights of an MLP of ``--params`` parameters (fresh masks each call), the exact selection;
* ``one-shot channels, reconstructed``: :func:`tensorplay.ao.pruning.prune_one_shot` of a tiny
  Llama (random weights, 4 layers) to half its FFN channels, layer-wise, with reconstruction on
  8 calibration batches;
* ``dense teacher copy``: :func:`tensorplay.ao.pruning.dense_copy` of that Llama with half of
  its Linear weights masked (the reparametrized form), what a distillation's teacher is made of;
* ``callback step``: one optimizer step of a Lightning ``Trainer`` fitting a small MLP with
  :class:`tensorplay.callbacks.GradualPruning` (a cubic schedule pruning every 5 steps), the
  fit's time divided by its steps.

It names only public paths, so the same script measures any commit (``benchmarks/ab.py``
alternates two of them in fresh processes). Writes ``entry_points.json`` and
``entry_points.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import cpu_seconds, machine, parse_size, write_results


def timed(call: Callable[[], Any], repeats: int) -> dict[str, float]:
    """The median wall and CPU seconds of ``repeats`` calls, after one warm-up call."""
    call()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), cpu_seconds()
        call()
        walls.append(time.perf_counter() - wall)
        cpus.append(cpu_seconds() - cpu)
    return {"seconds": statistics.median(walls), "cpu_seconds": statistics.median(cpus)}


def global_selection(params: int) -> Callable[[], None]:
    from tensorplay.ao.pruning import L1Unstructured, global_unstructured

    width = int((params / 4) ** 0.5)

    def call() -> None:
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(4)))
        pairs = [(layer, "weight") for layer in model]
        global_unstructured(pairs, pruning_method=L1Unstructured, amount=0.5)

    return call


def one_shot_reconstructed() -> Callable[[], None]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from tensorplay.ao.pruning import prune_one_shot

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 256, (4, 64), generator=generator) for _ in range(8)]

    def call() -> None:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
        prune_one_shot(
            model,
            batches,
            0.5,
            structure="channel",
            scope="layerwise",
            importance="magnitude",
            reconstruct=True,
        )

    return call


def teacher_copy() -> Callable[[], None]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from tensorplay.ao.pruning import L1Unstructured, dense_copy, global_unstructured

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    pairs = [(m, "weight") for m in model.modules() if isinstance(m, nn.Linear)]
    global_unstructured(pairs, pruning_method=L1Unstructured, amount=0.5)

    def call() -> None:
        dense_copy(model)

    return call


def callback_step(steps: int) -> Callable[[], float]:
    import lightning.pytorch as pl

    from tensorplay.ao.pruning import CubicSchedule
    from tensorplay.callbacks import GradualPruning

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            inputs, labels = batch
            return nn.functional.cross_entropy(self.net(inputs), labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    generator = torch.Generator().manual_seed(2)
    data = torch.utils.data.TensorDataset(
        torch.randn(32 * steps, 64, generator=generator),
        torch.randint(0, 10, (32 * steps,), generator=generator),
    )

    def call() -> float:
        torch.manual_seed(0)
        pruning = GradualPruning(CubicSchedule(0.8, end_step=steps - 5, frequency=5))
        trainer = pl.Trainer(
            max_epochs=1,
            callbacks=[pruning],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
        )
        loader = torch.utils.data.DataLoader(data, batch_size=32)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Module(), loader)
        return (time.perf_counter() - start) / steps

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", default="20M", help="global_unstructured's model size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100, help="the callback run's steps")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the same work on both sides, whatever else runs
    rows = [
        {
            "case": "global_unstructured",
            "tensorplay": timed(global_selection(parse_size(args.params)), args.repeats),
        },
        {
            "case": "one-shot channels, reconstructed",
            "tensorplay": timed(one_shot_reconstructed(), args.repeats),
        },
        {"case": "dense teacher copy", "tensorplay": timed(teacher_copy(), args.repeats)},
    ]
    step = callback_step(args.steps)
    step()  # warm-up
    per_step = statistics.median(step() for _ in range(args.repeats))
    rows.append({"case": "callback step", "tensorplay": {"seconds": per_step}})
    table = ["| case | seconds |", "|---|---|"]
    table += [f"| {row['case']} | {row['tensorplay']['seconds']:.4f} |" for row in rows]
    write_results(args.out, "entry_points", {"machine": machine(), "rows": rows}, "\n".join(table))
    print("\n".join(table))


if __name__ == "__main__":
    main()
