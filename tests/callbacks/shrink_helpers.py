"""What the shrink_at_end tests share: a Lightning module holding a tiny Llama, a recorder of the
masked model's logits when training ends, and loading saved folders with transformers alone in
a fresh process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from tensorplay.callbacks import PrunableMixin
from tests.hf_models import VOCAB, tiny_llama

__all__ = ["TOKENS", "LitLlama", "MaskedLogits", "from_pretrained_logits", "logits_of"]

TOKENS = torch.tensor([[1, 5, 9, 2, 7, 3, 8, 4]])


def logits_of(model: nn.Module, tokens: Tensor = TOKENS) -> Tensor:
    """The logits of ``model`` (a causal LM, or a module holding one as ``model``) in
    evaluation mode; its mode is restored."""
    training = model.training
    model.eval()
    with torch.no_grad():
        out = model(tokens)
    model.train(training)
    return (out if isinstance(out, Tensor) else out.logits).detach().clone()


class LitLlama(PrunableMixin, pl.LightningModule):
    """A tiny Llama (:func:`~tests.hf_models.tiny_llama`) as ``model``, trained with AdamW on
    fixed random token sequences."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = tiny_llama(seed).train()

    def forward(self, tokens: Tensor) -> Tensor:
        return self.model(tokens).logits  # type: ignore[no-any-return]

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        logits = self(batch[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    def test_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        return self.training_step(batch, batch_idx)

    def test_dataloader(self) -> DataLoader[Tensor]:
        return self.train_dataloader()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader[Tensor]:
        generator = torch.Generator().manual_seed(0)
        data = torch.randint(0, VOCAB, (32, 17), generator=generator)
        return DataLoader(list(data), batch_size=4)


class MaskedLogits(Callback):
    """Lightning: the logits of the masked model when training ends (put it before the pruning
    callback: ``on_fit_end``, where the model is shrunk, comes after ``on_train_end``)."""

    def __init__(self) -> None:
        self.logits: Tensor | None = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.logits = logits_of(pl_module)


def from_pretrained_logits(directories: list[Path], out: Path) -> list[Tensor]:
    """The logits of :data:`TOKENS` of each folder loaded with plain
    ``AutoModelForCausalLM.from_pretrained``, in a fresh process that never imports
    tensorplay."""
    script = textwrap.dedent(
        f"""
        import sys
        import torch
        from transformers import AutoModelForCausalLM
        logits = []
        for directory in {[str(d) for d in directories]!r}:
            model = AutoModelForCausalLM.from_pretrained(directory).eval()
            with torch.no_grad():
                logits.append(model(torch.tensor({TOKENS.tolist()!r})).logits)
        assert not [name for name in sys.modules if name.startswith("tensorplay")]
        torch.save(logits, {str(out)!r})
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: Any = torch.load(out, weights_only=True)
    return list(loaded)
