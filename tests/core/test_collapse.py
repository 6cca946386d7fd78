"""Layer collapse is never silent: a global pruning step that empties a small output layer
warns once, naming it and the fixes; ``min_density`` prevents it (no warning), and neither the
layer-wise scope nor the functional ``global_unstructured`` warns."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import global_unstructured
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


def test_the_layerwise_scope_and_global_unstructured_never_warn():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Pruner(classifier(), OneShotSchedule(0.8), scope="layerwise").step(0)
        model = classifier()
        pairs = [(model[i], "weight") for i in (0, 2, 4)]
        global_unstructured(pairs, pruning_method=L1Unstructured, amount=0.8)
    assert collapse_warnings(caught) == []
    assert int((model[4].weight_mask == 0).sum()) == 256  # torch's behaviour: collapsed
