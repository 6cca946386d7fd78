"""Train a digits classifier, pruned or dense, from a YAML config, then test it and report.

The main job (about a minute on 2 CPU cores; needs ``pip install -e ".[examples]"``)::

    python examples/train.py fit --config examples/configs/gradual.yaml

The other configs in ``examples/configs/``: ``dense.yaml`` (the baseline), ``oneshot.yaml``,
``layerwise.yaml`` and ``lottery.yaml``. Every value can be changed on the command line, e.g.
``--seed_everything 1`` or ``--model.arch cnn``; ``python examples/train.py fit --help`` lists them.

After ``fit`` the final (pruned) weights are tested on the 360 held-out images and a report is
printed: test accuracy, sparsity per layer and overall, and where the run's files are. They all
sit in ``runs/<config name>/version_<n>/``: ``config.yaml`` (the full config of the run),
``metrics.csv``, ``checkpoints/*.ckpt``, ``sparsity.png`` (target vs actual sparsity per step) and
``layers.png`` (sparsity per layer). ``python -m tensorplay.report CKPT`` reports on any
checkpoint later.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import LightningCLI

# `python examples/train.py` puts examples/ on sys.path; this also lets other code import us.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from data import DigitsDataModule
from models import DigitsClassifier
from plots import plot_layer_sparsity, plot_sparsity_curve

from tensorplay.ao.pruning.masking.stats import sparsity_report

__all__ = ["DigitsCLI", "TRAINER_DEFAULTS", "main"]

# The whole data set is half a megabyte in memory: worker processes would only add start-up time.
warnings.filterwarnings("ignore", ".*does not have many workers.*")
# Lightning 2.6 calls a torch pytree API that newer torch deprecates: not ours to fix, no effect.
warnings.filterwarnings("ignore", r".*isinstance\(treespec, LeafSpec\)")

TRAINER_DEFAULTS: dict[str, Any] = {
    # 60 epochs of 20 steps: the dense MLP reaches about 98% in 10; the pruning configs need
    # the rest to prune and fine-tune. 1,200 steps take well under a minute on 2 CPU cores.
    "max_epochs": 60,
    # Four points per epoch for the target-vs-actual sparsity curve (the default is every 50).
    "log_every_n_steps": 5,
    # metrics.csv is what the plots read; each config names its own run directory.
    "logger": {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": "runs", "name": "dense"},
    },
}


class DigitsCLI(LightningCLI):
    """``LightningCLI`` over :class:`DigitsClassifier` and :class:`DigitsDataModule`.

    After ``fit`` it tests the final weights and prints the run's report.
    """

    def after_fit(self) -> None:
        # The final weights, not the best validation checkpoint: with pruning, the best epoch
        # by validation accuracy may come before the model reached its target sparsity.
        results = self.trainer.test(self.model, datamodule=self.datamodule, verbose=False)
        if self.trainer.is_global_zero:
            print(closing_report(self, results[0]["test/acc"]))


def closing_report(cli: LightningCLI, test_acc: float) -> str:
    """Write the plots and return the run's report: accuracy, sparsity, where its files are."""
    trainer = cli.trainer
    log_dir = Path(trainer.log_dir or ".")
    report = sparsity_report(cli.model)
    lines = [
        "",
        f"test accuracy   {100 * test_acc:.2f}%",
        f"sparsity        {100 * report.sparsity:.2f}% overall, "
        f"{report.pruned:,} of {report.total:,} weights pruned",
        "",
        str(report),
        "",
    ]
    if trainer.logger is not None:
        trainer.logger.save()
    metrics = log_dir / "metrics.csv"
    if metrics.is_file():  # no CSVLogger (another logger, or none under fast_dev_run): no plots
        curve = plot_sparsity_curve(metrics, log_dir / "sparsity.png")
        layers = plot_layer_sparsity(report, log_dir / "layers.png")
        lines.append(f"logs            {metrics} (config: {log_dir / 'config.yaml'})")
        lines.append(f"plots           {curve or '(no pruning logged)'}, {layers}")
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and getattr(checkpoint, "best_model_path", ""):
        path = checkpoint.best_model_path  # the last epoch's: no metric is monitored
        lines.append(f"checkpoint      {path}")
        lines.append(f"inspect it      python -m tensorplay.report '{path}'")
    return "\n".join(lines)


def main(args: list[str] | dict[str, Any] | None = None, **kwargs: Any) -> DigitsCLI:
    """Run the CLI on ``args`` (default: the command line); ``kwargs`` go to ``LightningCLI``."""
    # The networks are tiny: one thread multiplies a 64x256 batch as fast as two, while a second
    # OpenMP thread on a busy 2-core machine only spins (measured: 4 s of CPU vs 60 s for 20
    # epochs). Remove this for a much larger model.
    torch.set_num_threads(1)
    return DigitsCLI(
        DigitsClassifier,
        DigitsDataModule,
        # A fixed seed: two runs of one config give the same numbers. Vary it to measure spread.
        seed_everything_default=0,
        trainer_defaults=TRAINER_DEFAULTS,
        args=args,
        **kwargs,
    )


if __name__ == "__main__":
    main()
