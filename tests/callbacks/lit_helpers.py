"""A tiny LightningModule and recording callbacks for the callback tests.

They live in an importable module with a unique name (not in conftest.py) so that ``ddp_spawn``
workers can unpickle them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningCLI
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from tensorplay.callbacks import PrunableMixin

__all__ = [
    "LIGHTNING_SETS",
    "LlamaLM",
    "MaskRecorder",
    "PrunableTiny",
    "RankMaskWriter",
    "RankTeacherWriter",
    "TinyModule",
    "TOTAL",
    "ValidatedTiny",
    "fit_with_checkpoints",
    "masks_of",
]

# net.0.weight (16 x 8) and net.2.weight (4 x 16): the default selection.
TOTAL = 16 * 8 + 4 * 16

# The attributes a Lightning fit sets on the LightningModule it runs, whatever tensorplay does:
# left out of `tests.model_state.unchanged(module, ignoring=LIGHTNING_SETS)`.
LIGHTNING_SETS = ("_trainer", "_current_fx_name", "_device", "_device_mesh")


class TinyModule(pl.LightningModule):
    """An 8-16-4 MLP trained with momentum SGD on fixed random data, in a fixed order.

    Args:
        seed: seeds the initial weights, independently of the global RNG.
        lr: the SGD learning rate.
        samples: the number of training samples (batches of 8).
    """

    def __init__(self, seed: int = 0, lr: float = 0.1, samples: int = 64) -> None:
        super().__init__()
        self.save_hyperparameters()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)

    def train_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        generator = torch.Generator().manual_seed(1234)
        n = self.hparams["samples"]
        x = torch.randn(n, 8, generator=generator)
        y = torch.randint(0, 4, (n,), generator=generator)
        return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)


class LlamaLM(pl.LightningModule):
    """A tiny Hugging Face Llama (``self.net``) trained as a causal LM on batches of token ids
    (:func:`fit_with_checkpoints`)."""

    def __init__(self) -> None:
        super().__init__()
        from tests.hf_models import tiny_llama

        self.net = tiny_llama()

    def training_step(self, batch: Tensor, index: int) -> Tensor:
        loss: Tensor = self.net(input_ids=batch, labels=batch).loss
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit_with_checkpoints(
    module: pl.LightningModule, pruning: Callback, folder: Path, steps: int, resume: str | None
) -> None:
    """Fit ``module`` with ``pruning`` for ``steps`` steps on fixed random tokens (batches of 4
    sequences of 8), a checkpoint every 3 steps in ``folder``, from ``resume`` if given."""
    saving = pl.callbacks.ModelCheckpoint(dirpath=folder, every_n_train_steps=3, save_top_k=-1)
    trainer = pl.Trainer(
        max_steps=steps, callbacks=[pruning, saving], logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    data = torch.randint(0, 50, (32, 8), generator=torch.Generator().manual_seed(1))
    trainer.fit(module, DataLoader(data, batch_size=4), ckpt_path=resume)  # type: ignore[arg-type]


class ValidatedTiny(TinyModule):
    """:class:`TinyModule` with a validation loop on its training data."""

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self.training_step(batch, batch_idx)

    def val_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        return self.train_dataloader()


class PrunableTiny(PrunableMixin, TinyModule):
    """:class:`TinyModule` that loads pruned checkpoints strictly."""


def masks_of(module: nn.Module) -> dict[str, Tensor]:
    """Every ``<name>_mask`` buffer, cloned, by fully qualified name."""
    return {
        name: buffer.detach().clone()
        for name, buffer in module.named_buffers()
        if name.endswith("_mask")
    }


def pruned_count(module: nn.Module) -> int:
    """Zeros across every mask."""
    return sum(int((mask == 0).sum()) for mask in masks_of(module).values())


class MaskRecorder(Callback):
    """Record ``(global_step, batch_idx, pruned units)`` at the start and after every batch.

    Place it after the pruning callback so it sees each step's masks.
    """

    def __init__(self) -> None:
        self.records: list[tuple[int, int, int]] = []
        self.optimizer_states: list[int] = []
        self.weights: dict[int, dict[str, Tensor]] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.records.append((trainer.global_step, -1, pruned_count(pl_module)))
        self._keep_weights(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        batch_idx = args[-1]
        self.records.append((trainer.global_step, batch_idx, pruned_count(pl_module)))
        self.optimizer_states.append(len(trainer.optimizers[0].state))
        self._keep_weights(trainer, pl_module)

    def _keep_weights(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.weights[trainer.global_step] = {
            name: value.detach().clone() for name, value in pl_module.state_dict().items()
        }


class RankMaskWriter(Callback):
    """Give each rank its own global seed at setup; save its masks and effective weights at the
    end of training.

    Different seeds per rank make the test fail unless the pruning callback shares one seed.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        torch.manual_seed(1000 + trainer.global_rank)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        path = Path(self.directory) / f"masks_rank{trainer.global_rank}.pt"
        weights = {
            name: pl_module.get_submodule(name).weight.detach() for name in ("net.0", "net.2")
        }
        torch.save({"masks": masks_of(pl_module), "weights": weights}, path)


class RankTeacherWriter(Callback):
    """Save each rank's masks, weights and the first GradualPruning's teacher (its weights) at
    the end of training."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from tensorplay.callbacks import GradualPruning

        pruning = next(c for c in trainer.callbacks if isinstance(c, GradualPruning))  # type: ignore[attr-defined]
        distillation = pruning._session.distilling.distillation
        teacher = {} if distillation is None else distillation.teacher.state_dict()
        weights = {name: value.detach() for name, value in pl_module.state_dict().items()}
        path = Path(self.directory) / f"teacher_rank{trainer.global_rank}.pt"
        torch.save({"masks": masks_of(pl_module), "teacher": teacher, "weights": weights}, path)


# A quiet CPU trainer with one GradualPruning in a LightningCLI config: append the callback's
# init_args (indented by 8) and any top-level keys.
CLI_TRAINER = """
trainer:
  accelerator: cpu
  max_steps: {max_steps}
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
  callbacks:
    - class_path: tensorplay.callbacks.GradualPruning
      init_args:
"""


def lightning_cli(tmp_path: Path, config: str) -> LightningCLI:
    """A LightningCLI of ``TinyModule`` from the YAML ``config``, not run."""
    path = tmp_path / "config.yaml"
    path.write_text(config)
    return LightningCLI(
        TinyModule,
        args=["--config", str(path), f"--trainer.default_root_dir={tmp_path}"],
        run=False,
        save_config_callback=None,
    )
