"""``scope="row"``: each output row its own group, against torch's ``l1_unstructured`` per row."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.nn.utils import prune as torch_prune

from tensorplay.ao.pruning.masking.readers import mask_of
from tensorplay.ao.pruning.parity.amount import row_goal
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tests.model_state import unchanged

MASKINGS = ["reparametrize", "inplace"]


class Conv1D(nn.Module):
    """Hugging Face's ``Conv1D`` layout (matched by class name): weight ``(in, out)``."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)


def torch_row_mask(row: Tensor, old: Tensor, goal: int) -> Tensor:
    """torch's l1_unstructured on one row holding ``old``, pruning up to ``goal`` in the row."""
    holder = nn.Module()
    holder.weight = nn.Parameter(row.clone())
    torch_prune.custom_from_mask(holder, "weight", old.to(row.dtype))
    amount = max(0, goal - int((old == 0).sum()))
    torch_prune.l1_unstructured(holder, "weight", amount=amount)
    return holder.weight_mask.bool()


def expected_rows(weight: Tensor, old: Tensor, axis: int, target: float, density: float) -> Tensor:
    rows = weight.detach().movedim(axis, 0).reshape(weight.shape[axis], -1)
    olds = old.movedim(axis, 0).reshape(rows.shape)
    goal = row_goal(target, rows.shape[1], density)
    masks = torch.stack([torch_row_mask(r, o, goal) for r, o in zip(rows, olds, strict=True)])
    moved = weight.movedim(axis, 0).shape
    return masks.reshape(moved).movedim(0, axis)


def keep_mask(module: nn.Module, name: str = "weight") -> Tensor:
    mask = mask_of(module, name)
    assert mask is not None
    return mask.bool()


@pytest.mark.parametrize("masking", MASKINGS)
@pytest.mark.parametrize(
    ("layer", "axis"),
    [
        pytest.param(lambda: nn.Linear(10, 6), 0, id="linear"),
        pytest.param(lambda: Conv1D(7, 5), 1, id="conv1d-hf-columns"),
        pytest.param(lambda: nn.Conv2d(3, 4, 3), 0, id="conv2d-out-channels"),
    ],
)
def test_row_scope_equals_torch_l1_unstructured_row_by_row(layer, axis, masking):
    torch.manual_seed(0)
    module = layer()
    weight = module.weight.detach().clone()
    pruner = Pruner(module, OneShotSchedule(0.37), scope="row", masking=masking)
    pruned = pruner.step()
    expected = expected_rows(weight, torch.ones_like(weight, dtype=torch.bool), axis, 0.37, 0.0)
    assert torch.equal(keep_mask(module), expected)
    per_row = (~expected).movedim(axis, 0).reshape(weight.shape[axis], -1).sum(dim=1)
    goal = row_goal(0.37, weight.numel() // weight.shape[axis], 0.0)
    assert per_row.tolist() == [goal] * weight.shape[axis]
    assert pruned == goal * weight.shape[axis]


@pytest.mark.parametrize("masking", MASKINGS)
def test_rows_pruned_unevenly_before_reach_the_same_count(masking):
    """A global step first (rows uneven), then row steps: each row tops up to its goal; a row
    already beyond it keeps its pruned units."""
    torch.manual_seed(1)
    module = nn.Linear(12, 8)
    first = Pruner(module, OneShotSchedule(0.3), masking=masking)
    first.step()
    old = keep_mask(module)
    assert len(set((~old).sum(dim=1).tolist())) > 1  # uneven rows before
    weight = first.snapshot()["weight"]
    pruner = Pruner(
        module, LinearSchedule(0.5, end_step=2, frequency=1), scope="row", masking=masking
    )
    pruner.step(0)
    pruner.step(1)
    expected = expected_rows(weight, old, 0, pruner.schedule(1), 0.0)
    assert torch.equal(keep_mask(module), expected)


@pytest.mark.parametrize("masking", MASKINGS)
def test_row_ties_prune_the_lower_index_first(masking):
    module = nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        module.weight.copy_(torch.tensor([[1.0, -1.0, 1.0, 1.0], [2.0, 0.5, -0.5, 0.5]]))
    Pruner(module, OneShotSchedule(0.5), scope="row", masking=masking).step()
    assert keep_mask(module).int().tolist() == [[0, 0, 1, 1], [1, 0, 0, 1]]


@pytest.mark.parametrize("masking", MASKINGS)
def test_row_min_density_caps_every_row(masking):
    torch.manual_seed(2)
    module = nn.Linear(10, 3)
    pruner = Pruner(module, OneShotSchedule(0.9), scope="row", min_density=0.25, masking=masking)
    assert pruner.step() == 3 * 7  # each row keeps ceil(0.25 * 10) = 3
    assert (~keep_mask(module)).sum(dim=1).tolist() == [7, 7, 7]


@pytest.mark.parametrize("masking", MASKINGS)
def test_a_one_dimensional_tensor_is_one_group(masking):
    torch.manual_seed(3)
    module = nn.Linear(4, 6)
    bias = module.bias.detach().clone()
    Pruner(module, OneShotSchedule(0.5), parameters=["bias"], scope="row", masking=masking).step()
    expected = torch_row_mask(bias, torch.ones(6, dtype=torch.bool), 3)
    assert torch.equal(keep_mask(module, "bias"), expected)


def test_both_maskings_give_the_same_row_masks_over_a_schedule():
    masks = []
    for masking in MASKINGS:
        torch.manual_seed(4)
        model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), Conv1D(16, 8))
        pruner = Pruner(model, LinearSchedule(0.8, end_step=4), scope="row", masking=masking)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if pruner.mode.hooks_optimizers:
            pruner.attach(optimizer)
        for step in range(6):
            model(torch.randn(4, 16)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            pruner.step(step)
        masks.append([keep_mask(model[0]), keep_mask(model[2])])
    assert all(torch.equal(a, b) for a, b in zip(*masks, strict=True))


def test_row_random_unstructured_prunes_exact_counts_and_is_seeded():
    def run() -> Tensor:
        module = nn.Linear(9, 5)
        Pruner(
            module, OneShotSchedule(0.5), scope="row", method="random_unstructured", seed=7
        ).step()
        return keep_mask(module)

    first, second = run(), run()
    assert torch.equal(first, second)
    assert (~first).sum(dim=1).tolist() == [round(0.5 * 9)] * 5


class HalfOfAll(BasePruningMethod):
    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: int) -> None:
        self.amount = amount

    def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
        return default_mask


def test_row_scope_refuses_a_method_without_streaming_keys():
    with pytest.raises(ValueError, match="scope='row', but got HalfOfAll"):
        PrunerConfig(OneShotSchedule(0.5), scope="row", method=HalfOfAll)


def test_row_scope_refuses_nan_scores_before_anything_changes():
    module = nn.Linear(3, 2)
    with torch.no_grad():
        module.weight[1, 1] = float("nan")
    check = unchanged(module)
    pruner = Pruner(module, OneShotSchedule(0.5), scope="row")
    with pytest.raises(ValueError, match=r"finite importance scores.*nan at flat index 4"):
        pruner.step()
    check()


def test_unknown_scope_names_the_choices():
    with pytest.raises(ValueError, match="'global', 'layerwise' or 'row', but got 'rows'"):
        PrunerConfig(OneShotSchedule(0.5), scope="rows")  # type: ignore[arg-type]
