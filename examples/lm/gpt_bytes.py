"""A small GPT-2 over byte tokens, from Hugging Face ``transformers``: no framework needed.

The network is ``transformers.GPT2LMHeadModel`` built from a ``GPT2Config`` (random init; nothing
is downloaded). Its attention and MLP projections are HF ``Conv1D`` modules (a ``Linear`` with a
transposed weight); its output head ``lm_head`` shares its weight with the token embedding
``transformer.wte``. ``tiny_gpt.TinyGPT`` trains it with Lightning, ``train_trainer.py`` with
the HF ``Trainer``, and :func:`train` in a plain loop (``distill.py``, ``importance.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

if TYPE_CHECKING:
    from tensorplay.ao.pruning import Distillation, Pruner

__all__ = ["VOCAB", "copy_of", "gpt_config", "nll", "perplexity", "train"]

VOCAB = 256  # byte tokens


def gpt_config(context: int, n_layer: int, n_embd: int, n_head: int) -> GPT2Config:
    """The ``GPT2Config`` of the network: GPT-2's defaults but for the sizes and these.

    Example:
        >>> gpt_config(context=64, n_layer=2, n_embd=32, n_head=2).vocab_size
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


def nll(net: GPT2LMHeadModel, batch: torch.Tensor) -> torch.Tensor:
    """The summed negative log-likelihood of ``batch[:, 1:]`` given the bytes before each.

    Example:
        >>> net = GPT2LMHeadModel(gpt_config(context=8, n_layer=1, n_embd=8, n_head=2))
        >>> nll(net, torch.zeros(2, 9, dtype=torch.long)).shape
        torch.Size([])
    """
    logits = net(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")


@torch.no_grad()
def perplexity(net: GPT2LMHeadModel, batches: Iterable[torch.Tensor]) -> float:
    """``exp`` of the mean negative log-likelihood per target byte over all ``batches``.

    Example:
        >>> net = GPT2LMHeadModel(gpt_config(context=8, n_layer=1, n_embd=8, n_head=2))
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


def copy_of(net: GPT2LMHeadModel) -> GPT2LMHeadModel:
    """A new network of ``net``'s config holding a copy of its weights.

    Example:
        >>> net = GPT2LMHeadModel(gpt_config(context=8, n_layer=1, n_embd=8, n_head=2))
        >>> twin = copy_of(net)
        >>> twin is not net and torch.equal(twin.lm_head.weight, net.lm_head.weight)
        True
    """
    fresh = GPT2LMHeadModel(net.config)
    fresh.load_state_dict(net.state_dict())
    return fresh


def train(
    net: GPT2LMHeadModel,
    batches: Iterator[torch.Tensor],
    steps: int,
    pruner: Pruner | None = None,
    distill: Distillation | None = None,
    lr: float = 1e-3,
) -> None:
    """``steps`` AdamW steps on the next-byte loss, plus the distillation term if ``distill`` is
    given; ``pruner.step(step)`` after each optimizer step.

    The pruner is attached to the optimizer first: lean masks keep the pruned weights at zero
    through the steps, and gradient-based scores accumulate at each step.

    Example:
        >>> net = GPT2LMHeadModel(gpt_config(context=8, n_layer=1, n_embd=8, n_head=2))
        >>> train(net, iter([torch.randint(0, 256, (2, 9))] * 2), steps=2)
    """
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, betas=(0.9, 0.99))
    if pruner is not None:
        pruner.attach(optimizer)
    net.train()
    for step in range(steps):
        batch = next(batches)
        loss = nll(net, batch) / batch[:, 1:].numel()
        if distill is not None:
            loss = loss + distill.loss()  # the teacher saw the same forward
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if pruner is not None:
            pruner.step(step)
