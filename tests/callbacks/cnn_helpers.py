"""A tiny CNN (conv-bn-relu twice, pooled, flattened into a Linear) as a LightningModule and as
a plain module for the Hugging Face Trainer: tracing it without example inputs stops at the pool,
so its second conv is a unit only when the callbacks trace it with inputs."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

__all__ = ["CHANNELS", "CnnModule", "CnnNet", "CnnNetTakingKwargs", "Images", "cnn", "images"]

# Every conv's output channels: the units of structure="channel" (the Linear's are its outputs).
CHANNELS = 8 + 16


def cnn(seed: int = 0) -> nn.Sequential:
    """The network, seeded independently of the global RNG."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4),
        )  # fmt: skip


def images(count: int = 32, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``count`` random 3 x 6 x 6 images and labels in ``range(4)``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 3, 6, 6, generator=generator), torch.randint(
        0, 4, (count,), generator=generator
    )


class CnnModule(pl.LightningModule):
    """The CNN trained with SGD on :func:`images` in batches of 8.

    Args:
        example_input_array: Set as the module's ``example_input_array`` when given.
        forward_in_step: Whether ``training_step`` calls ``self(x)`` (else ``self.net(x)``).
    """

    def __init__(self, example_input_array: Any = None, forward_in_step: bool = True) -> None:
        super().__init__()
        self.net = cnn()
        self.example_input_array = example_input_array
        self.forward_in_step = forward_in_step

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x) if self.forward_in_step else self.net(x)
        return F.cross_entropy(logits, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        return DataLoader(TensorDataset(*images()), batch_size=8)


class CnnNet(nn.Module):
    """The CNN as the Hugging Face Trainer takes a plain module: keyword inputs, the loss in a
    dict."""

    def __init__(self) -> None:
        super().__init__()
        self.net = cnn()

    def forward(self, pixel_values: Tensor, labels: Tensor | None = None) -> dict[str, Tensor]:
        logits = self.net(pixel_values)
        if labels is None:
            return {"logits": logits}
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class Images(Dataset[dict[str, Tensor]]):
    """:func:`images` as the dicts the Trainer collates."""

    def __init__(self) -> None:
        self.x, self.y = images()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {"pixel_values": self.x[index], "labels": self.y[index]}


class CnnNetTakingKwargs(CnnNet):
    """:class:`CnnNet` whose forward takes ``**kwargs``: the Trainer then passes
    ``num_items_in_batch`` too."""

    def forward(  # type: ignore[override]
        self, pixel_values: Tensor, labels: Tensor | None = None, **kwargs: Any
    ) -> dict[str, Tensor]:
        return super().forward(pixel_values, labels)
