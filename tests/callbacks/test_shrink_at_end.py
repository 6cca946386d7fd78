"""``shrink_at_end=True`` in both callbacks: a tiny Llama trained a few steps with channels, heads
or layers pruned comes out smaller, computes what the masked model computed, and its saves load
right: ``save_pretrained`` with transformers alone in a fresh process, Lightning checkpoints into
a freshly built module."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DeepSpeedStrategy, ModelParallelStrategy

from tensorplay.ao.pruning import SpentPrunerError
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks import GradualPruning
from tensorplay.callbacks.core.lifecycle import PruningSession, split_arguments
from tensorplay.callbacks.lightning.strategies import check_shrinkable
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import Tokens, make_trainer, training_args, transformers
from tests.callbacks.shrink_helpers import (
    LitLlama,
    MaskedLogits,
    from_pretrained_logits,
    logits_of,
)
from tests.hf_models import tiny_llama
from tests.model_state import unchanged

SCHEDULE = LinearSchedule(0.5, end_step=4, frequency=2)  # prunes at steps 2 and 4
# tiny_llama: 3 blocks, an FFN of 48 channels and 2 key/value heads (of 2 query heads each) per
# block. Ranked per block, half of each block's channels and heads go; 2 of the 3 blocks.
WIDTHS = {
    "channel": {"intermediate_size": 24, "num_attention_heads": 4, "num_hidden_layers": 3},
    "head": {"intermediate_size": 48, "num_attention_heads": 2, "num_hidden_layers": 3},
    "layer": {"intermediate_size": 48, "num_attention_heads": 4, "num_hidden_layers": 1},
}
STRUCTURES = list(WIDTHS)


def _config_widths(model: Any) -> dict[str, int]:
    return {key: getattr(model.config, key) for key in WIDTHS["channel"]}


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class HFMaskedLogits(transformers.TrainerCallback):  # type: ignore[misc]
    """The Trainer: the logits of the masked model when training ends (put it before the
    pruning callback, which shrinks in the same event)."""

    def __init__(self) -> None:
        self.logits: torch.Tensor | None = None

    def on_train_end(
        self, args: Any, state: Any, control: Any, model: Any = None, **_: Any
    ) -> None:
        self.logits = logits_of(model)


@pytest.mark.slow
def test_the_trainer_gives_a_smaller_model_that_plain_transformers_loads(tmp_path: Path) -> None:
    folders, masked, sizes = [], [], []
    for structure in STRUCTURES:
        model = tiny_llama().train()
        before = _parameters(model)
        pruning = GradualPruningCallback(
            SCHEDULE, structure=structure, scope="layerwise", shrink_at_end=True, verbose=False
        )  # type: ignore[arg-type]
        recorder = HFMaskedLogits()
        trainer = make_trainer(model, tmp_path / structure, [recorder, pruning])
        trainer.train()
        report = pruning.shrink_report
        assert report is not None and report.config == "uniform"
        assert (report.parameters_before, report.parameters_after) == (before, _parameters(model))
        assert _config_widths(model) == WIDTHS[structure]
        assert recorder.logits is not None
        torch.testing.assert_close(logits_of(model), recorder.logits, atol=1e-5, rtol=1e-4)
        with pytest.raises(RuntimeError, match="Expected a new optimizer for the shrunk model"):
            trainer.optimizer.step()  # the old tensors: never stepped silently
        trainer.save_model(str(tmp_path / f"{structure}-saved"))
        folders.append(tmp_path / f"{structure}-saved")
        masked.append(recorder.logits)
        sizes.append(report.parameters_after / before)
    assert max(sizes) < 0.9  # every structure removed a tenth of the model or more
    for loaded, logits in zip(
        from_pretrained_logits(folders, tmp_path / "logits.pt"), masked, strict=True
    ):
        torch.testing.assert_close(loaded, logits, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_lightning_gives_a_smaller_model_and_checkpoints_that_load(
    masking: str, tmp_path: Path
) -> None:
    module = LitLlama()
    pruning = GradualPruning(
        SCHEDULE, structure="channel", scope="layerwise", masking=masking, shrink_at_end=True,
        verbose=False,
    )  # type: ignore[arg-type]  # fmt: skip
    recorder = MaskedLogits()
    saving = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = pl.Trainer(
        max_steps=6, callbacks=[saving, recorder, pruning], logger=False, accelerator="cpu",
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module)
    assert recorder.logits is not None
    assert module.model.config.intermediate_size == 24
    assert pruning.shrink_report is not None and pruning.shrink_report.removed > 0
    torch.testing.assert_close(logits_of(module), recorder.logits, atol=1e-5, rtol=1e-4)
    with pytest.raises(RuntimeError, match="Expected a new optimizer for the shrunk model"):
        trainer.optimizers[0].step()

    # ModelCheckpoint's last checkpoint was saved before shrinking: the masked model, which a
    # freshly built module loads (and which the shrunk module refuses, saying why).
    last = LitLlama.load_from_checkpoint(tmp_path / "last.ckpt")
    torch.testing.assert_close(logits_of(last), recorder.logits, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="saved before the model was shrunk"):
        trainer.test(module, ckpt_path=str(tmp_path / "last.ckpt"))

    # A checkpoint saved afterwards holds the shrunk model: a fresh module is shrunk to it.
    trainer.save_checkpoint(tmp_path / "shrunk.ckpt")
    shrunk = LitLlama.load_from_checkpoint(tmp_path / "shrunk.ckpt")
    assert shrunk.model.config.intermediate_size == 24
    assert _parameters(shrunk) == _parameters(module)
    torch.testing.assert_close(logits_of(shrunk), recorder.logits, atol=1e-5, rtol=1e-4)

    module.model.save_pretrained(tmp_path / "saved")
    (loaded,) = from_pretrained_logits([tmp_path / "saved"], tmp_path / "logits.pt")
    torch.testing.assert_close(loaded, recorder.logits, atol=1e-5, rtol=1e-4)


def test_a_schedule_not_at_its_end_warns_and_shrinks_what_is_pruned(tmp_path: Path) -> None:
    schedule = LinearSchedule(0.5, end_step=8, frequency=2)  # 6 steps end before step 8
    pruning = GradualPruningCallback(
        schedule, structure="channel", scope="layerwise", shrink_at_end=True, verbose=False
    )  # type: ignore[arg-type]
    model = tiny_llama().train()
    trainer = make_trainer(model, tmp_path, [pruning])
    with pytest.warns(UserWarning, match=r"before the schedule's 50.00% \(step 8\)"):
        trainer.train()
    # 3/8 of 48 channels per block at step 6: 18 pruned, 30 kept.
    assert model.config.intermediate_size == 48 - round(schedule(6) * 48) == 30


def test_a_schedule_at_its_end_shrinks_without_a_warning(tmp_path: Path) -> None:
    pruning = GradualPruningCallback(SCHEDULE, structure="head", shrink_at_end=True, verbose=False)  # type: ignore[arg-type]
    model = tiny_llama().train()
    before = _parameters(model)
    trainer = make_trainer(model, tmp_path, [pruning])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        trainer.train()
    # Pruned at steps 2 and 4, to the schedule's end: half of the 6 key/value heads (1 of 2 in
    # each of the 3 blocks, ranked globally), and shrinking removed exactly those.
    history = pruning.pruner.history
    assert [(step, target) for step, target, _ in history] == [(2, 0.25), (4, 0.5)]
    assert sum(count for *_, count in history) == 3
    report = pruning.shrink_report
    assert report is not None
    assert [(group.before, group.after) for group in report.groups] == [(2, 1)] * 3
    assert report.parameters_before == before > report.parameters_after == _parameters(model)
    assert model.config.num_key_value_heads == 1


@pytest.mark.parametrize("callback", [GradualPruning, GradualPruningCallback])
def test_shrinking_elements_is_refused_when_the_callback_is_made(callback: type) -> None:
    with pytest.raises(ValueError, match=r"shrink_at_end=True.*structure='element'"):
        callback(SCHEDULE, shrink_at_end=True)


def test_shrinking_elements_set_after_construction_is_refused_before_any_mask(
    tmp_path: Path,
) -> None:
    pruning = GradualPruningCallback(SCHEDULE)
    pruning.shrink_at_end = True
    model = tiny_llama()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"shrink_at_end=True.*structure='element'"):
        make_trainer(model, tmp_path, [pruning])
    check()  # no mask, no hook


def test_deepspeed_is_refused_and_fsdp2_gathers_on_rank_zero() -> None:
    deepspeed = DeepSpeedStrategy.__new__(DeepSpeedStrategy)  # needs no deepspeed installed
    with pytest.raises(ValueError, match="DeepSpeedStrategy: its partitioned parameters"):
        check_shrinkable(deepspeed)
    check_shrinkable(ModelParallelStrategy())  # tests/callbacks/test_pruning_fsdp_shrink.py


def test_a_strategy_that_trains_in_worker_processes_is_refused_at_set_up(tmp_path: Path) -> None:
    # ddp_spawn's main process loads rank zero's weights into its own, full-width model.
    pruning = GradualPruning(SCHEDULE, structure="channel", shrink_at_end=True)  # type: ignore[arg-type]
    trainer = pl.Trainer(
        strategy="ddp_spawn", devices=2, accelerator="cpu", max_steps=1, callbacks=[pruning],
        logger=False, default_root_dir=tmp_path,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"launched in worker processes .*'spawn'"):
        check_shrinkable(trainer.strategy)


def test_the_best_checkpoint_is_the_one_shrunk(tmp_path: Path) -> None:
    """load_best_model_at_end: the Trainer loads the best checkpoint (saved in the permanent
    form, before shrinking) when training ends; the callback restores its masks, then shrinks
    that model."""
    pruning = GradualPruningCallback(
        SCHEDULE, structure="channel", scope="layerwise", shrink_at_end=True, verbose=False
    )  # type: ignore[arg-type]
    args = training_args(
        tmp_path, max_steps=8, eval_strategy="steps", eval_steps=4, save_strategy="steps",
        save_steps=4, load_best_model_at_end=True, eval_delay=4, per_device_eval_batch_size=4,
        metric_for_best_model="loss", greater_is_better=False,
    )  # fmt: skip
    model = tiny_llama().train()
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens(count=4, seed=1),
        callbacks=[pruning],
    )  # fmt: skip
    trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best is not None
    saved = transformers.AutoModelForCausalLM.from_pretrained(best)
    assert model.config.intermediate_size == 24
    torch.testing.assert_close(logits_of(model), logits_of(saved), atol=1e-5, rtol=1e-4)


def test_the_session_keeps_its_counts_and_state_from_before_shrinking() -> None:
    """After shrink_at_end the pruner is spent; what the adapters still read (the metrics, the
    state their checkpoints save) is what the pruner had when the model was shrunk."""
    config, options = split_arguments(
        {"schedule": SCHEDULE, "structure": "channel", "scope": "layerwise",
         "shrink_at_end": True, "verbose": True}
    )  # fmt: skip
    messages: list[str] = []
    session = PruningSession(config, options, name="A", built_when="", inform=messages.append)
    model = tiny_llama().train()
    session.build(model)
    session.start([])
    for step in range(5):
        session.step(step)
    metrics, state = session.metrics(fresh=True), session.state_dict()
    before = session.pruner.report()
    session.finish()
    assert model.config.intermediate_size == 24
    with pytest.raises(SpentPrunerError):
        session.pruner.report()
    # What the callbacks' `report` gives: the report read just before shrinking.
    assert session.report().to_dict() == before.to_dict()
    assert session.metrics(fresh=True) == metrics
    after = session.state_dict()
    assert after.keys() == state.keys()
    assert {key: after[key] for key in after if key != "permanent"} == {
        key: state[key] for key in state if key != "permanent"
    }
    assert after["permanent"] and not state["permanent"]
    assert [message.split("\n")[0] for message in messages[-2:]] == [
        "A: final sparsity",
        "A: shrunk the model",
    ]
    session.finish()  # a second end (a second fit) reads nothing from the spent pruner
    assert len(messages) == 4  # two pruning steps, then the messages above, once each


def test_a_parameter_budget_through_the_callbacks_ends_at_the_budget_shrunk() -> None:
    """``target_params`` with a schedule without a target: the run ends shrunk at the budget,
    every layer as wide (plain loading), whichever adapter passes the arguments."""
    config, options = split_arguments(
        {"schedule": LinearSchedule(end_step=4, frequency=2), "structure": "channel",
         "scope": "layerwise", "target_params": 0.9, "shrink_at_end": True, "verbose": False}
    )  # fmt: skip
    session = PruningSession(config, options, name="A", built_when="", inform=print)
    model = tiny_llama().train()
    before = _parameters(model)
    session.build(model)
    session.start([])
    for step in range(5):
        session.step(step)
    session.finish()
    assert session.shrink_report is not None and session.shrink_report.config == "uniform"
    assert int(0.9 * before) - 3 * 96 < _parameters(model) <= int(0.9 * before)
    for callback in (GradualPruning, GradualPruningCallback):
        made = callback(LinearSchedule(end_step=4), structure="channel", target_params=0.9)
        assert made.config.target_params == 0.9
