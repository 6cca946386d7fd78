"""The English text that ships with Python, as bytes, in a LightningDataModule.

The bytes and their windows are :mod:`byte_text`'s (re-exported here).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from byte_text import VAL_FRACTION, Windows, load_bytes, split_windows
from torch.utils.data import DataLoader

__all__ = ["VAL_FRACTION", "PydocText", "Windows", "load_bytes"]


class PydocText(pl.LightningDataModule):
    """Python's help text as bytes: the first 90% to train on, the last 10% to validate.

    Args:
        context: Tokens the model sees at once (its ``n_positions``; the CLI links the two).
        batch_size: Windows per optimizer step.

    Example:
        >>> dm = PydocText(context=64, batch_size=8)
        >>> dm.setup("fit")
        >>> next(iter(dm.train_dataloader())).shape
        torch.Size([8, 65])
    """

    def __init__(self, context: int = 128, batch_size: int = 16) -> None:
        super().__init__()
        self.context = context
        self.batch_size = batch_size
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        self.train_set, self.val_set = split_windows(load_bytes(), self.context)

    def train_dataloader(self) -> DataLoader[torch.Tensor]:
        # Shuffled windows from the seed that seed_everything sets: the dense and pruned runs of
        # one seed see the same batches in the same order.
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader[torch.Tensor]:
        # Larger batches than training: no gradients to keep, and fewer, faster steps.
        return DataLoader(self.val_set, batch_size=4 * self.batch_size)
