"""A folder saved with its units masked (lean masks) is shrunk later exactly as the model it was
saved from: ``load_masked`` brings back the masks, the config the recorded groups, and
``shrink`` removes the masked units, never a unit that is merely zero."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from tensorplay.ao.pruning import Pruner, load_masked, load_shrunk, shrink
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.ao.pruning.structured.dependency.recorded import RECORD_ATTRIBUTE, recorded_groups
from tests.hf_models import tiny_llama

transformers = pytest.importorskip("transformers")
LLAMA = transformers.LlamaForCausalLM


def _pruned(structure: str | tuple[str, ...] = "channel") -> nn.Module:
    model = tiny_llama()
    if isinstance(structure, tuple):  # several kinds: against a parameter budget
        schedule, budget = OneShotSchedule(), 0.7
    else:
        schedule, budget = OneShotSchedule(0.5), None
    Pruner(model, schedule, structure=structure, target_params=budget, masking="inplace").step(0)
    return model


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


@pytest.mark.parametrize("structure", ["channel", "head", ("channel", "head")])
def test_a_masked_folder_loads_with_its_masks_and_shrinks_as_the_model_saved(
    tmp_path: Path, structure: str | tuple[str, ...]
) -> None:
    model = _pruned(structure)
    model.save_pretrained(tmp_path / "masked")
    saved = json.loads((tmp_path / "masked" / "config.json").read_text())
    assert len(saved[RECORD_ATTRIBUTE]) == len(recorded_groups(model)) > 0
    loaded = load_masked(LLAMA, tmp_path / "masked")
    masks = {k: v for k, v in _state(model).items() if k.endswith("_mask")}
    got = {k: v for k, v in _state(loaded).items() if k.endswith("_mask")}
    assert sorted(got) == sorted(masks)
    assert all(torch.equal(got[key], mask) for key, mask in masks.items())
    assert recorded_groups(loaded) == recorded_groups(model)
    expected, report = shrink(model), shrink(loaded)
    assert str(report) == str(expected)
    assert _state(loaded).keys() == _state(model).keys()
    assert all(torch.equal(_state(loaded)[k], v) for k, v in _state(model).items())
    assert getattr(loaded.config, RECORD_ATTRIBUTE) == []  # shrinking forgot the groups it cut
    loaded.save_pretrained(tmp_path / "shrunk")
    again = load_shrunk(LLAMA, tmp_path / "shrunk")
    assert all(torch.equal(_state(again)[k], v) for k, v in _state(model).items())


def test_a_kept_unit_that_is_zero_stays_it_is_not_taken_for_a_masked_one(tmp_path: Path) -> None:
    model = _pruned()
    mlp = model.model.layers[0].mlp
    kept = int(mlp.up_proj.weight_mask[:, 0].nonzero()[0])  # a kept channel, zeroed by hand
    with torch.no_grad():
        mlp.gate_proj.weight[kept] = 0
        mlp.up_proj.weight[kept] = 0
        mlp.down_proj.weight[:, kept] = 0
    model.save_pretrained(tmp_path)
    by_masks = load_masked(LLAMA, tmp_path)
    by_zeros = LLAMA.from_pretrained(tmp_path)
    shrink(by_masks)
    shrink(by_zeros)
    width = by_masks.model.layers[0].mlp.up_proj.out_features
    assert width == int(mlp.up_proj.weight_mask[:, 0].sum())
    assert by_zeros.model.layers[0].mlp.up_proj.out_features == width - 1


def test_a_folder_without_masks_or_with_changed_weights_is_refused(tmp_path: Path) -> None:
    tiny_llama().save_pretrained(tmp_path / "dense")
    with pytest.raises(ValueError, match=r"`<name>_mask` tensors in .*dense.* holds none"):
        load_masked(LLAMA, tmp_path / "dense")
    model = _pruned()
    model.save_pretrained(tmp_path / "changed")
    path = tmp_path / "changed" / "model.safetensors"
    weights = load_file(path)
    name = "model.layers.1.mlp.up_proj.weight"
    weights[name] = torch.ones_like(weights[name])  # the pruned rows are no longer zero
    save_file(weights, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"pruned entries of '{name}' to be zero.*are not"):
        load_masked(LLAMA, tmp_path / "changed")
    with pytest.raises(ValueError, match=r"Expected a Hugging Face model folder"):
        load_masked(LLAMA, tmp_path / "nowhere")
