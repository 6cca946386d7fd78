"""A tiny Hugging Face ``Trainer`` run: random tokens, CPU, quiet, nothing downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from tests.hf_models import VOCAB

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """``count`` fixed random sequences of ``length`` tokens, each its own language-model label
    (GPT-2 shifts the labels itself)."""

    def __init__(self, count: int = 64, length: int = 16, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (count, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def training_args(output_dir: Path, **kwargs: Any) -> Any:
    """``TrainingArguments`` for a few CPU steps; ``kwargs`` override."""
    options: dict[str, Any] = {
        "output_dir": str(output_dir),
        "max_steps": 6,
        "per_device_train_batch_size": 4,
        "learning_rate": 1e-3,
        "use_cpu": True,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    options.update(kwargs)
    return transformers.TrainingArguments(**options)


def make_trainer(model: nn.Module, output_dir: Path, callbacks: list[Any], **kwargs: Any) -> Any:
    """A ``Trainer`` of ``model`` on :class:`Tokens` with ``callbacks``."""
    return transformers.Trainer(
        model=model,
        args=training_args(output_dir, **kwargs),
        train_dataset=Tokens(),
        callbacks=callbacks,
    )


class StepRecorder(transformers.TrainerCallback):  # type: ignore[misc]
    """Records the masks of ``pruning``'s model when training begins and after each optimizer
    step, and the units they prune (put it after the pruning callback: callbacks run in order)."""

    def __init__(self, pruning: Any) -> None:
        self.pruning = pruning
        self.pruned: dict[int, int] = {}
        self.masks: dict[int, dict[str, torch.Tensor]] = {}
        self.begin: dict[str, torch.Tensor] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.begin = masks(self.pruning.pruner.model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.pruned[state.global_step] = masked_zeros(self.pruning.pruner.model)
        self.masks[state.global_step] = masks(self.pruning.pruner.model)


def masks(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every ``*_mask`` buffer of ``model`` (a tied one under each of its names), cloned."""
    return {
        name: buffer.detach().clone()
        for name, buffer in model.named_buffers(remove_duplicate=False)
        if name.endswith("_mask")
    }


def masked_zeros(model: nn.Module) -> int:
    """Units pruned by ``model``'s masks, a tied mask counted once."""
    seen: dict[int, torch.Tensor] = {}
    for name, buffer in model.named_buffers(remove_duplicate=False):
        if name.endswith("_mask"):
            seen[id(buffer)] = buffer
    return sum(int((mask == 0).sum()) for mask in seen.values())
