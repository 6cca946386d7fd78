"""Distillation under FSDP2: the teacher copied shard by shard, gradients against one process.

Two gloo ranks on CPU shard a tiny Llama (grouped-query attention; ``fully_shard`` on each
decoder layer and the root) and an MLP whose layers split unevenly (7 = 4 + 3 and 13 = 7 + 6
rows), attach a :class:`Distillation` (its teacher: :func:`dense_copy` of the sharded student,
sharded like it), prune channels once (``masking="inplace"``) so that the student differs from
its teacher, and back-propagate ``task + distill.loss()`` on their half of a batch. One process
does the same on the whole batch with the unsharded model. FSDP2 averages the ranks' gradients,
and both losses are means over equal halves, so the full gradients, the teacher's full weights
and the mean of the ranks' KD terms equal the one process's: weights exactly, floats within
``atol=1e-6, rtol=1e-5`` (float32; the sums are grouped differently). A teacher the user shards
gives the same term; a teacher saved with ``torch.distributed.checkpoint`` loads back exactly;
a student under a bfloat16 ``MixedPrecisionPolicy`` gets a teacher computing what it computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import Distillation, OneShotSchedule, Pruner, dense_copy

pytest.importorskip("transformers")

WORLD = 2
ATOL, RTOL = 1e-6, 1e-5
TOKENS = torch.randint(0, 97, (4, 8), generator=torch.Generator().manual_seed(7))
FAMILIES = ("llama", "mlp")


def _model(family: str) -> nn.Module:
    if family == "llama":
        from tests.hf_models import tiny_llama

        return tiny_llama().train()
    torch.manual_seed(0)  # 3 logits: a KD term that one logit (a softmax of 1) would not give
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 13), nn.ReLU(), nn.Linear(13, 3))


def _shard(model: nn.Module, family: str) -> None:
    from tests.core.structure.test_structure_sharded import _shard as shard_llama
    from tests.core.test_inplace_sharded import _shard as shard_mlp

    if family == "llama":
        shard_llama(model, "llama")
    else:
        shard_mlp(model)


def _batch(family: str) -> Tensor:
    if family == "llama":
        return TOKENS
    return torch.randn(4, 5, generator=torch.Generator().manual_seed(8))


def _task(model: nn.Module, family: str, inputs: Tensor) -> Tensor:
    if family == "llama":
        return model(inputs, labels=inputs).loss  # type: ignore[no-any-return]
    return model(inputs).square().mean()


def _full(tensor: Tensor) -> Tensor:
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return full.detach().clone()


def distilled(
    family: str, rank: int | None = None, teacher: nn.Module | None = None
) -> dict[str, Any]:
    """Attach, prune, one backward of task + KD on the rank's half (``None``: one process, the
    whole batch); the full gradients, the teacher's full weights and the KD term."""
    student = _model(family)
    if rank is not None:
        _shard(student, family)
    distill = Distillation(teacher, temperature=2.0, weight=0.7).attach(student)
    example = _batch(family)[:1] if family == "mlp" else None
    Pruner(
        student,
        OneShotSchedule(0.5),
        masking="inplace",
        structure="channel",
        example_inputs=example,
    ).step()
    inputs = _batch(family)
    if rank is not None:
        inputs = inputs.chunk(WORLD)[rank]
    (_task(student, family, inputs) + distill.loss()).backward()
    assert distill.teacher is not None
    sharded_after = all(  # the teacher's root too: it runs no backward, which would reshard it
        type(p).__name__ == "DTensor" for p in distill.teacher.parameters()
    )
    return {
        "sharded_after": sharded_after,
        "grads": {n: _full(p.grad) for n, p in student.named_parameters() if p.grad is not None},
        "teacher": {n: _full(t) for n, t in distill.teacher.state_dict().items()},
        "kd": float(distill.last_loss),  # type: ignore[arg-type]
        "frozen": not any(p.requires_grad for p in distill.teacher.parameters()),
        "pruned": sum(int((_full(p) == 0).sum()) for p in student.parameters()),
    }


def _given_teacher(family: str) -> nn.Module:
    teacher = _model(family)  # the student as it is before pruning, sharded by the user
    _shard(teacher, family)
    return teacher


def _resumed(family: str, out: Path) -> bool:
    """A teacher saved with torch.distributed.checkpoint loads back into another sharded copy."""
    import torch.distributed.checkpoint as dcp

    student = _model(family)
    _shard(student, family)
    teacher = dense_copy(student)
    dcp.save(teacher.state_dict(), checkpoint_id=out / f"teacher-{family}")
    other = _model(family)
    with torch.no_grad():
        for param in other.parameters():
            param.mul_(2.0)
    _shard(other, family)
    fresh = dense_copy(other)
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=out / f"teacher-{family}")
    before = {n: _full(t) for n, t in teacher.state_dict().items()}
    return all(torch.equal(_full(t), before[n]) for n, t in fresh.state_dict().items())


def _bfloat16(family: str) -> bool:
    """``teacher_dtype=torch.bfloat16``: each local shard is the student's, converted."""
    student = _model(family)
    _shard(student, family)
    teacher = dense_copy(student, torch.bfloat16)
    pairs = zip(student.parameters(), teacher.parameters(), strict=True)
    return all(
        t.dtype == torch.bfloat16 and torch.equal(t.to_local(), s.to_local().to(torch.bfloat16))  # type: ignore[attr-defined]
        for s, t in pairs
    )


def _mixed_precision() -> bool:
    """A student computing in bfloat16 (``MixedPrecisionPolicy``): the copy is sharded with the
    same policy, so it computes exactly what the student computes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    student = _model("mlp")
    mesh = init_device_mesh("cpu", (WORLD,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in student:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(student, mesh=mesh, mp_policy=policy)
    teacher = dense_copy(student)
    inputs = _batch("mlp")
    with torch.no_grad():
        expected, got = student.eval()(inputs), teacher(inputs)
    return expected.dtype == torch.bfloat16 and torch.equal(got, expected)


def _worker(rank: int, out: Path) -> None:
    results: dict[str, Any] = {}
    for family in FAMILIES:
        results[family] = distilled(family, rank)
        results[f"{family}-given"] = distilled(family, rank, _given_teacher(family))
        results[f"{family}-resumed"] = _resumed(family, out)
        results[f"{family}-bfloat16"] = _bfloat16(family)
    results["mixed-precision"] = _mixed_precision()
    torch.save(results, out / f"rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_distillation_equals_one_process(tmp_path):
    from tests.core.gloo import spawn_gloo

    spawn_gloo(_worker, WORLD, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    oracles = {family: distilled(family) for family in FAMILIES}
    for family, oracle in oracles.items():
        assert oracle["kd"] > 0 and oracle["pruned"] > 0, family  # the student left its teacher
        for key in (family, f"{family}-given"):
            kd = sum(rank[key]["kd"] for rank in ranks) / WORLD  # the mean of two equal halves
            assert kd == pytest.approx(oracle["kd"], abs=ATOL, rel=RTOL), key
            for rank in ranks:
                got = rank[key]
                assert got["frozen"] and got["pruned"] == oracle["pruned"], key
                assert got["sharded_after"], key
                assert sorted(got["grads"]) == sorted(oracle["grads"]), key
                for name, grad in oracle["grads"].items():
                    torch.testing.assert_close(got["grads"][name], grad, atol=ATOL, rtol=RTOL)
                assert sorted(got["teacher"]) == sorted(oracle["teacher"]), key
                for name, weight in oracle["teacher"].items():
                    assert torch.equal(got["teacher"][name], weight), (key, name)
        for rank in ranks:
            assert rank[f"{family}-resumed"] and rank[f"{family}-bfloat16"], family
    assert all(rank["mixed-precision"] for rank in ranks)
