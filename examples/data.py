"""The handwritten-digits data set as a LightningDataModule.

scikit-learn ships the data (1,797 real 8x8 grey-scale images of the digits 0-9), so nothing is
downloaded. The split is fixed by ``split_seed`` and independent of the training seed, so runs
with different seeds are scored on the same test images.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["DigitsDataModule"]

# 1,257 / 180 / 360 images: with batch_size=64 an epoch is exactly 20 optimizer steps, which the
# schedules in configs/ count in; the test set is the largest held-out part because the accuracy
# differences between pruning methods are small (one test image is 0.28 points).
N_VAL = 180
N_TEST = 360


class DigitsDataModule(pl.LightningDataModule):
    """scikit-learn's digits, split 1,257 / 180 / 360 and standardised with training statistics.

    Args:
        batch_size: Images per optimizer step.
        split_seed: Seed of the permutation that splits the data; keep it fixed to compare runs.

    Example:
        >>> dm = DigitsDataModule()
        >>> dm.setup("fit")
        >>> x, y = next(iter(dm.train_dataloader()))
        >>> tuple(x.shape), tuple(y.shape)
        ((64, 64), (64,))
    """

    def __init__(self, batch_size: int = 64, split_seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.split_seed = split_seed
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32)
        y = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(self.split_seed))
        test, val, train = order[:N_TEST], order[N_TEST : N_TEST + N_VAL], order[N_TEST + N_VAL :]
        # Per-pixel statistics from the training images only. Border pixels are (almost) always 0:
        # a std floor of 1 (a grey level is 0..16) keeps them from being blown up or divided by 0.
        mean = x[train].mean(dim=0)
        std = x[train].std(dim=0).clamp_min(1.0)
        x = (x - mean) / std
        self.train_set = TensorDataset(x[train], y[train])
        self.val_set = TensorDataset(x[val], y[val])
        self.test_set = TensorDataset(x[test], y[test])

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return DataLoader(self.val_set, batch_size=len(self.val_set))

    def test_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        return DataLoader(self.test_set, batch_size=len(self.test_set))
