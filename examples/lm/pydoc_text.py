"""The English text that ships with Python, as bytes, in a LightningDataModule.

``pydoc_data.topics`` holds the help topics that ``help("for")`` prints: 79 pages of the language
reference, about 466 KB of UTF-8 text, so nothing is downloaded. The tokens are the text's bytes
(a vocabulary of 256): no tokenizer to train, ship or download, and the perplexity is per byte.
"""

from __future__ import annotations

from pydoc_data.topics import topics

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

__all__ = ["PydocText", "Windows", "load_bytes"]

# The last 10% of the text is held out for validation, as in nanoGPT's character-level example:
# one contiguous split, so no validation sentence is also a training sentence.
VAL_FRACTION = 0.1


def load_bytes() -> torch.Tensor:
    """All help topics, in the order of their names, as one tensor of UTF-8 bytes (int64).

    Example:
        >>> data = load_bytes()
        >>> len(data) > 400_000, bytes(data[:22].tolist()).decode()
        (True, 'The "assert" statement')
    """
    text = "\n".join(topics[name] for name in sorted(topics))
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


class Windows(Dataset[torch.Tensor]):
    """Non-overlapping windows of ``context + 1`` tokens: inputs are ``[:-1]``, targets ``[1:]``.

    Window ``i`` starts at ``i * context``, so consecutive windows share one token and every
    token after the first is a target exactly once; the incomplete tail is dropped.

    Example:
        >>> windows = Windows(torch.arange(10), context=4)
        >>> len(windows), windows[1].tolist()
        (2, [4, 5, 6, 7, 8])
    """

    def __init__(self, data: torch.Tensor, context: int) -> None:
        self.data = data
        self.context = context

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.context

    def __getitem__(self, index: int) -> torch.Tensor:
        start = index * self.context
        return self.data[start : start + self.context + 1]


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
        data = load_bytes()
        split = round(len(data) * (1 - VAL_FRACTION))
        self.train_set = Windows(data[:split], self.context)
        self.val_set = Windows(data[split:], self.context)

    def train_dataloader(self) -> DataLoader[torch.Tensor]:
        # Shuffled windows from the seed that seed_everything sets: the dense and pruned runs of
        # one seed see the same batches in the same order.
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader[torch.Tensor]:
        # Larger batches than training: no gradients to keep, and fewer, faster steps.
        return DataLoader(self.val_set, batch_size=4 * self.batch_size)
