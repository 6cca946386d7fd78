"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_global_unstructured_example_prunes_exactly_eighty_percent() -> None:
    namespace: dict[str, object] = {}
    exec(_python_blocks()[0], namespace)
    model = namespace["model"]
    assert isinstance(model, torch.nn.Sequential)
    first, last = model[0], model[2]
    # The first layer was made permanent, the last still carries its mask.
    assert sorted(first.state_dict()) == ["bias", "weight"]
    pruned = int((first.weight == 0).sum()) + int((last.weight_mask == 0).sum())
    assert pruned == round(0.8 * (first.weight.numel() + last.weight_mask.numel()))


def test_plain_loop_example_reaches_the_final_sparsity() -> None:
    namespace: dict[str, object] = {}
    first, loop = _python_blocks()[:2]
    exec(first + loop, namespace)
    pruner = namespace["pruner"]
    total = pruner.total_count()  # type: ignore[attr-defined]
    assert pruner.pruned_count() == round(0.9 * total)  # type: ignore[attr-defined]


def test_lean_example_keeps_pruned_weights_zero_with_bool_masks_only() -> None:
    namespace: dict[str, Any] = {}
    torch.manual_seed(0)
    exec(_python_blocks()[4], namespace)
    model, pruner = namespace["model"], namespace["pruner"]
    assert pruner.pruned_count() == round(0.9 * pruner.total_count())
    assert sorted(model.state_dict()) == [
        "0.bias",
        "0.weight",
        "0.weight_mask",
        "2.bias",
        "2.weight",
        "2.weight_mask",
    ]
    for layer in (model[0], model[2]):
        assert layer.weight_mask.dtype == torch.bool
        assert not layer._forward_pre_hooks
        # Trained through 20 AdamW steps after the last pruning step: still exactly zero.
        assert torch.equal(
            layer.weight[~layer.weight_mask], torch.zeros(int((~layer.weight_mask).sum()))
        )
        assert bool((layer.weight[layer.weight_mask] != 0).all())


@pytest.mark.slow
def test_hugging_face_example_saves_a_folder_that_loads_to_the_same_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    transformers = pytest.importorskip("transformers")
    from tensorplay.ao.pruning import load_sparse
    from tensorplay.report import main as report

    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    torch.manual_seed(0)
    exec(_python_blocks()[3], namespace)
    model, pruner = namespace["model"], namespace["pruner"]
    model.eval()
    # Every Conv1D projection and the tied head/embedding, counted once, exactly 80%.
    conv1d = {n for n, m in model.named_modules() if type(m).__name__ == "Conv1D"}
    assert {t.rpartition(".")[0] for t in pruner.targets} == conv1d | {"transformer.wte"}
    assert pruner.pruned_count() == round(0.8 * pruner.total_count())
    assert torch.equal(model.lm_head.weight, model.transformer.wte.weight)
    tokens = torch.randint(0, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        expected = model(tokens).logits
        reloaded = transformers.GPT2LMHeadModel.from_pretrained("gpt2-pruned").eval()
        assert torch.equal(reloaded(tokens).logits, expected)
        fresh = transformers.GPT2LMHeadModel(model.config).eval()
        fresh.load_state_dict(load_sparse("gpt2-pruned.safetensors"), strict=True)
        assert torch.equal(fresh(tokens).logits, expected)
    assert report(["gpt2-pruned"]) == 0
    assert "global sparsity" in capsys.readouterr().out


def test_structured_example_asks_for_channels_shrunk_at_the_end() -> None:
    pytest.importorskip("transformers")
    namespace: dict[str, Any] = {}
    exec(_python_blocks()[5], namespace)
    pruning = namespace["pruning"]
    assert (pruning.config.structure, pruning.config.scope) == ("channel", "layerwise")
    assert pruning.shrink_at_end and pruning.shrink_report is None  # shrunk when training ends
