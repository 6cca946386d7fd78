"""One rank of the two-process test of the Trainer's ``fsdp`` on CPU (launched by ``torchrun``):
what Accelerate makes of FSDP2 there, and the callback's refusal when the Trainer is made.

Writes ``<out>/fsdp_cpu_rank<r>.pt``: Accelerate's distributed type and the Trainer's
``is_fsdp_enabled`` for a Trainer with ``fsdp`` and no callback, the kinds of the model's
parameters after training one step (``Parameter``: never sharded), and the message with which a
Trainer given the callback was refused.
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

# FSDP2 as the Trainer's docs ask for it: each decoder layer its own unit.
FSDP = {
    "fsdp": True,
    "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
    "ddp_backend": "gloo",
    "max_steps": 1,
}


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    model = tiny_llama().train()
    trainer = make_trainer(model, out / "plain", [], **FSDP)
    trainer.train()
    kinds = sorted({type(param).__name__ for param in model.parameters()})
    found = {
        "distributed_type": str(trainer.accelerator.state.distributed_type),
        "is_fsdp_enabled": bool(trainer.is_fsdp_enabled),
        "kinds": kinds,
    }
    pruning = GradualPruningCallback(LinearSchedule(0.5, end_step=2), masking="inplace")
    try:
        make_trainer(tiny_llama().train(), out / "pruned", [pruning], **FSDP)
        found["refused"] = ""
    except ValueError as error:
        found["refused"] = str(error)
    torch.save(found, out / f"fsdp_cpu_rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    end_rank()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
