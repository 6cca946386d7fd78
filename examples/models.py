"""The networks and the LightningModule that trains them on digits.

Two architectures, chosen by ``arch``: the 64-256-256-10 MLP that the sweep uses (about 85k
prunable weights, all in three ``Linear`` layers) and a small CNN (two 3x3 convolutions and one
``Linear``, about 10k weights) to show that pruning reaches ``Conv2d`` weights as well.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from tensorplay.callbacks import PrunableMixin

__all__ = ["DigitsClassifier", "make_cnn", "make_mlp"]

Batch = tuple[torch.Tensor, torch.Tensor]  # images (N, 64), labels (N,)


def make_mlp(hidden: int = 256) -> nn.Sequential:
    """A 64-``hidden``-``hidden``-10 MLP with named layers ``fc1``, ``fc2``, ``fc3``.

    Example:
        >>> make_mlp(8)(torch.zeros(2, 64)).shape
        torch.Size([2, 10])
    """
    return nn.Sequential(
        OrderedDict(
            fc1=nn.Linear(64, hidden),
            act1=nn.ReLU(),
            fc2=nn.Linear(hidden, hidden),
            act2=nn.ReLU(),
            fc3=nn.Linear(hidden, 10),
        )
    )


def make_cnn(channels: int = 16) -> nn.Sequential:
    """Two 3x3 convolutions (``channels``, then twice as many), a 2x2 max-pool and a classifier.

    Example:
        >>> make_cnn(4)(torch.zeros(2, 64)).shape
        torch.Size([2, 10])
    """
    return nn.Sequential(
        OrderedDict(
            image=nn.Unflatten(1, (1, 8, 8)),
            conv1=nn.Conv2d(1, channels, 3, padding=1),
            act1=nn.ReLU(),
            conv2=nn.Conv2d(channels, 2 * channels, 3, padding=1),
            act2=nn.ReLU(),
            pool=nn.MaxPool2d(2),
            flat=nn.Flatten(),
            fc=nn.Linear(2 * channels * 4 * 4, 10),
        )
    )


class DigitsClassifier(PrunableMixin, pl.LightningModule):
    """Classifies 8x8 digits; logs ``train/loss``, ``val/acc``, ``val/loss`` and ``test/acc``.

    :class:`~tensorplay.callbacks.PrunableMixin` lets ``load_from_checkpoint`` load a pruned
    checkpoint (``_orig`` and ``_mask`` tensors) into this fresh, dense model.

    Args:
        arch: ``"mlp"`` (64-``width``-``width``-10) or ``"cnn"`` (``width`` channels first).
        width: Hidden units of the MLP, or channels of the CNN's first convolution.
        lr: Adam's learning rate.

    Example:
        >>> model = DigitsClassifier(arch="cnn", width=4)
        >>> model(torch.zeros(3, 64)).shape
        torch.Size([3, 10])
    """

    def __init__(
        self, arch: Literal["mlp", "cnn"] = "mlp", width: int = 256, lr: float = 1e-3
    ) -> None:
        super().__init__()
        if arch not in ("mlp", "cnn"):
            raise ValueError(f"Expected `arch` to be 'mlp' or 'cnn', but got {arch!r}.")
        self.save_hyperparameters()
        self.net = make_mlp(width) if arch == "mlp" else make_cnn(width)
        self.val_acc = MulticlassAccuracy(num_classes=10, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=10, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_acc(logits, y)
        self.log("val/loss", F.cross_entropy(logits, y))
        self.log("val/acc", self.val_acc)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        x, y = batch
        self.test_acc(self(x), y)
        self.log("test/acc", self.test_acc)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # Adam at a constant rate: pruning callbacks change the weights under the optimizer, and
        # a constant rate keeps fine-tuning after the last pruning step as strong as before it.
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
