"""A LightningModule with tied weights and a recorder for the DDP test.

They live in an importable module with a unique name so that ``ddp_spawn`` workers can
unpickle them.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from tensorplay.callbacks import PrunableMixin
from tests.callbacks.lit_helpers import TinyModule

__all__ = ["TIED_TOTAL", "PrunableTiedTiny", "TiedMaskWriter", "TiedTiny"]

# net.0.weight (16 x 8), net.2.weight = net.4.weight (16 x 16, counted once), net.6.weight (4 x 16).
TIED_TOTAL = 16 * 8 + 16 * 16 + 4 * 16


class TiedTiny(TinyModule):
    """:class:`TinyModule` whose two hidden 16 x 16 layers share one weight."""

    def __init__(self, seed: int = 0, lr: float = 0.1, samples: int = 64) -> None:
        super().__init__(seed=seed, lr=lr, samples=samples)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.net = nn.Sequential(
                nn.Linear(8, 16),
                nn.ReLU(),
                nn.Linear(16, 16),
                nn.ReLU(),
                nn.Linear(16, 16),
                nn.ReLU(),
                nn.Linear(16, 4),
            )
        self.net[4].weight = self.net[2].weight


class PrunableTiedTiny(PrunableMixin, TiedTiny):
    """:class:`TiedTiny` that loads pruned checkpoints strictly."""


def tie_holds(module: nn.Module) -> bool:
    """Whether both holders of the tied weight share one mask and one parameter."""
    first, second = module.net[2], module.net[4]
    return bool(first.weight_mask is second.weight_mask and first.weight_orig is second.weight_orig)


class TiedMaskWriter(Callback):
    """Give each rank its own global seed at setup; save its masks (every alias), whether the
    tie holds and the effective tied weight at the end of training."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        torch.manual_seed(1000 + trainer.global_rank)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        state = pl_module.state_dict()
        masks = {k: v.detach().clone() for k, v in state.items() if k.endswith("_mask")}
        record = {
            "masks": masks,
            "tie_holds": torch.tensor(tie_holds(pl_module)),
            "weight": pl_module.net[4].weight.detach().clone(),
        }
        torch.save(record, Path(self.directory) / f"tied_rank{trainer.global_rank}.pt")
