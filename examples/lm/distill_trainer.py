"""Distillation through the Hugging Face Trainer callback: ``distill_weight=1.0`` against 0.

One command, 3 seeds, at most 7 minutes on 2 CPU cores with the dense models
cached by ``distill.py`` (needs ``pip install -c constraints.txt -e ".[examples,transformers]"``)::

    python examples/lm/distill_trainer.py

The callback path of ``examples/lm/distill.py``'s one-shot protocol: from each seed's dense
model (the same 2-block byte-level GPT-2 trained for 600 steps on Python's help text, cached in
``runs/lm/distill/``), a ``transformers.Trainer`` with ``GradualPruningCallback`` prunes 90% of
the block projections at step 0 and trains for 150 steps, with ``distill_weight=0`` (plain
fine-tuning) or ``distill_weight=1.0`` (``distill_temperature=2.0``: the teacher is the dense
model, copied by the callback just before it prunes). Nothing else differs: the same batches
(the Trainer's sampler seeded by the seed), AdamW at a constant learning rate, gradient clipping
at 1. Each run is scored by its validation perplexity per byte, as in ``distill.py``.

The results go to ``docs/results/distillation_trainer.json`` and ``.md`` (``--out``);
``--steps-scale 0.02`` shrinks every step count (the test runs it so).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import GPT2LMHeadModel, Trainer, TrainingArguments

# `python examples/lm/distill_trainer.py` puts examples/lm/ on sys.path; tests import us by path.
sys.path.append(str(Path(__file__).resolve().parent))

from byte_text import Windows, val_batches
from distill import (
    BATCH,
    CACHE,
    LR,
    PRETRAIN_STEPS,
    PRUNED,
    RECOVERY_STEPS,
    SEEDS,
    SPARSITY,
    pretrain,
    split,
)
from gpt_bytes import copy_of, perplexity
from reporting import mean_std, write_results

from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback

__all__ = ["main", "recover_with_trainer"]

OUT = Path("docs/results/distillation_trainer.json")


class LanguageModelling(Dataset[dict[str, torch.Tensor]]):
    """The training windows without their last byte (the model's context), each its own label:
    GPT-2 shifts the labels itself, so a window predicts 63 bytes here, 64 in ``distill.py``."""

    def __init__(self, windows: Windows) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.windows[index][:-1]
        return {"input_ids": window, "labels": window}


def recover_with_trainer(
    base: GPT2LMHeadModel, data: LanguageModelling, distill_weight: float, steps: int, seed: int
) -> GPT2LMHeadModel:
    """A copy of ``base`` pruned by the callback at step 0 and trained for ``steps``."""
    net = copy_of(base).train()
    pruning = GradualPruningCallback(
        OneShotSchedule(SPARSITY), masking="inplace", distill_weight=distill_weight,
        distill_temperature=2.0, verbose=False, **PRUNED,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, max_steps=steps, per_device_train_batch_size=BATCH,
            learning_rate=LR, lr_scheduler_type="constant", adam_beta2=0.99, weight_decay=0.01,
            max_grad_norm=1.0, seed=1000 + seed, use_cpu=True, report_to="none",
            save_strategy="no", logging_steps=max(1, steps // 5), disable_tqdm=True,
            dataloader_num_workers=0,
        )  # fmt: skip
        Trainer(model=net, args=args, train_dataset=data, callbacks=[pruning]).train()
    if abs(pruning.pruner.sparsity() - SPARSITY) > 1e-3:
        raise RuntimeError(f"Expected {SPARSITY:.0%} sparsity, got {pruning.pruner.sparsity()}.")
    return net


def table(cells: dict[str, list[float]]) -> str:
    """The markdown table of the results."""
    plain, distilled = cells["plain"], cells["distilled"]
    lower = sum(d < p for d, p in zip(distilled, plain, strict=True))
    return (
        f"| pruned to {SPARSITY:.0%} by the callback, {cells['steps'][0]:.0f} steps | "
        "distill_weight=0 | distill_weight=1.0 | distillation lower in |\n"
        "|---|---:|---:|---:|\n"
        f"| one-shot at step 0, then the Trainer | {mean_std(plain)} | {mean_std(distilled)} | "
        f"{lower} of {len(plain)} seeds |\n\n"
        f"Validation perplexity per byte, mean ± std over {len(plain)} seeds (lower is better): "
        f"the dense model (the teacher) {mean_std(cells['dense'])}.\n"
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every seed; write the JSON and the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--steps-scale", type=float, default=1.0)
    parser.add_argument("--val-windows", type=int, default=None, help="default: all")
    parser.add_argument("--cache", type=Path, default=CACHE, help="dense models")
    parser.add_argument("--out", type=Path, default=OUT, help=".json; the .md goes beside it")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pretrain_steps = max(4, round(PRETRAIN_STEPS * args.steps_scale))
    steps = max(4, round(RECOVERY_STEPS * args.steps_scale))
    train_windows, val_windows = split()
    val = val_batches(val_windows, args.val_windows)
    data = LanguageModelling(train_windows)
    cells: dict[str, list[float]] = {"steps": [float(steps)]}
    for seed in args.seeds:
        base = pretrain(seed, pretrain_steps, train_windows, args.cache)
        cells.setdefault("dense", []).append(perplexity(base, val))
        for name, weight in (("plain", 0.0), ("distilled", 1.0)):
            net = recover_with_trainer(base, data, weight, steps, seed)
            cells.setdefault(name, []).append(perplexity(net, val))
            print(f"seed {seed} {name}: {cells[name][-1]:.3f}", flush=True)
    write_results(args.out, cells, table(cells))
    print(table(cells))
    return cells


if __name__ == "__main__":
    main()
