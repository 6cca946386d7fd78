"""The Trainer's FSDP2 on two CPU processes (gloo): what Accelerate does there, what the callback
refuses, and the sharded teacher's checkpoint the callback writes under FSDP2.

Accelerate 1.16 runs FSDP only on accelerators: on CPU (``use_cpu=True``) it keeps its
``MULTI_CPU`` state, drops the FSDP plugin and the Trainer trains with DDP. The first test pins
that (if a later Accelerate shards on CPU, it fails: then test the callback under FSDP2 here)
and the callback's refusal, made when the Trainer is. The callback's FSDP2 path runs on GPUs:
``benchmarks/gpu_hf_trainer_fsdp2.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

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
        assert "drops the FSDP plugin" in found["refused"]


def _teacher_worker(rank: int, out: Path) -> None:
    from tensorplay.ao.pruning import dense_copy
    from tensorplay.callbacks._sharded_teacher import save_teacher, teacher_loader
    from tests.core.structure.test_structure_sharded import _shard
    from tests.hf_models import tiny_llama

    student = tiny_llama(seed=0)
    _shard(student, "llama")
    teacher = dense_copy(student)  # sharded like the student
    save_teacher(teacher, out / "teacher")
    other = tiny_llama(seed=1)  # other weights: the load must replace every shard
    _shard(other, "llama")
    copy = dense_copy(other)
    load = teacher_loader(out / "teacher")
    assert load is not None
    load(copy)
    # full_tensor is a collective: every rank gathers, rank zero writes.
    full = {key: value.full_tensor() for key, value in copy.state_dict().items()}
    expected = {key: value.full_tensor() for key, value in teacher.state_dict().items()}
    if rank == 0:
        torch.save({"loaded": full, "expected": expected}, out / "teacher.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_sharded_teacher_saved_by_every_rank_loads_back_exactly(tmp_path: Path) -> None:
    from tests.core.gloo import spawn_gloo

    spawn_gloo(_teacher_worker, 2, tmp_path)
    saved = torch.load(tmp_path / "teacher.pt", weights_only=True)
    loaded, expected = saved["loaded"], saved["expected"]
    assert sorted(loaded) == sorted(expected) and len(loaded) > 0
    for key, value in expected.items():
        assert torch.equal(loaded[key], value), key
    assert not torch.equal(expected["model.embed_tokens.weight"], _seed1_embedding())


def _seed1_embedding() -> torch.Tensor:
    from tests.hf_models import tiny_llama

    model: nn.Module = tiny_llama(seed=1)
    embedding: torch.Tensor = model.state_dict()["model.embed_tokens.weight"]
    return embedding
