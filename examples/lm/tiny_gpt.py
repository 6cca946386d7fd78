"""A small GPT-2 from Hugging Face ``transformers``, as a LightningModule over byte tokens.

The network, its loss and ``perplexity()`` are :mod:`gpt_bytes`'s (re-exported here).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from gpt_bytes import VOCAB, gpt_config, nll, perplexity
from transformers import GPT2Config, GPT2LMHeadModel

from tensorplay.callbacks import PrunableMixin

__all__ = ["VOCAB", "TinyGPT", "nll", "perplexity"]


class TinyGPT(PrunableMixin, pl.LightningModule):
    """A GPT-2 language model over bytes; logs ``train/loss`` and ``val/loss`` (nats per byte).

    Args:
        context: The longest input, in tokens (``n_positions``); the CLI sets it from the data.
        n_layer: Transformer blocks.
        n_embd: Width of the residual stream.
        n_head: Attention heads per block.
        lr: AdamW's learning rate.

    Example:
        >>> model = TinyGPT(context=16, n_layer=1, n_embd=16, n_head=2)
        >>> model.net(input_ids=torch.zeros(1, 16, dtype=torch.long)).logits.shape
        torch.Size([1, 16, 256])
    """

    def __init__(
        self,
        context: int = 128,
        n_layer: int = 4,
        n_embd: int = 128,
        n_head: int = 4,
        lr: float = 1e-3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = GPT2LMHeadModel(self.config(context, n_layer, n_embd, n_head))

    @staticmethod
    def config(context: int, n_layer: int, n_embd: int, n_head: int) -> GPT2Config:
        """The network's ``GPT2Config`` (:func:`gpt_bytes.gpt_config`).

        Example:
            >>> TinyGPT.config(context=64, n_layer=2, n_embd=32, n_head=2).vocab_size
            256
        """
        return gpt_config(context, n_layer, n_embd, n_head)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = nll(self.net, batch) / batch[:, 1:].numel()
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        # Weighted by the number of targets, so the epoch's value is the mean over every byte.
        targets = batch[:, 1:].numel()
        self.log("val/loss", nll(self.net, batch) / targets, batch_size=targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # A constant rate, as in the digits example: fine-tuning after the last pruning step is
        # as strong as training before it. betas=(0.9, 0.99) as nanoGPT's character-level model:
        # with few tokens per step, a slightly shorter second-moment memory trains faster.
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, betas=(0.9, 0.99))
