"""The English text that ships with Python, as bytes: no framework needed.

``pydoc_data.topics`` holds the help topics that ``help("for")`` prints: 79 pages of the language
reference, about 466 KB of UTF-8 text, so nothing is downloaded. The tokens are the text's bytes
(a vocabulary of 256): no tokenizer to train, ship or download, and the perplexity is per byte.
``pydoc_text.PydocText`` serves them to Lightning, ``train_trainer.py`` to the HF ``Trainer``.
"""

from __future__ import annotations

from pydoc_data.topics import topics

import torch
from torch.utils.data import Dataset

__all__ = ["VAL_FRACTION", "Windows", "load_bytes"]

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
