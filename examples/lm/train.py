"""Train a small GPT-2 on Python's own help text, dense or pruned, then save it for Hugging Face.

The two runs to compare (each a few minutes on 2 CPU cores; needs
``pip install -c constraints.txt -e ".[examples,transformers]"``)::

    python examples/lm/train.py fit --config examples/lm/configs/dense.yaml
    python examples/lm/train.py fit --config examples/lm/configs/gradual.yaml

Both train the same network (a 4-block GPT-2, 128 wide, on byte tokens with a context of 128)
for the same 600 optimizer steps on the same batches; ``gradual.yaml`` also prunes the attention
and MLP projections to 80% on a cubic schedule, leaving the embeddings and the output head dense.
Every value can be changed on the command line (``--model.n_layer 2``, ``--trainer.max_steps
100``); ``python examples/lm/train.py fit --help`` lists them.

After ``fit`` the report gives the validation perplexity (per byte) of the final weights, the
sparsity of each transformer block, and the run time. The model is then saved as a Hugging Face
folder with ``save_pretrained(..., state_dict=permanent_state_dict(net))`` (the weights as if
pruning were permanent, the model under training untouched), reloaded with
``GPT2LMHeadModel.from_pretrained`` and scored again: the two perplexities are identical. The run's
files are in ``runs/lm/<config name>/version_<n>/``: ``config.yaml``, ``metrics.csv``,
``checkpoints/*.ckpt`` (with the masks, to resume), ``hf_model/`` (plain GPT-2 weights) and
``model.sparse.safetensors`` (the same weights compressed: bitmask and non-zeros, read back with
``tensorplay.ao.pruning.load_sparse``).
"""

from __future__ import annotations

import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import LightningCLI
from transformers import GPT2LMHeadModel

# `python examples/lm/train.py` puts examples/lm/ on sys.path; this lets tests import us too.
# Appended, not prepended: examples/train.py must stay the one that `import train` finds.
sys.path.append(str(Path(__file__).resolve().parent))

from pydoc_text import PydocText
from tiny_gpt import TinyGPT, perplexity

from tensorplay.ao.pruning import permanent_state_dict, save_sparse, select_parameters
from tensorplay.ao.pruning.masking.stats import SparsityReport, sparsity_report
from tensorplay.callbacks import GradualPruning

__all__ = ["LMCLI", "TRAINER_DEFAULTS", "block_table", "main"]

# The whole text is half a megabyte in memory: worker processes would only add start-up time.
warnings.filterwarnings("ignore", ".*does not have many workers.*")
# Lightning 2.6 calls a torch pytree API that newer torch deprecates: not ours to fix, no effect.
warnings.filterwarnings("ignore", r".*isinstance\(treespec, LeafSpec\)")

TRAINER_DEFAULTS: dict[str, Any] = {
    # 600 steps of 16 x 128 bytes: about 2.9 passes over the training text, a few minutes on
    # 2 CPU cores. The schedule in configs/gradual.yaml counts in these steps.
    "max_steps": 600,
    # Validate every 100 optimizer steps (counted across epochs, hence no per-epoch check).
    "val_check_interval": 100,
    "check_val_every_n_epoch": None,
    "log_every_n_steps": 10,
    # The usual clipping for GPT training: keeps early steps from blowing up the residual stream.
    "gradient_clip_val": 1.0,
    # metrics.csv holds the loss curves; each config names its own run directory.
    "logger": {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": "runs/lm", "name": "dense"},
    },
}

# The name of a tensor's transformer block, e.g. "h.3" in "net.transformer.h.3.mlp.c_fc.weight".
BLOCK = re.compile(r"(?:^|\.)(h\.\d+)\.")


class LMCLI(LightningCLI):
    """``LightningCLI`` over :class:`TinyGPT` and :class:`PydocText`; reports after ``fit``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.started = time.perf_counter()  # the report's wall time: set-up, training, saving
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        # One context length: the data's windows are the model's positions.
        parser.link_arguments("data.context", "model.context")

    def after_fit(self) -> None:
        if self.trainer.is_global_zero:
            print(closing_report(self))


def block_table(report: SparsityReport) -> str:
    """Sparsity per transformer block (``h.<i>``), summed over the block's tensors in ``report``.

    Example:
        >>> from tensorplay.ao.pruning.masking.stats import TensorSparsity
        >>> rows = (TensorSparsity("h.0.attn.c_attn.weight", (4, 12), 48, 12),
        ...         TensorSparsity("h.0.mlp.c_fc.weight", (4, 16), 64, 52),
        ...         TensorSparsity("h.1.mlp.c_fc.weight", (4, 16), 64, 32))
        >>> print(block_table(SparsityReport(rows)))
        block  weights  pruned  sparsity
        h.0        112      64    57.14%
        h.1         64      32    50.00%
        total      176      96    54.55%
    """
    blocks: dict[str, list[int]] = {}
    for row in report.rows:
        match = BLOCK.search(row.name)
        counts = blocks.setdefault(match.group(1) if match else row.name, [0, 0])
        counts[0] += row.numel
        counts[1] += row.pruned
    lines = [f"{'block':<5}  {'weights':>7}  {'pruned':>6}  {'sparsity':>8}"]
    for name, (numel, pruned) in [*blocks.items(), ("total", [report.total, report.pruned])]:
        lines.append(f"{name:<5}  {numel:>7}  {pruned:>6}  {100 * pruned / numel:>7.2f}%")
    return "\n".join(lines)


def folder_size(path: Path) -> int:
    """The bytes of all files under ``path``."""
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def closing_report(cli: LMCLI) -> str:
    """Score the final weights, save and reload them as a HF folder, and return the report."""
    trainer, model = cli.trainer, cli.model
    net: GPT2LMHeadModel = model.net
    val = cli.datamodule.val_dataloader()
    # The final weights, not the best validation checkpoint: with pruning, the best step by
    # validation loss may come before the model reached its target sparsity.
    ppl = perplexity(net, val)
    pruning = [c for c in trainer.callbacks if isinstance(c, GradualPruning)]  # type: ignore[attr-defined]
    if pruning:
        report = pruning[0].pruner.report()
    else:  # the dense run: the tensors that gradual.yaml prunes, for the same table
        report = sparsity_report(net, select_parameters(net, keep_dense=["embeddings", "last"]))
    n_params = sum(p.numel() for p in net.parameters())  # tied embedding and head counted once

    log_dir = Path(trainer.log_dir or ".")
    out_dir = log_dir / "hf_model"
    # Under pruning, net.state_dict() holds <name>_orig and <name>_mask, which from_pretrained
    # would reject and re-initialise; permanent_state_dict gives the plain weights (orig * mask).
    net.save_pretrained(out_dir, state_dict=permanent_state_dict(net))
    reloaded = GPT2LMHeadModel.from_pretrained(out_dir)
    reloaded_ppl = perplexity(reloaded, val)
    # The same weights with only the non-zeros stored, plus a bitmask (load_sparse reads it).
    sparse = save_sparse(net, log_dir / "model.sparse.safetensors")

    return "\n".join(
        [
            "",
            f"validation perplexity   {ppl:.4f} per byte (final weights)",
            f"projections pruned      {100 * report.sparsity:.2f}% ({report.pruned:,} of "
            f"{report.total:,}; {100 * report.pruned / n_params:.2f}% of all {n_params:,} "
            "parameters)",
            "",
            block_table(report),
            "",
            f"Hugging Face folder     {out_dir} ({folder_size(out_dir) / 1e6:.2f} MB)",
            f"reloaded perplexity     {reloaded_ppl:.4f} "
            f"({'identical' if reloaded_ppl == ppl else 'DIFFERENT'})",
            f"compressed export       {sparse} ({sparse.stat().st_size / 1e6:.2f} MB)",
            f"logs                    {log_dir / 'metrics.csv'}, {log_dir / 'config.yaml'}",
            f"wall time               {time.perf_counter() - cli.started:.0f} s",
        ]
    )


def main(args: list[str] | dict[str, Any] | None = None, **kwargs: Any) -> LMCLI:
    """Run the CLI on ``args`` (default: the command line); ``kwargs`` go to ``LightningCLI``."""
    # One thread: on a 2-core machine shared with other jobs, a second OpenMP thread made each
    # step 5x slower (measured: 0.40 s vs 2.1 s per step). On an idle machine try 2.
    torch.set_num_threads(1)
    return LMCLI(
        TinyGPT,
        PydocText,
        # A fixed seed: the dense and pruned runs start from the same weights and batches.
        seed_everything_default=0,
        trainer_defaults=TRAINER_DEFAULTS,
        args=args,
        **kwargs,
    )


if __name__ == "__main__":
    main()
