"""``GradualPruningCallback`` in a Hugging Face ``Trainer``: exact counts on the optimizer steps,
the default selection, the metrics in ``log_history``, and arguments checked before training."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tensorplay.ao.pruning import Pruner
from tensorplay.ao.pruning.pruner.schedules import CallableSchedule, LinearSchedule, OneShotSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import (
    StepRecorder,
    make_trainer,
    masked_zeros,
    masks,
)
from tests.hf_models import tiny_bert, tiny_gpt2
from tests.model_state import unchanged

SCHEDULE = LinearSchedule(0.5, end_step=4, frequency=1)  # prunes at steps 1..4, then holds
METRICS = ("pruning/sparsity", "pruning/target_sparsity", "pruning/pruned")


def _conv1d_weights(model: torch.nn.Module) -> list[str]:
    return [f"{n}.weight" for n, m in model.named_modules() if type(m).__name__ == "Conv1D"]


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_every_optimizer_step_prunes_exactly_the_schedule_count(
    masking: str, tmp_path: Path
) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(SCHEDULE, masking=masking, verbose=False)  # type: ignore[arg-type]
    recorder = StepRecorder(pruning)
    trainer = make_trainer(model, tmp_path, [pruning, recorder])
    # Built with the Trainer: every target has its (all-kept) mask before training.
    assert pruning.pruner.model is model
    assert masked_zeros(model) == 0 and len(masks(model)) == 10  # 8 Conv1D + wte = lm_head

    trainer.train()

    # Every Conv1D projection, and the embedding with the head tied to it (one target).
    assert pruning.pruner.targets == [*_conv1d_weights(model), "transformer.wte.weight"]
    assert pruning.pruner.aliases["transformer.wte.weight"] == (
        "transformer.wte.weight",
        "lm_head.weight",
    )
    total = pruning.pruner.total_count()
    conv1d = [model.get_submodule(name.removesuffix(".weight")) for name in _conv1d_weights(model)]
    assert total == sum(module.weight.numel() for module in conv1d) + 97 * 32  # wte once
    expected = {step: round(SCHEDULE(step) * total) for step in range(1, 7)}
    assert recorder.pruned == expected
    assert [step for step, _, _ in pruning.pruner.history] == [1, 2, 3, 4]
    assert pruning.pruner.last_step == 6


def test_bert_linear_layers_are_selected_and_the_tied_decoder_counted_once(
    tmp_path: Path,
) -> None:
    model = tiny_bert().train()
    pruning = GradualPruningCallback(OneShotSchedule(0.5, step=2), verbose=False)
    trainer = make_trainer(model, tmp_path, [pruning], max_steps=3)
    linear = [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    names = {name for target in pruning.pruner.targets for name in pruning.pruner.aliases[target]}
    # Every Linear, the decoder under the name of the word embedding it is tied to.
    assert names == {*linear, "bert.embeddings.word_embeddings.weight"}
    trainer.train()
    assert pruning.pruner.pruned_count() == round(0.5 * pruning.pruner.total_count())
    assert masked_zeros(model) == pruning.pruner.pruned_count()


def test_gradient_accumulation_counts_optimizer_steps(tmp_path: Path) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(SCHEDULE, verbose=False)
    recorder = StepRecorder(pruning)
    trainer = make_trainer(
        model, tmp_path, [pruning, recorder], max_steps=4, gradient_accumulation_steps=3
    )
    trainer.train()
    total = pruning.pruner.total_count()
    # 4 optimizer steps of 3 batches each: the schedule saw steps 1..4, not 12 batches.
    assert recorder.pruned == {step: round(SCHEDULE(step) * total) for step in range(1, 5)}
    assert trainer.state.global_step == 4


def test_metrics_join_every_training_log_entry(tmp_path: Path) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(SCHEDULE, log_per_tensor=True, verbose=False)
    trainer = make_trainer(model, tmp_path, [pruning], logging_steps=2)
    trainer.train()
    total = pruning.pruner.total_count()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [2, 4, 6]
    for entry in logged:
        step = entry["step"]
        assert entry["pruning/pruned"] == round(SCHEDULE(step) * total)
        assert entry["pruning/sparsity"] == round(SCHEDULE(step) * total) / total
        assert entry["pruning/target_sparsity"] == SCHEDULE(step)
        per_tensor = {k: v for k, v in entry.items() if k.startswith("pruning/sparsity/")}
        assert sorted(per_tensor) == sorted(f"pruning/sparsity/{t}" for t in pruning.pruner.targets)
    # The end-of-training summary is the Trainer's own, without the pruning metrics.
    summary = trainer.state.log_history[-1]
    assert "train_loss" in summary and not set(METRICS) & set(summary)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        pytest.param({"min_density": 1.5}, ValueError, id="min-density"),
        pytest.param({"scope": "row-wise"}, ValueError, id="scope"),
        pytest.param({"method": "no_such_method"}, ValueError, id="method"),
        pytest.param({"rewind": "later"}, ValueError, id="rewind"),
        pytest.param({"masking": "bitmask"}, ValueError, id="masking"),
        pytest.param({"seed": -1}, ValueError, id="seed"),
        pytest.param({"parameters": []}, ValueError, id="parameters"),
        pytest.param({"keep_dense": ["middle"]}, ValueError, id="keep-dense"),
        pytest.param({"include": ["("]}, ValueError, id="include-regex"),
        pytest.param({"rewind_step": 1.5}, TypeError, id="rewind-step"),
    ],
)
def test_bad_arguments_fail_when_the_callback_is_made_with_the_pruners_message(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error) as expected:
        Pruner(torch.nn.Linear(2, 2), SCHEDULE, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(error) as raised:
        GradualPruningCallback(SCHEDULE, **kwargs)  # type: ignore[arg-type]
    assert str(raised.value) == str(expected.value)


def test_an_unknown_parameter_fails_when_the_trainer_is_made_and_changes_nothing(
    tmp_path: Path,
) -> None:
    model = tiny_gpt2().train()
    check = unchanged(model)
    pruning = GradualPruningCallback(SCHEDULE, parameters=["transformer.h.9.mlp.c_fc.weight"])
    with pytest.raises(ValueError) as expected:
        Pruner(model, SCHEDULE, parameters=["transformer.h.9.mlp.c_fc.weight"])
    check()
    with pytest.raises(ValueError) as raised:
        make_trainer(model, tmp_path, [pruning])
    assert str(raised.value) == str(expected.value)
    check()


def test_restoring_callback_states_needs_a_schedule_with_an_import_path(tmp_path: Path) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(CallableSchedule(lambda step: 0.5))
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"arguments that are plain data .* CallableSchedule"):
        make_trainer(model, tmp_path, [pruning], restore_callback_states_from_checkpoint=True)
    check()


def test_the_trainer_rebuilds_the_callback_from_its_saved_arguments() -> None:
    pruning = GradualPruningCallback(
        LinearSchedule(0.5, end_step=4), module_types=[torch.nn.Linear], keep_dense=["last"],
        scope="layerwise", seed=3, verbose=False,
    )  # fmt: skip
    saved = pruning.state()
    rebuilt = GradualPruningCallback(**saved["args"])  # as the Trainer does, from the JSON
    assert rebuilt.config.schedule == pruning.config.schedule
    assert rebuilt.config.module_types == ["torch.nn.modules.linear.Linear"]
    assert rebuilt.state_key == pruning.state_key  # it finds the state saved under it
    assert (rebuilt.config.scope, rebuilt.config.seed, rebuilt.verbose) == ("layerwise", 3, False)


VERBOSE = """
import sys, tempfile
from pathlib import Path
from tensorplay.ao.pruning import OneShotSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import make_trainer
from tests.hf_models import tiny_gpt2

pruning = GradualPruningCallback(OneShotSchedule(0.5, step=1))
with tempfile.TemporaryDirectory() as out:
    trainer = make_trainer(tiny_gpt2().train(), Path(out), [pruning], max_steps=2,
                           log_level=sys.argv[1])
    trainer.train()
print(pruning.pruner.total_count())
"""


@pytest.mark.slow
@pytest.mark.parametrize("level", ["info", "warning"])
def test_verbose_messages_follow_the_trainers_log_level(level: str) -> None:
    # A fresh process: the library's log handler binds the stderr it finds first.
    done = subprocess.run(
        [sys.executable, "-c", VERBOSE, level],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    total = int(done.stdout.split()[-1])
    event = f"GradualPruningCallback: step 1: pruned {round(0.5 * total)} more units"
    shown = [event in done.stderr, "GradualPruningCallback: final sparsity" in done.stderr]
    assert shown == ([True, True] if level == "info" else [False, False])


def test_the_arguments_are_the_lightning_callbacks_one_for_one() -> None:
    """A field added to one adapter (and to PrunerConfig) must reach the other too."""
    import inspect

    from tensorplay.callbacks import GradualPruning

    def parameters(cls: type) -> list[tuple[str, object]]:
        signature = inspect.signature(cls.__init__)
        return [(p.name, p.default) for p in signature.parameters.values() if p.name != "self"]

    assert parameters(GradualPruningCallback) == parameters(GradualPruning)
    kwargs = {"keep_dense": ["last"], "scope": "layerwise", "min_density": 0.1, "seed": 3}
    lightning = GradualPruning(SCHEDULE, **kwargs)  # type: ignore[arg-type]
    assert GradualPruningCallback(SCHEDULE, **kwargs).config == lightning.config  # type: ignore[arg-type]
