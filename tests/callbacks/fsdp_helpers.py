"""Lightning's ``ModelParallelStrategy`` (FSDP2) on CPU in tests: a sharded module and a launcher.

``ModelParallelStrategy`` launches its processes by re-running the script (its
``_SubprocessScriptLauncher``), which under pytest would re-run pytest. Lightning skips its
launcher when the processes already exist (``LOCAL_RANK`` set, as ``torchrun`` does), so
:func:`run_ranks` spawns the ranks itself with torchrun's variables and each rank builds its own
``Trainer``. Workers live here, in an importable module, so spawned processes can unpickle them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import Tensor, nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from tests.core.gloo import end_rank, wait_ranks

__all__ = [
    "SHARDED_TOTAL",
    "ShardRecorder",
    "ShardedTiny",
    "full_state",
    "model_parallel_trainer",
    "run_ranks",
]

# net.0.weight (13 x 8: shards of 7 and 6 rows on two ranks) and net.2.weight (4 x 13).
SHARDED_TOTAL = 13 * 8 + 4 * 13


class ShardedTiny(pl.LightningModule):
    """An 8-13-4 MLP, each ``Linear`` and the whole sharded with ``fully_shard`` over the data
    parallel mesh in ``configure_model``; momentum SGD on fixed data, in a fixed order.

    Args:
        seed: seeds the initial weights, independently of the global RNG.
        lr: the SGD learning rate.
        samples: the number of training samples (batches of 4 per rank).
    """

    def __init__(self, seed: int = 0, lr: float = 0.1, samples: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.net = nn.Sequential(nn.Linear(8, 13), nn.ReLU(), nn.Linear(13, 4))

    def configure_model(self) -> None:
        if self.device_mesh is None:  # a single process: nothing to shard
            return
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self, mesh=mesh)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self.training_step(batch, batch_idx)
        self.log("val_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)

    def train_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        generator = torch.Generator().manual_seed(1234)
        n = self.hparams["samples"]
        x = torch.randn(n, 8, generator=generator)
        y = torch.randint(0, 4, (n,), generator=generator)
        return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False)

    def val_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        return self.train_dataloader()


class ShardRecorder(Callback):
    """Gather the full weights and masks after the optimizer step ``step`` (a collective: every
    rank records). Placed before ``GradualPruning`` it sees them before that step's pruning,
    after it, after.
    """

    def __init__(self, step: int) -> None:
        self.step = step
        self.state: dict[str, Tensor] = {}

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        if trainer.global_step == self.step:
            self.state = full_state(pl_module)


def model_parallel_trainer(world_size: int, **kwargs: Any) -> pl.Trainer:
    """A quiet CPU ``Trainer`` under ``ModelParallelStrategy`` (data parallel only, gloo)."""
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": world_size,
        "strategy": ModelParallelStrategy(data_parallel_size=world_size, tensor_parallel_size=1),
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "log_every_n_steps": 1,
    }
    options.update(kwargs)
    return pl.Trainer(**options)


def full_state(module: nn.Module) -> dict[str, Tensor]:
    """The module's state_dict with every DTensor gathered (a collective: call on every rank)."""
    return {
        name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().clone()
        for name, value in module.state_dict().items()
    }


def run_ranks(worker: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run ``worker(rank, world_size, *args)`` in ``world_size`` spawned processes that
    Lightning treats as launched from outside (torchrun's environment variables)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.start_processes(
        _entry,
        args=(worker, world_size, port, args),
        nprocs=world_size,
        start_method="spawn",
        join=False,
    )
    wait_ranks(context, getattr(worker, "__qualname__", repr(worker)))


def _entry(
    rank: int, worker: Callable[..., None], world_size: int, port: int, args: tuple[Any, ...]
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
    )
    torch.set_num_threads(1)  # two ranks on a shared two-core machine
    worker(rank, world_size, *args)
    if dist.is_initialized():  # Lightning leaves it up: gloo must not exit with a peer mid-call
        dist.barrier()
        dist.destroy_process_group()
    end_rank()
