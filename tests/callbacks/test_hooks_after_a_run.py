"""Hooks never outlive a run: after a fit or train left by a refused teacher or an exception,
the model's forward hooks and pre-hooks (every submodule) and the optimizer's step hooks are
those they had before (the pruning masks stay, with their reparametrization's pre-hooks or lean
masks' gradient hooks: they are the model's), and a plain training forward works; a second
distillation on one student is refused before anything is attached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from tensorplay.ao.pruning import BasePruningMethod, Distillation
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.lit_helpers import LIGHTNING_SETS, TinyModule
from tests.model_state import unchanged


def hooks(model: nn.Module) -> dict[str, tuple[list[Any], list[Any]]]:
    """Every submodule's forward hooks and pre-hooks, by name, the pruning methods left out
    (the reparametrization holds the masks: it is the model's state, saved with it)."""
    kept = lambda found: [h for h in found.values() if not isinstance(h, BasePruningMethod)]  # noqa: E731
    return {
        name: (kept(module._forward_hooks), kept(module._forward_pre_hooks))
        for name, module in model.named_modules()
    }


def optimizer_hooks(optimizer: Any) -> int:
    """The step hooks on ``optimizer`` (a framework's wrapper unwrapped): lean masks attach
    there for the run."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return len(optimizer._optimizer_step_pre_hooks) + len(optimizer._optimizer_step_post_hooks)


class FailingTiny(TinyModule):
    """Raises inside ``training_step`` at ``global_step`` 2, after its forward."""

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.trainer.global_step == 2:
            raise RuntimeError("boom at step 2")
        return loss


def plain_step(model: nn.Module) -> None:
    """One training forward and backward, as a plain loop runs it."""
    model.train()
    x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
    F.cross_entropy(model(x), y).backward()


def test_a_teacher_refused_at_the_first_forward_leaves_no_hook(make_trainer) -> None:
    model = TinyModule()
    before = hooks(model)
    other_vocabulary = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))
    pruning = GradualPruning(
        OneShotSchedule(0.5), distill_weight=1.0, teacher=other_vocabulary, verbose=False
    )
    with pytest.raises(ValueError, match=r"teacher's logits to have the student's shape"):
        make_trainer(max_steps=2, callbacks=[pruning]).fit(model)
    assert hooks(model) == before
    plain_step(model)
    make_trainer(max_steps=2).fit(model)  # a plain Trainer, without tensorplay


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_an_exception_in_training_step_leaves_no_hook(make_trainer, masking: str) -> None:
    model = FailingTiny()
    before = hooks(model)
    pruning = GradualPruning(
        OneShotSchedule(0.5),
        distill_weight=1.0,
        masking=masking,  # type: ignore[arg-type]
        verbose=False,
    )
    trainer = make_trainer(max_steps=4, callbacks=[pruning])
    with pytest.raises(RuntimeError, match="boom at step 2"):
        trainer.fit(model)
    assert pruning.pruner.last_step == 2  # the teacher was attached, and so were the optimizers
    assert hooks(model) == before
    assert optimizer_hooks(trainer.optimizers[0]) == 0
    plain_step(model)


def test_a_keyboard_interrupt_leaves_no_hook(make_trainer) -> None:
    class Interrupted(TinyModule):
        def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
            self(batch[0])
            raise KeyboardInterrupt

    model = Interrupted()
    before = hooks(model)
    pruning = GradualPruning(OneShotSchedule(0.5), distill_weight=1.0, verbose=False)
    with pytest.raises(SystemExit):  # Lightning's graceful shutdown
        make_trainer(max_steps=2, callbacks=[pruning]).fit(model)
    assert hooks(model) == before


def test_a_users_distillation_with_distill_weight_is_refused_before_anything(
    make_trainer,
) -> None:
    model = TinyModule()
    theirs = Distillation().attach(model)
    check = unchanged(model, ignoring=LIGHTNING_SETS)  # their two hooks on it
    pruning = GradualPruning(OneShotSchedule(0.5), distill_weight=1.0, verbose=False)
    with pytest.raises(RuntimeError, match=r"no Distillation attached to TinyModule .* Set "
                       r"distill_weight=0"):  # fmt: skip
        make_trainer(max_steps=2, callbacks=[pruning]).fit(model)
    assert not pruning.built
    check()
    theirs.detach()


def test_two_distillations_on_one_student_are_refused() -> None:
    student = nn.Linear(2, 3)
    first = Distillation().attach(student)
    check = unchanged(student)
    with pytest.raises(RuntimeError, match=r"one Distillation per student, but the Linear"):
        Distillation().attach(student)
    check()
    first.detach()


def test_the_trainer_callback_leaves_no_hook_after_a_refused_teacher(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
    from tests.callbacks.hf_trainer_helpers import make_trainer
    from tests.hf_models import VOCAB, tiny_gpt2

    model = tiny_gpt2().train()
    teacher = tiny_gpt2(seed=1)
    teacher.resize_token_embeddings(VOCAB + 3)  # another vocabulary
    before = hooks(model)
    pruning = GradualPruningCallback(
        OneShotSchedule(0.5), distill_weight=1.0, teacher=teacher, verbose=False
    )
    with pytest.raises(ValueError, match=r"teacher's logits to have the student's shape"):
        make_trainer(model, tmp_path, [pruning], max_steps=2).train()
    assert hooks(model) == before
    make_trainer(model, tmp_path / "plain", [], max_steps=2).train()  # without tensorplay


def test_the_trainer_callback_leaves_no_hook_after_a_forward_fails(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
    from tests.callbacks.hf_trainer_helpers import make_trainer
    from tests.hf_models import tiny_gpt2

    model = tiny_gpt2().train()
    calls = []

    def fail_at_step_2(module: nn.Module, args: Any) -> None:
        calls.append(module.training)  # the teacher's calls (eval) do not count
        if calls.count(True) == 3:
            raise RuntimeError("boom at step 2")

    failing = model.lm_head.register_forward_pre_hook(fail_at_step_2)
    before = hooks(model)
    pruning = GradualPruningCallback(
        OneShotSchedule(0.5), distill_weight=1.0, masking="inplace", verbose=False
    )
    trainer = make_trainer(model, tmp_path, [pruning], max_steps=4)
    with pytest.raises(RuntimeError, match="boom at step 2"):
        trainer.train()
    assert pruning.pruner.last_step == 2
    teacher = pruning._session.distilling.distillation.teacher  # type: ignore[union-attr]
    assert hooks(teacher) == before  # the model's own hooks only: none of the run's
    # The optimizer's hooks are off at once; the model's forward hooks cannot be taken off
    # while torch runs them, and the next forward takes them off before it runs.
    assert optimizer_hooks(trainer.optimizer) == 0
    failing.remove()
    with torch.no_grad():
        model.eval()(torch.zeros(1, 4, dtype=torch.long))
    assert hooks(model) == {name: ([], []) for name in before}
    make_trainer(model, tmp_path / "plain", [], max_steps=2).train()  # without tensorplay
    assert hooks(model) == {name: ([], []) for name in before}
