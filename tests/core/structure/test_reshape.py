"""A freshly built model reshaped to a shrunk model's record loads its weights strictly and
computes what it computes; a model that does not fit the record is refused before any change."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import DependencyGraph, shrink
from tensorplay.ao.pruning.structured.dependency.blocks import find_blocks
from tensorplay.ao.pruning.structured.dependency.unit_groups import shapes_of
from tensorplay.ao.pruning.structured.shrinking.reshape import ShrunkShapes, reshape
from tests.core.structure.masking import every_other, mask_units
from tests.hf_models import tiny_gpt2, tiny_gpt_neox, tiny_llama, tiny_phi3
from tests.model_state import unchanged

TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])


def _shrunk(build, kinds, layers_dropped=(1,)):  # type: ignore[no-untyped-def]
    model = build()
    graph = DependencyGraph(model)
    keeps = [(group, every_other(group)) for kind in kinds for group in graph.groups(kind)]
    for index in layers_dropped:
        group = graph.groups("layer")[index]
        keeps.append((group, torch.tensor([False])))
    mask_units(model, keeps, "zeros")
    names = find_blocks(model).block_names()
    record = ShrunkShapes.of(model, shrink(model), names)
    return model, ShrunkShapes.from_dict(record.to_dict())


@pytest.mark.parametrize(
    ("build", "kinds"),
    [
        pytest.param(tiny_llama, ("channel", "head"), id="llama-channels-heads-a-layer"),
        pytest.param(tiny_gpt2, ("head",), id="gpt2-heads-a-layer"),
        pytest.param(tiny_phi3, ("channel", "head"), id="phi3-channels-heads-a-layer"),
        pytest.param(tiny_gpt_neox, ("head",), id="gpt_neox-heads-a-layer"),
    ],
)
def test_a_fresh_model_reshaped_loads_the_shrunk_weights_strictly(build, kinds) -> None:  # type: ignore[no-untyped-def]
    model, record = _shrunk(build, kinds)
    assert record.dropped_layers == (1,)
    fresh = build(seed=1)
    reshape(fresh, record)
    assert shapes_of(fresh) == shapes_of(model)
    fresh.load_state_dict(model.state_dict(), strict=True)
    assert fresh.config.num_hidden_layers == model.config.num_hidden_layers
    with torch.no_grad():
        torch.testing.assert_close(fresh(TOKENS).logits, model(TOKENS).logits)
    reshape(fresh, record)  # already shrunk: nothing changes
    assert shapes_of(fresh) == shapes_of(model)


def test_a_model_of_other_blocks_is_refused_unchanged() -> None:
    _, record = _shrunk(tiny_llama, ("channel",))
    other = tiny_llama()
    del other.model.layers[1:]  # neither the 3 blocks before nor the 2 after
    check = unchanged(other)
    with pytest.raises(ValueError, match="to have 3 blocks, as the shrunk model had"):
        reshape(other, record)
    check()


def test_a_smaller_or_missing_parameter_is_refused_unchanged() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    record = ShrunkShapes(0, (), {"0.weight": (5, 4)})
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"'0.weight' to be at least as large .* \(5, 4\)"):
        reshape(model, record)
    check()
    with pytest.raises(ValueError, match=r"to have the parameter '1\.weight'"):
        reshape(model, ShrunkShapes(0, (), {"1.weight": (2, 3)}))
    check()


def test_a_record_missing_keys_is_refused() -> None:
    with pytest.raises(ValueError, match=r"lacks \['dropped_layers', 'shapes'\]"):
        ShrunkShapes.from_dict({"layers_before": 2})
