"""docs/distillation.rst: what the page says of its blocks holds, on models the tests choose.

The page runs as one script in ``tests/docs/test_pages_run.py``; here each training block runs
alone, on a model given to it, so that its claims can be checked against that model: the teacher
is the dense model, the hooks are gone afterwards, the term reaches the loss.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tensorplay.ao.pruning import Distillation, dense_copy
from tests.docs.code_blocks import code_blocks
from tests.hf_models import VOCAB, tiny_gpt2

PAGE = Path(__file__).resolve().parents[2] / "docs" / "distillation.rst"


def test_the_page_has_the_blocks_these_tests_know() -> None:
    languages = [language for language, _ in code_blocks(PAGE)]
    assert languages == [
        *("python", "python"),  # a model and batches; the loop
        *("python", "python"),  # a LightningModule; the Lightning callback
        *("python", "python"),  # a Trainer's arguments and data; the Hugging Face callback
        *("bash", "bash", "bash"),
    ]


def test_the_loop_distils_a_pruned_model_from_its_dense_self() -> None:
    model = tiny_gpt2()
    dense = dense_copy(model)
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, VOCAB, (2, 8), generator=generator) for _ in range(3)]
    namespace: dict[str, Any] = {
        "torch": torch,
        "model": model,
        "batches": [{"input_ids": i, "labels": i} for i in ids],
    }
    exec(compile(code_blocks(PAGE)[1][1], f"{PAGE.name}[1]", "exec"), namespace)
    distill: Distillation = namespace["distill"]
    assert not distill.attached and not model._forward_hooks
    assert namespace["pruner"].sparsity() == 0.9
    teacher = distill.teacher
    assert teacher is not None
    for name, value in dense.state_dict().items():  # the dense model, untouched by training
        assert torch.equal(teacher.state_dict()[name], value), name
    assert distill.last_loss is not None and float(distill.last_loss) > 0


def test_the_lightning_block_distils_from_the_model_before_pruning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("lightning")
    from tests.callbacks.lit_helpers import TinyModule

    monkeypatch.chdir(tmp_path)  # the Trainer's logs
    model = TinyModule()
    dense = {k: v.clone() for k, v in model.state_dict().items()}
    namespace: dict[str, Any] = {"model": model}
    exec(compile(code_blocks(PAGE)[3][1], f"{PAGE.name}[3]", "exec"), namespace)
    pruning, trainer = namespace["pruning"], namespace["trainer"]
    assert trainer.global_step == 150 and pruning.pruner.sparsity() == pytest.approx(0.9, abs=1e-2)
    teacher = pruning._session.distilling.distillation.teacher
    for name, value in dense.items():
        assert torch.equal(teacher.state_dict()[name], value), name
    assert float(trainer.callback_metrics["pruning/distill_loss"]) > 0
    assert not model._forward_hooks


def test_the_hugging_face_block_distils_from_the_model_before_pruning(tmp_path: Path) -> None:
    from tests.callbacks.hf_trainer_helpers import Tokens, training_args

    model = tiny_gpt2().train()
    dense = dense_copy(model).state_dict()
    namespace: dict[str, Any] = {
        "model": model,
        "args": training_args(tmp_path, max_steps=2),
        "train_dataset": Tokens(),
    }
    exec(compile(code_blocks(PAGE)[5][1], f"{PAGE.name}[5]", "exec"), namespace)
    pruning, trainer = namespace["pruning"], namespace["trainer"]
    assert pruning.pruner.last_step == 2 and pruning.pruner.sparsity() == pytest.approx(
        0.9, abs=1e-3
    )
    teacher = pruning._session.distilling.distillation.teacher
    for name, value in dense.items():
        assert torch.equal(teacher.state_dict()[name], value), name
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2 and all(entry["pruning/distill_loss"] > 0 for entry in logged)
    assert not model._forward_hooks
