"""docs/huggingface_trainer.rst: every Python block runs, and what the page claims holds.

The blocks are read from the .rst itself, so the page cannot drift from what is tested: a new
block fails `test_the_page_has_the_blocks_these_tests_know` until it is tested here.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from tensorplay.ao.pruning import CubicSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import (
    StepRecorder,
    Tokens,
    make_trainer,
    training_args,
    transformers,
)
from tests.callbacks.test_migration_guide import code_blocks
from tests.hf_models import tiny_gpt2

PAGE = Path(__file__).resolve().parents[2] / "docs" / "huggingface_trainer.rst"


def _run(index: int, namespace: dict[str, Any]) -> dict[str, Any]:
    language, code = code_blocks(PAGE)[index]
    assert language == "python"
    exec(compile(code, f"{PAGE.name}[{index}]", "exec"), namespace)
    return namespace


def _setting(tmp_path: Path, **kwargs: Any) -> dict[str, Any]:
    """What the page's set-up block defines, with the tests' tiny GPT-2 and few steps."""
    model = tiny_gpt2().train()
    return {
        "torch": torch,
        "GPT2LMHeadModel": transformers.GPT2LMHeadModel,
        "config": model.config,
        "model": model,
        "args": training_args(tmp_path / "out", **kwargs),
        "train_dataset": Tokens(),
        "Trainer": transformers.Trainer,
        "GradualPruningCallback": GradualPruningCallback,
        "CubicSchedule": CubicSchedule,
    }


def test_the_page_has_the_blocks_these_tests_know() -> None:
    languages = [language for language, _ in code_blocks(PAGE)]
    assert languages == [
        *("bash", "python"),  # the install; a model, its arguments and data
        *("python", "text"),  # the first example and the report it prints
        *("python",) * 5,
    ]


def test_the_first_example_trains_with_the_callback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = _run(2, _setting(tmp_path))
    pruning = namespace["pruning"]
    assert pruning.pruner.last_step == namespace["args"].max_steps
    assert "transformer.wte.weight" in pruning.pruner.targets  # with the tied head, once
    assert "(target" in capsys.readouterr().out


def test_put_first_puts_the_callback_before_the_integrations(tmp_path: Path) -> None:
    namespace = _setting(tmp_path, report_to="tensorboard")
    trainer = _run(4, namespace)["trainer"]
    names = [type(callback).__name__ for callback in trainer.callback_handler.callbacks]
    assert names[:3] == ["DefaultFlowCallback", "GradualPruningCallback", "TensorBoardCallback"]


def test_the_best_model_example_evaluates_once_the_schedule_is_done() -> None:
    args = _run(5, {"TrainingArguments": transformers.TrainingArguments})["best_args"]
    assert (args.load_best_model_at_end, args.eval_delay) == (True, 1000)
    assert args.eval_steps == args.save_steps  # the Trainer needs them aligned for the best


def test_the_saving_example_gives_a_folder_with_the_same_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace = _run(6, _setting(tmp_path))
    model, reloaded = namespace["model"].eval(), namespace["reloaded"].eval()
    tokens = torch.randint(0, 97, (2, 8))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, model(tokens).logits)
    assert reloaded.lm_head.weight is reloaded.transformer.wte.weight
    assert sorted(reloaded.state_dict()) == sorted(model.state_dict())
    assert namespace["pruning"].pruner.pruned_count() > 0  # still under pruning, masks and all
    assert any(name.endswith("_mask") for name in model.state_dict(keep_vars=True))


def test_the_replacement_prunes_the_units_the_hand_written_callback_prunes(
    tmp_path: Path,
) -> None:
    before = _run(7, {})["KeepMasks"](0.5)
    after = _run(8, {})["keep_masks"]
    after.verbose = False
    model = tiny_gpt2().train()
    twin = copy.deepcopy(model)
    make_trainer(model, tmp_path / "a", [before], max_steps=2).train()
    recorder = StepRecorder(after)
    make_trainer(twin, tmp_path / "b", [after, recorder], max_steps=2).train()

    # The same tensors (the head, a Linear, carries the embedding tied to it) and units.
    assert sorted(f"{name}.weight_mask" for name in before.masks) == sorted(
        name for name in recorder.begin if not name.startswith("transformer.wte")
    )
    for name, mask in before.masks.items():
        assert torch.equal(recorder.begin[f"{name}.weight_mask"], mask), name
    # What the replacement adds: the weights stay exactly zero where pruned.
    for name in before.masks:
        layer = twin.get_submodule(name)
        assert torch.equal(
            layer.weight[~layer.weight_mask], torch.zeros(int((~layer.weight_mask).sum()))
        )
