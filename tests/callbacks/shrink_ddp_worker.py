"""One rank of the two-process shrink_at_end test (launched by ``torchrun``): trains a tiny Llama
under the Trainer's DDP with half of its FFN channels pruned (ranked globally, so the widths
differ per block), shrinks it at the end, and writes its weights and config widths to
``<out>/shrunk_rank<r>.pt``.

Each rank starts from its own weights and its own seed: DDP broadcasts rank zero's weights and
the callback rank zero's seed, so both ranks must shrink to the same model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import make_trainer
from tests.core.gloo import end_rank
from tests.hf_models import tiny_llama


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    pruning = GradualPruningCallback(
        LinearSchedule(0.5, end_step=4, frequency=2), structure="channel", shrink_at_end=True,
        verbose=False,
    )  # fmt: skip
    model = tiny_llama(seed=rank).train()
    trainer = make_trainer(model, out / "run", [pruning], ddp_backend="gloo", seed=rank)
    trainer.train()
    assert dist.is_initialized() and dist.get_world_size() == 2
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    widths = [layer.mlp.up_proj.out_features for layer in model.model.layers]
    torch.save({"weights": weights, "widths": widths}, out / f"shrunk_rank{rank}.pt")
    dist.barrier()  # as in hf_ddp_worker.py: no rank exits with a collective in flight
    dist.destroy_process_group()
    end_rank()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
