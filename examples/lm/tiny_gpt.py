"""A small GPT-2 from Hugging Face ``transformers``, as a LightningModule over byte tokens.

The network is ``transformers.GPT2LMHeadModel`` built from a ``GPT2Config`` (random init; nothing
is downloaded). Its attention and MLP projections are HF ``Conv1D`` modules (a ``Linear`` with a
transposed weight); its output head ``lm_head`` shares its weight with the token embedding
``transformer.wte``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from tensorplay.callbacks import PrunableMixin

__all__ = ["TinyGPT", "nll", "perplexity"]

VOCAB = 256  # byte tokens


def nll(net: GPT2LMHeadModel, batch: torch.Tensor) -> torch.Tensor:
    """The summed negative log-likelihood of ``batch[:, 1:]`` given the bytes before each.

    Example:
        >>> net = GPT2LMHeadModel(TinyGPT.config(context=8, n_layer=1, n_embd=8, n_head=2))
        >>> nll(net, torch.zeros(2, 9, dtype=torch.long)).shape
        torch.Size([])
    """
    logits = net(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")


@torch.no_grad()
def perplexity(net: GPT2LMHeadModel, batches: Iterable[torch.Tensor]) -> float:
    """``exp`` of the mean negative log-likelihood per target byte over all ``batches``.

    Example:
        >>> net = GPT2LMHeadModel(TinyGPT.config(context=8, n_layer=1, n_embd=8, n_head=2))
        >>> 200 < perplexity(net, [torch.randint(0, 256, (2, 9))]) < 330  # untrained: about 256
        True
    """
    training = net.training
    net.eval()
    total, count = 0.0, 0
    for batch in batches:
        total += float(nll(net, batch))
        count += batch[:, 1:].numel()
    net.train(training)
    return math.exp(total / count)


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
        """The ``GPT2Config`` of the network: GPT-2's defaults but for the sizes and these.

        Example:
            >>> TinyGPT.config(context=64, n_layer=2, n_embd=32, n_head=2).vocab_size
            256
        """
        return GPT2Config(
            vocab_size=VOCAB,
            n_positions=context,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            # No dropout: a few epochs over the text underfit a model this size rather than
            # overfit it, and without dropout a pruned weight's effect is seen at every step.
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            # Bytes have no special tokens (GPT-2's 50256 is outside a vocabulary of 256).
            bos_token_id=None,
            eos_token_id=None,
        )

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
