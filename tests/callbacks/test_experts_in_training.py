"""Experts pruned gradually inside the Hugging Face Trainer: ``structure="expert"`` with REAP
accumulated over the training forwards, distillation from the dense model, and
``shrink_at_end``: the folder the Trainer saves loads with plain ``from_pretrained`` and computes
what the masked model did."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import make_trainer, transformers
from tests.moe_models import EXPERTS, tiny_qwen3_moe


class _MaskedLogits(transformers.TrainerCallback):  # type: ignore[misc]
    """The logits of fixed tokens at the end of training, before shrink_at_end runs (this
    callback comes first in the list)."""

    tokens = torch.arange(12).reshape(2, 6) % 50 + 1

    def on_train_end(self, args, state, control, model=None, **_):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            self.logits = model.eval()(self.tokens).logits.clone()


def test_the_trainer_prunes_experts_by_reap_distils_and_saves_a_folder_that_loads(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = tiny_qwen3_moe().train()
    pruning = GradualPruningCallback(
        LinearSchedule(0.5, end_step=4, frequency=2), structure="expert", importance="reap",
        scope="layerwise", distill_weight=1.0, shrink_at_end=True, verbose=False,
    )  # fmt: skip
    recorder = _MaskedLogits()
    trainer = make_trainer(model, tmp_path / "run", [recorder, pruning], max_steps=6)
    trainer.train()
    report = pruning.shrink_report
    assert report is not None and report.config == "uniform"
    assert model.config.num_experts == EXPERTS // 2
    with torch.no_grad():
        torch.testing.assert_close(
            model.eval()(recorder.tokens).logits, recorder.logits, atol=1e-5, rtol=1e-4
        )
    trainer.save_model(str(tmp_path / "saved"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    assert loaded.config.num_experts == EXPERTS // 2
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(recorder.tokens).logits, recorder.logits, atol=1e-5, rtol=1e-4
        )


def test_a_run_that_leaves_experts_masked_says_what_a_save_of_it_gives(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tiny_qwen3_moe().train()
    pruning = GradualPruningCallback(
        LinearSchedule(0.5, end_step=2, frequency=2), structure="expert", scope="layerwise",
        verbose=False,
    )  # fmt: skip
    recorder = _MaskedLogits()
    trainer = make_trainer(model, tmp_path / "run", [recorder, pruning], max_steps=3)
    with pytest.warns(UserWarning, match=r"experts masked but not removed \(routers .*mlp\.gate"):
        trainer.train()
    # What the warning says is so: loaded without tensorplay, the saved model routes tokens to
    # the masked experts and computes otherwise.
    trainer.save_model(str(tmp_path / "saved"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    with torch.no_grad():
        assert not torch.allclose(loaded(recorder.tokens).logits, recorder.logits, atol=1e-3)


def test_a_run_that_shrinks_its_experts_does_not_warn_of_masked_ones(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = tiny_qwen3_moe().train()
    pruning = GradualPruningCallback(
        LinearSchedule(0.5, end_step=2, frequency=2), structure="expert", scope="layerwise",
        shrink_at_end=True, verbose=False,
    )  # fmt: skip
    layers = model.config.num_hidden_layers
    trainer = make_trainer(model, tmp_path / "run", [pruning], max_steps=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert not [w for w in caught if "masked but not removed" in str(w.message)]
    # Experts were masked (half of each layer's, at step 2), and shrinking removed them all.
    assert pruning.pruner.history == [(2, 0.5, layers * EXPERTS // 2)]
    report = pruning.shrink_report
    assert report is not None
    assert [(group.before, group.after) for group in report.groups] == [
        (EXPERTS, EXPERTS // 2)
    ] * layers
    assert model.config.num_experts == EXPERTS // 2
