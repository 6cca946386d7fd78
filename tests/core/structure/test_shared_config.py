"""Two models built from one Hugging Face config object: pruning, recording and shrinking one
never change the other's config, and both save folders that load back to what they compute."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import OneShotSchedule, Pruner, load_shrunk, prune_one_shot, shrink
from tensorplay.ao.pruning.structured.dependency.own_configs import own_configs
from tensorplay.ao.pruning.structured.dependency.recorded import RECORD_ATTRIBUTE
from tests.model_state import unchanged

transformers = pytest.importorskip("transformers")


def _pair() -> tuple[nn.Module, nn.Module, object]:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    teacher = transformers.LlamaForCausalLM(config).eval()
    student = transformers.LlamaForCausalLM(config).eval()
    return teacher, student, config


def _logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.arange(12).reshape(2, 6)).logits


@pytest.mark.parametrize("structure", ["channel", "head", "layer", "hidden"])
def test_shrinking_one_model_leaves_the_other_and_its_saved_folder(
    structure: str, tmp_path: Path
) -> None:
    teacher, student, config = _pair()
    before = config.to_dict()  # type: ignore[attr-defined]
    expected = _logits(teacher)
    Pruner(student, OneShotSchedule(0.5), structure=structure).step()  # type: ignore[arg-type]
    assert not hasattr(teacher.config, RECORD_ATTRIBUTE)
    masked = _logits(student)
    shrink(student)
    assert teacher.config is config and config.to_dict() == before  # type: ignore[attr-defined]
    holders = {id(m.config) for m in student.modules() if "config" in vars(m)}
    assert holders == {id(student.config)}  # the student's modules share its own copy
    teacher.save_pretrained(tmp_path / "teacher")
    student.save_pretrained(tmp_path / "student")
    loaded_teacher = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "teacher")
    torch.testing.assert_close(_logits(loaded_teacher.eval()), expected, atol=0, rtol=0)
    loaded_student = load_shrunk(transformers.LlamaForCausalLM, tmp_path / "student")
    torch.testing.assert_close(_logits(loaded_student.eval()), masked, atol=1e-5, rtol=1e-5)


def test_a_refused_call_gives_the_config_back() -> None:
    _, student, config = _pair()
    with torch.no_grad():  # a token whose embedding is NaN: refused by the calibration pass
        student.model.embed_tokens.weight[5] = float("nan")
    check = unchanged(student)
    with pytest.raises(ValueError, match="non-finite"):  # refused once the pruner recorded
        prune_one_shot(student, [torch.arange(12).reshape(2, 6)], sparsity=0.5,
                       structure="channel", importance="activation")  # fmt: skip
    check()
    assert student.config is config


def test_nested_configs_stay_nested_in_the_copies() -> None:
    outer, inner = transformers.PretrainedConfig(), transformers.PretrainedConfig()
    outer.text_config = inner
    model = nn.Module()
    model.config = outer
    model.language_model = nn.Module()
    model.language_model.config = inner
    own_configs(model)
    assert model.config is not outer and model.language_model.config is not inner
    assert model.config.text_config is model.language_model.config
    copied = model.config
    own_configs(model)  # a copy is its own already
    assert model.config is copied
