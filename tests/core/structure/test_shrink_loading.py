"""A shrunk model saved with save_pretrained loads in a fresh process: with uniform widths by
plain transformers (no tensorplay import), to the same outputs; with widths per layer through
load_shrunk, while plain from_pretrained stops with a size mismatch (never a wrong model)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import DependencyGraph, load_shrunk, shrink
from tests.core.structure.masking import mask_units
from tests.core.structure.test_shrink import (
    gpt2,
    inputs_for,
    uneven_keeps,
    uniform_keeps,
)
from tests.hf_models import (
    tiny_bert,
    tiny_gemma3,
    tiny_gpt_neox,
    tiny_llama,
    tiny_olmo2,
    tiny_phi3,
    tiny_qwen3,
    tiny_vit,
)

transformers = pytest.importorskip("transformers")

# name: (builder, kinds shrunk uniformly or None for uneven widths, auto class)
UNIFORM = {
    "llama": (tiny_llama, ("channel", "head", "layer"), "AutoModelForCausalLM"),
    "qwen3": (tiny_qwen3, ("channel", "head", "layer"), "AutoModelForCausalLM"),
    "gpt2": (gpt2, ("channel", "layer"), "AutoModelForCausalLM"),
    "bert": (tiny_bert, ("channel",), "AutoModelForMaskedLM"),
    "vit": (tiny_vit, ("channel", "head", "layer"), "AutoModelForImageClassification"),
    "gemma3": (tiny_gemma3, ("channel", "head", "layer"), "AutoModelForCausalLM"),
    "phi3": (tiny_phi3, ("channel", "head", "layer"), "AutoModelForCausalLM"),
    "olmo2": (tiny_olmo2, ("channel", "layer"), "AutoModelForCausalLM"),
    "gpt_neox": (tiny_gpt_neox, ("channel", "layer"), "AutoModelForCausalLM"),
}
PER_LAYER = {
    "llama-uneven": (tiny_llama, None, "AutoModelForCausalLM"),
    "gpt2-heads": (gpt2, ("head",), "AutoModelForCausalLM"),
    "bert-heads": (tiny_bert, ("head",), "AutoModelForMaskedLM"),
    "gpt_neox-heads": (tiny_gpt_neox, ("head",), "AutoModelForCausalLM"),
}

# Runs in a fresh interpreter: loads each folder with the auto class it names and saves the
# outputs on the saved inputs, or the error plain loading raised.
LOADER = textwrap.dedent(
    """
    import json, sys, torch, transformers
    transformers.logging.set_verbosity_error()
    use_tensorplay = sys.argv[2] == "load_shrunk"
    if use_tensorplay:
        from tensorplay.ao.pruning import load_shrunk
    for folder, auto in json.loads(sys.argv[1]).items():
        model_class = getattr(transformers, auto)
        try:
            if use_tensorplay:
                model = load_shrunk(model_class, folder)
            else:
                model = model_class.from_pretrained(folder)
        except Exception as error:
            print(folder, type(error).__name__, str(error).splitlines()[0])
            continue
        inputs = torch.load(f"{folder}/inputs.pt")
        with torch.no_grad():
            torch.save(model.eval()(**inputs).logits, f"{folder}/outputs.pt")
    if not use_tensorplay:
        assert not [name for name in sys.modules if name.startswith("tensorplay")]
    """
)


def _save_shrunk(
    folder: Path, build: Callable[[], nn.Module], kinds: tuple[str, ...] | None
) -> torch.Tensor:
    """Mask, shrink and save a model; return its outputs on the inputs saved beside it."""
    model = build()
    graph = DependencyGraph(model)
    mask_units(
        model, uneven_keeps(graph) if kinds is None else uniform_keeps(graph, kinds), "zeros"
    )
    shrink(model)
    model.save_pretrained(folder)
    inputs = inputs_for(model)
    torch.save(inputs, folder / "inputs.pt")
    with torch.no_grad():
        outputs: torch.Tensor = model.eval()(**inputs).logits
    return outputs


def _load_in_fresh_process(folders: dict[str, str], how: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", LOADER, json.dumps(folders), how],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
def test_uniform_widths_load_with_plain_transformers_to_the_same_outputs(tmp_path: Path) -> None:
    expected, folders = {}, {}
    for name, (build, kinds, auto) in UNIFORM.items():
        expected[name] = _save_shrunk(tmp_path / name, build, kinds)
        folders[str(tmp_path / name)] = auto
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert "tensorplay_layer_widths" not in config
    assert _load_in_fresh_process(folders, "plain") == ""
    for name in UNIFORM:
        loaded = torch.load(tmp_path / name / "outputs.pt")
        torch.testing.assert_close(loaded, expected[name], atol=2e-6, rtol=1e-5)


@pytest.mark.slow
def test_widths_per_layer_load_with_load_shrunk_and_refuse_plain_loading(tmp_path: Path) -> None:
    expected, folders = {}, {}
    for name, (build, kinds, auto) in PER_LAYER.items():
        expected[name] = _save_shrunk(tmp_path / name, build, kinds)
        folders[str(tmp_path / name)] = auto
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert "tensorplay_layer_widths" in config
    refused = _load_in_fresh_process(folders, "plain").splitlines()
    assert len(refused) == len(PER_LAYER)
    assert all("RuntimeError" in line and "ignore_mismatched_sizes" in line for line in refused)
    assert _load_in_fresh_process(folders, "load_shrunk") == ""
    for name in PER_LAYER:
        loaded = torch.load(tmp_path / name / "outputs.pt")
        torch.testing.assert_close(loaded, expected[name], atol=2e-6, rtol=1e-5)


def test_load_shrunk_takes_a_concrete_class_and_keeps_the_record(tmp_path: Path) -> None:
    expected = _save_shrunk(tmp_path, tiny_llama, None)
    model = load_shrunk(transformers.LlamaForCausalLM, tmp_path)
    assert type(model) is transformers.LlamaForCausalLM
    assert [len(layer.mlp.up_proj.weight) for layer in model.model.layers] == [24, 36]
    assert model.config.tensorplay_layer_widths[1]["intermediate_size"] == 36
    inputs = torch.load(tmp_path / "inputs.pt")
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**inputs).logits, expected, atol=2e-6, rtol=1e-5)


def test_load_shrunk_of_a_plain_folder_is_from_pretrained(tmp_path: Path) -> None:
    tiny_llama().save_pretrained(tmp_path)
    model = load_shrunk(transformers.AutoModelForCausalLM, tmp_path)
    assert [len(layer.mlp.up_proj.weight) for layer in model.model.layers] == [48, 48, 48]


def test_a_record_that_does_not_fit_the_model_is_refused(tmp_path: Path) -> None:
    _save_shrunk(tmp_path, tiny_llama, None)
    config = json.loads((tmp_path / "config.json").read_text())
    config["tensorplay_layer_widths"][0]["intermediate_size"] = 64  # more than the model has
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp' between 1 and 48 channel.*64"):
        load_shrunk(transformers.AutoModelForCausalLM, tmp_path)
