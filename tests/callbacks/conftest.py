"""Fixtures for the Lightning callback tests: a fast CPU ``Trainer`` factory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import CSVLogger

MakeTrainer = Callable[..., pl.Trainer]


@pytest.fixture
def make_trainer(tmp_path: Path) -> MakeTrainer:
    """A factory for quiet single-process CPU trainers logging to ``tmp_path/logs``.

    Keyword arguments override the defaults (no checkpoints, no progress bar, log every step).
    """

    def make(**kwargs: Any) -> pl.Trainer:
        options: dict[str, Any] = {
            "accelerator": "cpu",
            "devices": 1,
            "max_epochs": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "enable_checkpointing": False,
            "log_every_n_steps": 1,
            "logger": CSVLogger(tmp_path, name="logs", version=0),
            "default_root_dir": tmp_path,
        }
        options.update(kwargs)
        return pl.Trainer(**options)

    return make
