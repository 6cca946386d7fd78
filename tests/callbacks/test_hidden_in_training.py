"""The hidden size pruned gradually in training: inside the Hugging Face ``Trainer`` (which must
not write checkpoints while hidden channels are masked: refused before anything changes) and
under Lightning (whose checkpoints keep the masks and resume)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tests.callbacks.hf_trainer_helpers import make_trainer, transformers
from tests.family_models import FAMILY_MODELS
from tests.model_state import unchanged

TOKENS = torch.arange(12).reshape(2, 6) % 50 + 1


def _llama() -> nn.Module:
    torch.manual_seed(0)
    return FAMILY_MODELS["llama"].build().train()


def test_the_trainer_refuses_checkpoints_of_masked_hidden_channels_before_any_change(
    tmp_path: Path,
) -> None:
    from tensorplay.callbacks.transformers.gradual_pruning_callback import (
        GradualPruningCallback,
    )

    model = _llama()
    check = unchanged(model)
    pruning = GradualPruningCallback(
        LinearSchedule(0.5, end_step=4, frequency=2), structure="hidden", verbose=False
    )
    with pytest.raises(ValueError, match=r"save_strategy='no'.*structure='hidden'.*'steps'"):
        make_trainer(model, tmp_path / "run", [pruning], save_strategy="steps", save_steps=2)
    check()


def test_the_trainer_prunes_the_hidden_size_and_saves_the_shrunk_model(tmp_path: Path) -> None:
    from tensorplay.callbacks.transformers.gradual_pruning_callback import (
        GradualPruningCallback,
    )

    model = _llama()
    width = model.config.hidden_size
    pruning = GradualPruningCallback(
        LinearSchedule(0.5, end_step=4, frequency=2), structure="hidden", importance="magnitude",
        shrink_at_end=True, verbose=False,
    )  # fmt: skip
    masked: list[torch.Tensor] = []

    class Before(transformers.TrainerCallback):  # type: ignore[misc]
        def on_train_end(self, args, state, control, model=None, **_):  # type: ignore[no-untyped-def]
            with torch.no_grad():
                masked.append(model.eval()(TOKENS).logits.clone())

    trainer = make_trainer(model, tmp_path / "run", [Before(), pruning], max_steps=6)
    trainer.train()
    assert model.config.hidden_size == width // 2
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(TOKENS).logits, masked[0], atol=1e-5, rtol=1e-4)
    trainer.save_model(str(tmp_path / "saved"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    assert loaded.config.hidden_size == width // 2
    with torch.no_grad():
        torch.testing.assert_close(loaded(TOKENS).logits, masked[0], atol=1e-5, rtol=1e-4)


def test_lightning_checkpoints_masked_hidden_channels_and_resumes_to_the_same_width(
    tmp_path: Path,
) -> None:
    pytest.importorskip("lightning.pytorch")
    from tensorplay.callbacks import GradualPruning
    from tests.callbacks.lit_helpers import LlamaLM, fit_with_checkpoints

    def fit(resume: str | None) -> LlamaLM:
        module = LlamaLM()
        pruning = GradualPruning(
            LinearSchedule(0.5, end_step=4, frequency=2), structure="hidden",
            importance="magnitude", shrink_at_end=True, verbose=False,
        )  # fmt: skip
        fit_with_checkpoints(module, pruning, tmp_path, 6, resume)
        return module

    first = fit(None)
    assert first.net.config.hidden_size == 16
    checkpoint = tmp_path / "epoch=0-step=3.ckpt"
    state = torch.load(checkpoint, weights_only=False)["state_dict"]
    # The checkpoint holds the masks of step 3: a quarter of the stream's channels pruned.
    assert int((state["net.model.norm.weight_mask"] == 0).sum()) == 8
    resumed = fit(str(checkpoint))
    assert resumed.net.config.hidden_size == 16
