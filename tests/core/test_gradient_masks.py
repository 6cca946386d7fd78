"""Lean masks zero the pruned gradients as autograd accumulates them: gradient clipping and a
logged norm computed right after the backward exclude the pruned entries (single process and
DDP), the hooks follow the masks, and they are gone once the pruning is permanent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from tensorplay.ao.pruning.checkpoint import restore_pruning
from tensorplay.ao.pruning.pruner import Pruner
from tensorplay.ao.pruning.schedules import OneShotSchedule
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
