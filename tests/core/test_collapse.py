"""Layer collapse is never silent: a global pruning step that empties a small output layer
warns once, naming it and the fixes; ``min_density`` prevents it (no warning), and the layer-wise
scope never warns. The functional ``global_unstructured`` keeps torch's masks and warns for each
tensor a call empties, at the caller's line."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import nn

from tensorplay.ao.pruning import global_unstructured
from tensorplay.ao.pruning.parity.collapse import keeps_any
from tensorplay.ao.pruning.parity.methods import L1Unstructured
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule


def classifier() -> nn.Sequential:
    """A newcomer's MLP whose small output layer, ``Linear(64, 4)``, holds the smallest weights
    (as after training with weight decay on a few classes)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    model.append(nn.Linear(64, 4))
    with torch.no_grad():
        model[4].weight.mul_(0.05)
    return model


def collapse_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "layer collapse" in str(w.message)]


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_a_global_step_that_empties_the_output_layer_warns_once_naming_it(masking):
    model = classifier()
    pruner = Pruner(model, LinearSchedule(0.8, end_step=4, frequency=2), masking=masking)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(6):
            pruner.step(step)
    report = {row.name: row for row in pruner.report().rows}
    assert report["4.weight"].pruned == report["4.weight"].numel == 256  # collapsed
    found = collapse_warnings(caught)
    assert len(found) == 1  # two steps left it empty, one warning
    assert "'4.weight' is 100% pruned" in found[0]
    assert "min_density=" in found[0] and "keep_dense=['last']" in found[0]
    assert caught[0].filename == __file__  # points at the user's pruner.step line


def test_min_density_prevents_the_collapse_and_the_warning():
    model = classifier()
    pruner = Pruner(model, OneShotSchedule(0.8), min_density=0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pruner.step(0)
    assert collapse_warnings(caught) == []
    assert int((model[4].weight_mask == 0).sum()) < 256
    assert pruner.pruned_count() == round(0.8 * pruner.total_count())


def test_keep_dense_last_prevents_it_too():
    model = classifier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Pruner(model, OneShotSchedule(0.8), keep_dense=["last"]).step(0)
    assert collapse_warnings(caught) == [] and not hasattr(model[4], "weight_mask")


def test_the_layerwise_scope_never_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Pruner(classifier(), OneShotSchedule(0.8), scope="layerwise").step(0)
    assert collapse_warnings(caught) == []


def _masks(model: nn.Sequential) -> list[torch.Tensor]:
    return [model[i].weight_mask for i in (0, 2, 4)]


def test_global_unstructured_keeps_torchs_masks_and_warns_at_the_callers_line():
    model, theirs = classifier(), classifier()
    torch_prune.global_unstructured(
        [(theirs[i], "weight") for i in (0, 2, 4)], torch_prune.L1Unstructured, amount=0.8
    )
    pairs = [(model[i], "weight") for i in (0, 2, 4)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        global_unstructured(pairs, pruning_method=L1Unstructured, amount=0.8)
    for ours, torchs in zip(_masks(model), _masks(theirs), strict=True):
        assert torch.equal(ours, torchs)  # torch's masks: the output layer is emptied
    assert int(model[4].weight_mask.sum()) == 0 and int(model[2].weight_mask.sum()) > 0
    found = [w for w in caught if "layer collapse" in str(w.message)]
    assert len(found) == 1  # the output layer alone
    message = str(found[0].message)
    assert message.startswith(
        "global_unstructured pruned all 256 units of the pair at position 2 of `parameters`: "
        "(Linear(in_features=64, out_features=4, bias=True), 'weight') is 100% pruned"
    )
    assert "amount" in message and "min_density=" in message and "keep_dense=['last']" in message
    assert (found[0].filename, found[0].lineno) == (__file__, line)


def test_global_unstructured_names_a_tied_tensor_by_all_its_pairs():
    torch.manual_seed(0)
    embedding, head = nn.Embedding(4, 8), nn.Linear(8, 4, bias=False)
    head.weight = embedding.weight
    body = nn.Linear(8, 64)
    with torch.no_grad():
        embedding.weight.mul_(1e-4)  # below every weight of body
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        global_unstructured(
            [(embedding, "weight"), (body, "weight"), (head, "weight")],
            L1Unstructured,
            amount=32,
        )
    found = collapse_warnings(caught)
    assert len(found) == 1
    assert "all 32 units of the pairs at positions 0 and 2 of `parameters`" in found[0]


@pytest.mark.parametrize("amount", [0.5, 0.8])
def test_global_unstructured_is_silent_when_every_tensor_keeps_a_unit(amount):
    model = classifier()
    with torch.no_grad():
        model[4].weight.mul_(20.0)  # as large as the others: no layer is emptied
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        global_unstructured(
            [(model[i], "weight") for i in (0, 2, 4)], L1Unstructured, amount=amount
        )
    assert collapse_warnings(caught) == []
    assert all(int(mask.sum()) > 0 for mask in _masks(model))


def test_global_unstructured_warns_when_a_later_call_empties_a_tensor_and_not_again():
    model = classifier()
    pairs = [(model[i], "weight") for i in (0, 2, 4)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        global_unstructured(pairs, L1Unstructured, amount=128)
        assert collapse_warnings(caught) == [] and 0 < int(model[4].weight_mask.sum()) < 256
        global_unstructured(pairs, L1Unstructured, amount=0.5)  # empties it
        assert len(collapse_warnings(caught)) == 1
        assert int(model[4].weight_mask.sum()) == 0
        global_unstructured(pairs, L1Unstructured, amount=0.5)  # it was empty already
    assert len(collapse_warnings(caught)) == 1


def test_the_pruners_global_scope_warns_once_not_also_as_global_unstructured():
    model = classifier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Pruner(model, OneShotSchedule(0.8)).step(0)
    found = collapse_warnings(caught)
    assert len(found) == 1 and found[0].startswith("Global pruning at step 0")


def test_keeps_any_reads_past_the_head_of_a_mask_and_any_layout():
    mask = torch.zeros(100_000)
    assert not keeps_any(mask) and not keeps_any(mask.bool())
    mask[-1] = 1.0  # past the first elements read
    assert keeps_any(mask) and keeps_any(mask.bool()) and keeps_any(mask.to(torch.bfloat16))
    assert keeps_any(mask.reshape(1000, 100).t())  # not contiguous
    assert keeps_any(torch.zeros(0))  # nothing to empty
