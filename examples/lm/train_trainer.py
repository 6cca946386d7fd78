"""The small GPT-2 of ``train.py``, trained by the Hugging Face ``Trainer``: dense, then pruned.

One command (about 10 minutes on 2 CPU cores at the defaults; ``--max-steps 150`` for a quick
look; needs ``pip install -c constraints.txt -e ".[examples,transformers]"``)::

    python examples/lm/train_trainer.py
    python examples/lm/train_trainer.py --masking inplace --max-steps 150

Both runs train the same network (a 4-block GPT-2, 128 wide, on byte tokens with a context of
128) on the same batches of Python's help text for the same optimizer steps, as
``configs/dense.yaml`` and ``configs/gradual.yaml`` do with Lightning; this file needs no
Lightning (the data and the network are ``byte_text.py``'s and ``gpt_bytes.py``'s). The second
run adds one callback, ``GradualPruningCallback``: the attention and MLP projections are pruned
to 80% on a cubic schedule (dense for the first sixth of the steps, 80% at two thirds,
fine-tuned after), the embeddings and the output head left dense. The report prints the
validation perplexity (per byte) of both, the sparsity, and the perplexity of the pruned model
saved by ``trainer.save_model`` and reloaded by ``GPT2LMHeadModel.from_pretrained``: identical.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2LMHeadModel, Trainer, TrainingArguments

# `python examples/lm/train_trainer.py` puts examples/lm/ on sys.path; this lets tests import us.
sys.path.append(str(Path(__file__).resolve().parent))

from byte_text import Windows, load_bytes, split_windows
from gpt_bytes import gpt_config, perplexity

from tensorplay.ao.pruning import CubicSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback

__all__ = ["LMWindows", "main", "schedule_for", "train"]

# GPT-2's bos/eos ids do not exist in a byte vocabulary; the model does not use them here.
warnings.filterwarnings("ignore", ".*bos_token_id.*|.*eos_token_id.*")


class LMWindows(Dataset[dict[str, torch.Tensor]]):
    """:class:`byte_text.Windows` as the ``Trainer`` takes them: ``input_ids`` and ``labels``
    are the same ``context + 1`` bytes (GPT-2 shifts the labels itself).

    Example:
        >>> item = LMWindows(Windows(torch.arange(10), context=4))[1]
        >>> item["input_ids"].tolist(), item["labels"].tolist()
        ([4, 5, 6, 7, 8], [4, 5, 6, 7, 8])
    """

    def __init__(self, windows: Windows) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.windows[index]
        return {"input_ids": window, "labels": window}


def schedule_for(max_steps: int) -> CubicSchedule:
    """80% on a cubic schedule in optimizer steps, placed as ``configs/gradual.yaml`` places it
    in 600 steps: dense for the first sixth, 80% at two thirds, pruning 12 times in between.

    Example:
        >>> schedule = schedule_for(600)
        >>> schedule.start_step, schedule.end_step, schedule.frequency, schedule(400)
        (100, 400, 25, 0.8)
    """
    start, end = max_steps // 6, 2 * max_steps // 3
    return CubicSchedule(0.8, start_step=start, end_step=end, frequency=max(1, (end - start) // 12))


def train(
    options: argparse.Namespace, out_dir: Path, prune: bool
) -> tuple[GPT2LMHeadModel, Trainer, GradualPruningCallback | None]:
    """Train one network (pruned if ``prune``) and return it with its trainer and callback."""
    train_windows, _ = split_windows(load_bytes(), options.context)
    train_set = LMWindows(train_windows)
    torch.manual_seed(0)  # the same initial weights for both runs
    # context + 1 positions: each window's first `context` bytes predict the next.
    config = gpt_config(options.context + 1, options.n_layer, options.n_embd, options.n_head)
    net = GPT2LMHeadModel(config)
    callbacks: list[Any] = []
    pruning = None
    if prune:
        pruning = GradualPruningCallback(
            schedule_for(options.max_steps),
            # As configs/gradual.yaml: the projections, not the embeddings or the tied head.
            keep_dense=["embeddings", "last"],
            masking=options.masking,
            # Drop the masks at the end, so save_model writes a plain GPT-2.
            make_permanent=True,
            verbose=False,
        )
        callbacks.append(pruning)
    args = TrainingArguments(
        output_dir=str(out_dir),
        max_steps=options.max_steps,
        per_device_train_batch_size=options.batch_size,
        # As train.py: AdamW at a constant 1e-3, betas (0.9, 0.99), torch's weight decay 0.01,
        # clipping at 1.0.
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        adam_beta2=0.99,
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_steps=max(1, options.max_steps // 10),
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,  # the same batches for both runs
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=net, args=args, train_dataset=train_set, callbacks=callbacks)
    trainer.train()
    return net, trainer, pruning


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train dense and pruned, print the report; returns its numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--val-batches", type=int, default=None, help="default: all")
    parser.add_argument("--masking", choices=["reparametrize", "inplace"], default="reparametrize")
    parser.add_argument("--out", type=Path, default=Path("runs/lm_trainer"))
    options = parser.parse_args(argv)
    # One thread: on a 2-core machine shared with other jobs, a second thread made steps slower.
    torch.set_num_threads(1)

    _, val = split_windows(load_bytes(), options.context)
    batches = list(DataLoader(val, batch_size=64))[: options.val_batches]

    dense, _, _ = train(options, options.out / "dense", prune=False)
    dense_ppl = perplexity(dense, batches)
    pruned, trainer, pruning = train(options, options.out / "gradual", prune=True)
    assert pruning is not None
    pruned_ppl = perplexity(pruned, batches)
    report = pruning.report
    saved = options.out / "gradual" / "hf_model"
    trainer.save_model(str(saved))
    reloaded_ppl = perplexity(GPT2LMHeadModel.from_pretrained(saved), batches)
    print(
        "\n".join(
            [
                "",
                f"dense perplexity        {dense_ppl:.4f} per byte",
                f"pruned perplexity       {pruned_ppl:.4f} per byte",
                f"projections pruned      {100 * report.sparsity:.2f}% ({report.pruned:,} of "
                f"{report.total:,})",
                f"saved folder            {saved}",
                f"reloaded perplexity     {reloaded_ppl:.4f} "
                f"({'identical' if reloaded_ppl == pruned_ppl else 'DIFFERENT'})",
            ]
        )
    )
    return {"dense": dense_ppl, "pruned": pruned_ppl, "reloaded": reloaded_ppl}


if __name__ == "__main__":
    main()
