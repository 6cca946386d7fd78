"""Lean masks zero the pruned gradients as autograd accumulates them: gradient clipping and a
logged norm computed right after the backward exclude the pruned entries (single process and
DDP), the hooks follow the masks, and they are gone once the pruning is permanent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from tensorplay.ao.pruning.masking.restore import restore_pruning
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tests.core.gloo import spawn_gloo


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def weights(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def masked_norm(model: nn.Module) -> Tensor:
    """The gradients' 2-norm with every pruned entry taken as zero, by hand."""
    grads = []
    for layer in weights(model):
        assert layer.weight.grad is not None and layer.bias.grad is not None
        grads += [layer.weight.grad * layer.weight_mask, layer.bias.grad]
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def pruned_gradients(model: nn.Module) -> list[int]:
    """Per layer, its pruned entries whose gradient is not zero."""
    found = []
    for layer in weights(model):
        assert layer.weight.grad is not None
        found.append(int((layer.weight.grad[~layer.weight_mask] != 0).sum()))
    return found


def test_clip_norm_after_backward_is_the_norm_of_the_masked_gradients():
    model = mlp()
    pruner = Pruner(model, OneShotSchedule(0.6), masking="inplace")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pruner.attach(optimizer)
    pruner.step(0)
    for _ in range(2):  # two backward passes per step: each accumulation is masked
        model(torch.randn(5, 8)).pow(2).mean().backward()
    assert pruned_gradients(model) == [0, 0]
    expected = masked_norm(model)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e-3)
    # The same gradients summed in the same order: equal to float32 rounding.
    torch.testing.assert_close(norm, expected, rtol=1e-6, atol=0.0)
    optimizer.step()
    assert pruner.pruned_count() == round(0.6 * pruner.total_count())


def test_the_hooks_follow_masks_pruned_later_and_go_with_make_permanent():
    model = mlp()
    pruner = Pruner(model, OneShotSchedule(0.5, step=1), masking="inplace")
    pruner.reparametrize()  # all-kept masks: the hooks are on, masking nothing yet
    pruner.step(0)
    pruner.step(1)
    model(torch.randn(5, 8)).sum().backward()
    assert pruned_gradients(model) == [0, 0]
    pruned = [~layer.weight_mask for layer in weights(model)]
    pruner.make_permanent()
    model.zero_grad()
    model(torch.randn(5, 8)).sum().backward()
    grads = [layer.weight.grad for layer in weights(model)]
    left = [int((grad[p] != 0).sum()) for grad, p in zip(grads, pruned, strict=True)]
    assert all(count > 0 for count in left)  # a permanent model's gradients are its own


def test_a_pruner_over_restored_lean_masks_hooks_their_gradients():
    first = mlp()
    Pruner(first, OneShotSchedule(0.5), masking="inplace").step(0)
    state = first.state_dict()
    second = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    restore_pruning(second, state)
    second.load_state_dict(state, strict=True)
    Pruner(second, OneShotSchedule(0.5), masking="inplace")
    second(torch.randn(5, 8)).sum().backward()
    assert pruned_gradients(second) == [0, 0]


def test_the_reparametrization_needs_no_hook_autograd_masks_its_gradients():
    model = mlp()
    Pruner(model, OneShotSchedule(0.6)).step(0)
    model(torch.randn(5, 8)).sum().backward()
    for layer in weights(model):
        assert int((layer.weight_orig.grad[layer.weight_mask == 0] != 0).sum()) == 0


def _ddp_worker(rank: int, out: Path) -> None:
    for bucket_view in (False, True):
        model = mlp()
        pruner = Pruner(model, OneShotSchedule(0.6), masking="inplace", seed=0)
        pruner.step(0)
        ddp = DistributedDataParallel(model, gradient_as_bucket_view=bucket_view)
        data = torch.Generator().manual_seed(10 + rank)  # each rank its own batch
        ddp(torch.randn(5, 8, generator=data)).pow(2).mean().backward()
        expected = masked_norm(model)
        found = pruned_gradients(model)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e-3)
        norms = [torch.zeros(()) for _ in range(dist.get_world_size())]
        dist.all_gather(norms, norm)
        torch.save(
            {"pruned": found, "norm": norm, "expected": expected, "norms": norms},
            out / f"{rank}-{bucket_view}.pt",
        )


@pytest.mark.distributed
def test_ddp_all_reduced_gradients_keep_the_pruned_entries_zero(tmp_path):
    spawn_gloo(_ddp_worker, 2, tmp_path)
    for rank in range(2):
        for bucket_view in (False, True):
            found = torch.load(tmp_path / f"{rank}-{bucket_view}.pt", weights_only=True)
            assert found["pruned"] == [0, 0]
            torch.testing.assert_close(found["norm"], found["expected"], rtol=1e-6, atol=0.0)
            assert torch.equal(found["norms"][0], found["norms"][1])  # one gradient everywhere


# -- the pre-step pass masks what the hooks have not provably masked ------------------------------


def _local(tensor: Tensor) -> Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def record_seen(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[list[int]]:
    """Per step, per layer, the pruned entries whose gradient the optimizer steps with is not
    zero (a step pre-hook registered after the pruner's, so it sees what the step uses)."""
    seen: list[list[int]] = []

    def record(*_: object) -> None:
        found = []
        for layer in weights(model):
            grad, mask = _local(layer.weight.grad), _local(layer.weight_mask)
            found.append(int((grad[~mask] != 0).sum()))
        seen.append(found)

    optimizer.register_step_pre_hook(record)
    return seen


def lean_run(sparsity: float = 0.6, step: int = 0) -> tuple[nn.Module, Pruner, Any]:
    model = mlp()
    pruner = Pruner(model, OneShotSchedule(sparsity, step=step), masking="inplace")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pruner.attach(optimizer)
    pruner.step(0)
    return model, pruner, optimizer


def hooks_left(pruner: Pruner, model: nn.Module) -> int:
    """How many pruned weights the pre-step pass would mask again now."""
    params = [layer.weight for layer in weights(model)]
    masks = [layer.weight_mask for layer in weights(model)]
    return len(pruner.mode._gradient_masks.unmasked(params, masks)[0])  # type: ignore[attr-defined]


def backward(model: nn.Module, seed: int = 0) -> None:
    data = torch.Generator().manual_seed(seed)
    model(torch.randn(5, 8, generator=data)).pow(2).mean().backward()


def test_gradients_the_hooks_masked_are_not_masked_again_and_the_step_sees_them_masked():
    model, pruner, optimizer = lean_run()
    seen = record_seen(optimizer, model)
    backward(model)
    assert hooks_left(pruner, model) == 0  # the pre-step pass has nothing left to do
    optimizer.step()
    assert seen == [[0, 0]]


def test_accumulated_gradients_are_masked_by_the_last_hook():
    model, pruner, optimizer = lean_run()
    seen = record_seen(optimizer, model)
    for seed in range(3):  # three micro-batches, one step
        backward(model, seed)
    assert hooks_left(pruner, model) == 0
    optimizer.step()
    assert seen == [[0, 0]]


def test_gradients_kept_in_place_by_zero_grad_are_masked_by_the_hook_of_their_backward():
    model, pruner, optimizer = lean_run()
    seen = record_seen(optimizer, model)
    for seed in range(2):
        optimizer.zero_grad(set_to_none=False)  # the same tensors, zeroed in place
        backward(model, seed)
        assert hooks_left(pruner, model) == 0
        optimizer.step()
    assert seen == [[0, 0], [0, 0]]


def test_gradients_set_by_hand_fire_no_hook_and_are_masked_before_the_step():
    model, pruner, optimizer = lean_run()
    seen = record_seen(optimizer, model)
    backward(model)
    for layer in weights(model):
        layer.weight.grad = torch.ones_like(layer.weight)  # `p.grad = g`: no hook runs
    assert hooks_left(pruner, model) == 2
    optimizer.step()
    assert seen == [[0, 0]]
    assert pruned_gradients(model) == [0, 0]


def test_gradients_written_in_place_after_the_backward_are_masked_before_the_step():
    model, pruner, optimizer = lean_run()
    seen = record_seen(optimizer, model)
    backward(model)
    with torch.no_grad():
        weights(model)[0].weight.grad.add_(1.0)  # e.g. noise added by hand
    assert hooks_left(pruner, model) == 1
    optimizer.step()
    assert seen == [[0, 0]]


def test_units_pruned_between_the_backward_and_the_step_are_masked_before_the_step():
    model, pruner, optimizer = lean_run(sparsity=0.6, step=1)
    seen = record_seen(optimizer, model)
    backward(model)  # the hooks mask with the masks of step 0 (nothing pruned)
    assert pruner.step(1) > 0  # prunes 60%: masks the hooks did not see
    assert hooks_left(pruner, model) == 2
    optimizer.step()
    assert seen == [[0, 0]]


def _add_one_after_all_reduce(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations as objects
    """A lossy communication hook: the mean, plus 1 everywhere (pruned entries included)."""
    world = dist.get_world_size()
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda done: done.value()[0].div_(world).add_(1.0))


def _shard(model: nn.Module) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in weights(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


# DDP copying its buckets into the gradients or holding them as views of its buckets.
WAYS = ("ddp", "ddp-lossy", "ddp-view", "ddp-view-lossy", "fsdp2")


def _several_ranks_worker(rank: int, out: Path) -> None:
    results = {}
    for way in WAYS:
        model = mlp()
        pruner = Pruner(model, OneShotSchedule(0.6), masking="inplace", seed=0)
        if way == "fsdp2":
            _shard(model)
            trained: nn.Module = model
        else:
            trained = DistributedDataParallel(model, gradient_as_bucket_view="view" in way)
            if "lossy" in way:
                trained.register_comm_hook(None, _add_one_after_all_reduce)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        pruner.attach(optimizer)
        pruner.step(0)
        seen = record_seen(optimizer, model)
        for step in range(2):
            data = torch.Generator().manual_seed(10 * step + rank)  # each rank its own batch
            trained(torch.randn(5, 8, generator=data)).pow(2).mean().backward()
            left = hooks_left(pruner, model)
            optimizer.step()
            optimizer.zero_grad()
        results[way] = {"seen": seen, "left": left}
    torch.save(results, out / f"{rank}.pt")


@pytest.mark.distributed
def test_with_several_ranks_every_gradient_is_masked_before_the_step(tmp_path):
    """DDP writes the all-reduced gradients outside autograd (a lossy communication hook puts
    values in the pruned entries) and FSDP2's sharded parameters have no hook: with several
    ranks the pre-step pass masks every gradient."""
    spawn_gloo(_several_ranks_worker, 2, tmp_path)
    for rank in range(2):
        found = torch.load(tmp_path / f"{rank}.pt", weights_only=True)
        for way in WAYS:
            assert found[way] == {"seen": [[0, 0], [0, 0]], "left": 2}, way
