"""The English text that ships with Python, as bytes: no framework needed.

``pydoc_data.topics`` holds the help topics that ``help("for")`` prints: 79 pages of the language
reference, about 466 KB of UTF-8 text, so nothing is downloaded. The tokens are the text's bytes
(a vocabulary of 256): no tokenizer to train, ship or download, and the perplexity is per byte.
``pydoc_text.PydocText`` serves them to Lightning, ``train_trainer.py`` to the HF ``Trainer``,
and the plain loops of ``distill.py`` and ``importance.py`` take them in shuffled batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pydoc_data.topics import topics

import torch
from torch.utils.data import Dataset

__all__ = [
    "VAL_FRACTION",
    "Windows",
    "load_bytes",
    "shuffled_batches",
    "split_windows",
    "val_batches",
]

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


def split_windows(data: torch.Tensor, context: int) -> tuple[Windows, Windows]:
    """The windows of the first 90% of ``data`` to train on, of the last 10% to validate.

    Example:
        >>> train, val = split_windows(torch.arange(100), context=4)
        >>> len(train), len(val), val[0].tolist()
        (22, 2, [90, 91, 92, 93, 94])
    """
    cut = round(len(data) * (1 - VAL_FRACTION))
    return Windows(data[:cut], context), Windows(data[cut:], context)


def shuffled_batches(windows: Windows, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Shuffled batches of ``batch_size`` windows, epoch after epoch, from ``seed`` (the last
    incomplete batch of an epoch dropped).

    Example:
        >>> batches = shuffled_batches(Windows(torch.arange(41), context=4), 3, seed=0)
        >>> next(batches).shape
        torch.Size([3, 5])
    """
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(windows), generator=generator)
        for first in range(0, len(order) - batch_size + 1, batch_size):
            yield torch.stack([windows[int(i)] for i in order[first : first + batch_size]])


def val_batches(windows: Windows, limit: int | None = None) -> list[torch.Tensor]:
    """The validation windows (the first ``limit`` of them), in order, in batches of 64.

    Example:
        >>> [len(batch) for batch in val_batches(Windows(torch.arange(401), context=4), 70)]
        [64, 6]
    """
    count = len(windows) if limit is None else min(len(windows), limit)
    return [
        torch.stack([windows[i] for i in range(first, min(first + 64, count))])
        for first in range(0, count, 64)
    ]
