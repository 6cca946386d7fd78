"""``GradualPruningCallback`` with a gradient importance: the scores accumulate once per
optimizer step from the gradients the optimizer steps with, in both masking modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import make_trainer, masks, transformers
from tests.hf_models import tiny_gpt2


def _weight(model: nn.Module, name: str) -> nn.Parameter:
    """The parameter the optimizer steps for target ``name`` (``_orig`` if reparametrized)."""
    path, _, leaf = name.rpartition(".")
    module = model.get_submodule(path)
    orig = f"{leaf}_orig"
    return getattr(module, orig) if hasattr(module, orig) else getattr(module, leaf)


class MovementRecorder(transformers.TrainerCallback):  # type: ignore[misc]
    """The oracle: ``-sum_t w_t * g_t`` of every target, from the gradients the optimizer steps
    with (recorded after the pruning callback's ``on_pre_optimizer_step``)."""

    def __init__(self, pruning: GradualPruningCallback) -> None:
        self.pruning = pruning
        self.totals: dict[str, Tensor] = {}
        self.steps = 0

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = self.pruning.pruner.model
        for name in self.pruning.pruner.importance.totals():
            param = _weight(model, name)
            term = -(param.detach() * param.grad).float()
            self.totals[name] = self.totals.get(name, torch.zeros_like(term)) + term
        self.steps += 1


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_movement_accumulates_once_per_optimizer_step_from_the_gradients_used(
    tmp_path: Path, masking: str
) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(
        OneShotSchedule(0.5, step=4),
        importance="movement",
        scope="layerwise",
        masking=masking,  # type: ignore[arg-type]
        verbose=False,
    )
    recorder = MovementRecorder(pruning)
    trainer = make_trainer(
        model, tmp_path, [pruning, recorder], max_steps=4, gradient_accumulation_steps=2
    )
    trainer.train()
    totals = pruning.pruner.importance.totals()
    assert recorder.steps == 4 and set(totals) == set(recorder.totals) and len(totals) >= 9
    assert set(pruning.pruner.importance.steps().values()) == {4}  # not 8 batches
    for name, total in totals.items():
        assert torch.allclose(total, recorder.totals[name], atol=1e-6), name
    # Layer-wise at 50%: each target's mask drops exactly the lower half of its movement scores.
    after = masks(model)
    for name, total in recorder.totals.items():
        mask = after[f"{name}_mask"].reshape(-1)
        lowest = total.reshape(-1).argsort()[: total.numel() // 2]
        assert int((mask == 0).sum()) == total.numel() // 2, name
        assert bool((mask[lowest] == 0).all()), name


def test_an_unknown_importance_fails_when_the_callback_is_made() -> None:
    with pytest.raises(ValueError, match="l3"):
        GradualPruningCallback(OneShotSchedule(0.5), importance="l3")


class TotalsAtBegin(transformers.TrainerCallback):  # type: ignore[misc]
    """The pruning callback's accumulated totals when training begins (after it restored them)."""

    def __init__(self, pruning: GradualPruningCallback) -> None:
        self.pruning = pruning
        self.totals: dict[str, Tensor] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        totals = self.pruning.pruner.importance.totals()
        self.totals = {name: total.clone() for name, total in totals.items()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_resume_mid_accumulation_restores_the_totals_bit_for_bit(
    tmp_path: Path, dtype: str
) -> None:
    def callback() -> GradualPruningCallback:
        return GradualPruningCallback(
            OneShotSchedule(0.5, step=6),
            importance="movement",
            accumulator_dtype=dtype,  # type: ignore[arg-type]
            verbose=False,
        )

    first = callback()
    make_trainer(
        tiny_gpt2(seed=0).train(), tmp_path, [first], max_steps=3,
        save_strategy="steps", save_steps=3,
    ).train()  # fmt: skip
    saved = {name: total.clone() for name, total in first.pruner.importance.totals().items()}
    assert saved and {total.dtype for total in saved.values()} == {getattr(torch, dtype)}

    second = callback()
    begin = TotalsAtBegin(second)
    trainer = make_trainer(tiny_gpt2(seed=1).train(), tmp_path, [second, begin], max_steps=6)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert sorted(begin.totals) == sorted(saved)
    for name, total in saved.items():
        assert torch.equal(begin.totals[name], total), name
    # 3 steps before the checkpoint and 3 after it, then the one-shot step at 6.
    assert set(second.pruner.importance.steps().values()) == {6}
    assert [(step, pruned) for step, _, pruned in second.pruner.history] == [
        (6, round(0.5 * second.pruner.total_count()))
    ]
