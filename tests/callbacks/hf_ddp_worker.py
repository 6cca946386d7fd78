"""One rank of the two-process DDP test (launched by ``torchrun``): trains a tiny GPT-2 with two
pruning callbacks (L1 with lean masks on block 0, random on block 1) and writes its masks and
weights to ``<out>/masks_rank<r>.pt``.

Each rank starts from its own weights and its own seed: DDP broadcasts rank zero's weights and
the callback rank zero's seed, so the masks must be the same on both.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import make_trainer, masks
from tests.core.gloo import end_rank
from tests.hf_models import tiny_gpt2


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    schedule = LinearSchedule(0.6, end_step=4, frequency=2)
    callbacks = [
        GradualPruningCallback(schedule, include=[r"\.h\.0\."], masking="inplace", verbose=False),
        GradualPruningCallback(
            schedule, method="random_unstructured", include=[r"\.h\.1\."], verbose=False
        ),
    ]
    model = tiny_gpt2(seed=rank).train()
    trainer = make_trainer(model, out / "run", callbacks, ddp_backend="gloo", seed=rank)
    trainer.train()
    assert dist.is_initialized() and dist.get_world_size() == 2
    pruned = [callback.pruner.pruned_count() for callback in callbacks]
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    state = {"masks": masks(model), "pruned": pruned, "weights": weights}
    torch.save(state, out / f"masks_rank{rank}.pt")
    # Every rank passes the barrier before the group is torn down: a rank that exits with a
    # peer's last collective in flight can abort the other at interpreter exit.
    dist.barrier()
    dist.destroy_process_group()
    end_rank()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
