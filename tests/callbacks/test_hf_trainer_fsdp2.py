"""The Trainer's FSDP2 on two CPU processes (gloo): what Accelerate does there, and what the
callback refuses.

Accelerate 1.16 runs FSDP only on accelerators: on CPU (``use_cpu=True``) it keeps its
``MULTI_CPU`` state, drops the FSDP plugin and the Trainer trains with DDP. The first test pins
that (if a later Accelerate shards on CPU, it fails: then test the callback under FSDP2 here)
and the callback's refusal, made when the Trainer is. The callback's FSDP2 path runs on GPUs:
``benchmarks/gpu_hf_trainer_fsdp2.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.callbacks.test_hf_trainer_ddp import _two_ranks

pytest.importorskip("transformers")


@pytest.mark.slow
@pytest.mark.distributed
def test_on_cpu_accelerate_does_not_shard_and_the_callback_says_so(tmp_path: Path) -> None:
    rank0, rank1 = _two_ranks("hf_fsdp_cpu_worker.py", tmp_path, "fsdp_cpu")
    for found in (rank0, rank1):
        assert found["distributed_type"] == "DistributedType.MULTI_CPU"
        assert not found["is_fsdp_enabled"]
        assert found["kinds"] == ["Parameter"]  # never a DTensor: not sharded
        assert "Accelerate does not shard it here" in found["refused"]
        assert "use_cpu=True" in found["refused"]
        assert "Accelerate's state: MULTI_CPU" in found["refused"]
        assert "drops the FSDP plugin" in found["refused"]


def _masks_after_one_pruning_step(sharded: bool, out: Path) -> dict[str, Any]:
    """The session of the Trainer's callback (permanent saves, as it is made), built as it is
    built on a model sharded with FSDP2 (``permanent_saves=False``), one channel step taken;
    then training ends with ``shrink_at_end`` writing the shrunk model to ``out``."""
    from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    from tensorplay.callbacks.core.lifecycle import PruningSession, split_arguments
    from tensorplay.callbacks.transformers.json_state import find_saved, saved_entry
    from tests.core.structure.test_structure_sharded import _shard
    from tests.hf_models import tiny_llama

    model = tiny_llama().train()
    if sharded:
        _shard(model, "llama")
    arguments = {"schedule": OneShotSchedule(0.5), "structure": "channel", "masking": "inplace"}
    shrinking = {"shrink_at_end": True, "shrunk_dir": str(out)}
    config, options = split_arguments({**arguments, **shrinking, "verbose": False})
    session = PruningSession(config, options, name="P", built_when="", permanent_saves=True)
    session.build(model, permanent_saves=False if sharded else None)
    session.start([])
    session.step(0)
    entry = saved_entry("key", session.state_dict(), session.kept_zeros())  # trainer_state.json
    state, kept = find_saved(
        [{"attributes": {"saved_state": json.loads(json.dumps(entry))}}], "key"
    )
    placements = {}
    masks = {}
    for name, buffer in model.named_buffers():
        if name.endswith("_mask"):
            weight = model.get_parameter(name.removesuffix("_mask"))
            if sharded:
                placements[name] = (buffer.placements, weight.placements)  # type: ignore[attr-defined]
                buffer = buffer.full_tensor()  # type: ignore[attr-defined]  # a collective
            masks[name] = buffer.detach().clone()
    found = {"masks": masks, "pruned": session.pruner.pruned_count(), "state_step": state["step"]}
    session.finish()
    return {**found, "kept": kept, "placements": placements, "report": str(session.shrink_report)}


def _session_worker(rank: int, out: Path) -> None:
    found = _masks_after_one_pruning_step(sharded=True, out=out / "shrunk-sharded")
    if rank == 0:
        torch.save(found, out / "session.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_the_callbacks_session_builds_and_shrinks_a_sharded_model_as_on_one_process(
    tmp_path: Path,
) -> None:
    from tests.core.gloo import spawn_gloo

    spawn_gloo(_session_worker, 2, tmp_path)
    sharded = torch.load(tmp_path / "session.pt", weights_only=False)
    single = _masks_after_one_pruning_step(sharded=False, out=tmp_path / "shrunk-single")
    assert sorted(sharded["masks"]) == sorted(single["masks"]) and len(single["masks"]) > 0
    for name, mask in single["masks"].items():
        assert torch.equal(sharded["masks"][name], mask), name
    assert sharded["pruned"] == single["pruned"] > 0
    assert sharded["kept"] == {} and sharded["state_step"] == single["state_step"] == 0
    for name, (mask_placements, weight_placements) in sharded["placements"].items():
        assert mask_placements == weight_placements, name  # masks sharded like the weights
    # shrink_at_end: gathered on rank 0 and written; equal to the one process's, shrunk in place
    from transformers import LlamaForCausalLM

    from tensorplay.ao.pruning import load_shrunk

    assert sharded["report"] == single["report"] and "per layer" in single["report"]
    written = load_shrunk(LlamaForCausalLM, tmp_path / "shrunk-sharded").state_dict()
    expected = load_shrunk(LlamaForCausalLM, tmp_path / "shrunk-single").state_dict()
    assert sorted(written) == sorted(expected)
    assert all(torch.equal(written[key], value) for key, value in expected.items())
