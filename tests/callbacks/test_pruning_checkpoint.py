"""Checkpoints: mid-schedule resume is bit-exact, pruned checkpoints load strictly."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tensorplay.ao.pruning.parity.methods import is_pruned
from tensorplay.ao.pruning.pruner.schedules import (
    CallableSchedule,
    CubicSchedule,
    ExponentialSchedule,
    OneShotSchedule,
)
from tensorplay.callbacks import GradualPruning
from tests.callbacks.lit_helpers import TOTAL, PrunableTiny, TinyModule, masks_of

# 8 optimizer steps per epoch; pruning every 2 steps until step 20, so epoch 1 ends mid-schedule.
SCHEDULE = CubicSchedule(0.8, end_step=20, frequency=2)
EPOCHS = 3


def _callback(method: str, rewind: str) -> GradualPruning:
    return GradualPruning(SCHEDULE, method=method, rewind=rewind, verbose=False)


def _assert_same_state(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        assert torch.equal(actual[name], value), name


def _differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return sorted(a) != sorted(b) or any(not torch.equal(a[k], b[k]) for k in a)


def _fit_with_checkpoints(make_trainer, directory: Path, method: str, rewind: str) -> TinyModule:
    checkpoints = ModelCheckpoint(dirpath=directory, save_top_k=-1, every_n_epochs=1)
    model = TinyModule()
    trainer = make_trainer(
        max_epochs=EPOCHS,
        callbacks=[_callback(method, rewind), checkpoints],
        enable_checkpointing=True,
    )
    trainer.fit(model)
    return model


# The resumed run needs no ModelCheckpoint of its own.
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
@pytest.mark.parametrize(
    ("method", "rewind", "module_class"),
    [
        pytest.param("l1_unstructured", "none", TinyModule, id="l1"),
        pytest.param("random_unstructured", "init", PrunableTiny, id="random-rewind-mixin"),
    ],
)
def test_resume_mid_schedule_equals_an_uninterrupted_run(
    make_trainer, tmp_path, method, rewind, module_class
):
    uninterrupted = _fit_with_checkpoints(make_trainer, tmp_path / "a", method, rewind)
    final = uninterrupted.state_dict()
    path = tmp_path / "a" / "epoch=0-step=8.ckpt"
    saved = torch.load(path, weights_only=True)
    callback_states = [v for k, v in saved["callbacks"].items() if k.startswith("GradualPruning")]
    assert len(callback_states) == 1
    assert callback_states[0]["last_pruned_step"] == 8
    assert _differs(saved["state_dict"], final)  # the checkpoint is mid-schedule
    resumed = module_class(seed=1)  # another init: everything must come from the checkpoint
    assert _differs(resumed.state_dict(), saved["state_dict"])

    callback = _callback(method, rewind)
    trainer = make_trainer(max_epochs=EPOCHS, callbacks=[callback], logger=False)
    trainer.fit(resumed, ckpt_path=path)

    _assert_same_state(resumed.state_dict(), final)
    assert callback.pruner.pruned_count() == round(0.8 * TOTAL)


def _as_written_by_0_1(checkpoint: dict) -> None:
    """Rewrite the callback's state in place into tensorplay 0.1's layout: the pruner's
    version-1 state (schedule as ``{"type"}``) with the seed and snapshot beside it."""
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("GradualPruning")]
    state = checkpoint["callbacks"][key]
    v1 = {k: state[k] for k in ("step", "last_pruned_step", "targets", "method", "scope")}
    v1.update(min_density=state["min_density"], history=state["history"])
    v1.update(version=1, permanent=state["permanent"], schedule={"type": "cubic"})
    checkpoint["callbacks"][key] = {
        "version": 1,
        "pruner": v1,
        "seed": state["seed"],
        "snapshot": state["snapshot"],
    }


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_resume_from_a_checkpoint_of_0_1_equals_an_uninterrupted_run(make_trainer, tmp_path):
    method, rewind = "random_unstructured", "init"
    final = _fit_with_checkpoints(make_trainer, tmp_path / "a", method, rewind).state_dict()
    checkpoint = torch.load(tmp_path / "a" / "epoch=0-step=8.ckpt", weights_only=True)
    _as_written_by_0_1(checkpoint)
    torch.save(checkpoint, tmp_path / "old.ckpt")

    callback = _callback(method, rewind)
    resumed = PrunableTiny(seed=1)
    make_trainer(max_epochs=EPOCHS, callbacks=[callback], logger=False).fit(
        resumed, ckpt_path=tmp_path / "old.ckpt"
    )

    _assert_same_state(resumed.state_dict(), final)
    assert callback.pruner.state_dict()["version"] == 5


# What tensorplay 0.1 computed as the state key of each callback: its checkpoints hold the
# callback's state under this key.
KEYS_OF_0_1 = [
    (
        GradualPruning(CubicSchedule(0.8, end_step=20, frequency=2)),
        "GradualPruning{'schedule': {'type': 'cubic', 'final_sparsity': 0.8, 'end_step': 20, "
        "'start_step': 0, 'initial_sparsity': 0.0, 'frequency': 2, 'power': 3.0}, 'method': "
        "'l1_unstructured', 'parameters': None, 'module_types': None, 'include': None, "
        "'exclude': None}",
    ),
    (
        GradualPruning(OneShotSchedule(0.5), method="random_unstructured", parameters=["a.w"]),
        "GradualPruning{'schedule': {'type': 'one_shot', 'sparsity': 0.5, 'step': 0}, 'method': "
        "'random_unstructured', 'parameters': ['a.w'], 'module_types': None, 'include': None, "
        "'exclude': None}",
    ),
    (
        GradualPruning(
            ExponentialSchedule(0.2, every=10), names=["weight"], keep_dense=["last"], include=["n"]
        ),
        "GradualPruning{'schedule': {'type': 'exponential', 'rate': 0.2, 'every': 10, "
        "'start_step': 0, 'end_step': None, 'rounds': None}, 'method': 'l1_unstructured', "
        "'parameters': None, 'module_types': None, 'include': ['n'], 'exclude': None, "
        "'names': ['weight'], 'keep_dense': ['last']}",
    ),
    (
        GradualPruning(CallableSchedule(math.sqrt), module_types=["Linear"], exclude=["x"]),
        "GradualPruning{'schedule': {'type': 'callable', 'fn': 'math.sqrt', 'start_step': 0, "
        "'end_step': None, 'frequency': 1}, 'method': 'l1_unstructured', 'parameters': None, "
        "'module_types': ['Linear'], 'include': None, 'exclude': ['x']}",
    ),
]


@pytest.mark.parametrize(("callback", "key"), KEYS_OF_0_1, ids=["cubic", "one-shot", "exp", "fn"])
def test_the_state_key_is_the_one_0_1_wrote(callback, key):
    assert callback.state_key == key


@pytest.fixture(scope="module")
def pruned_checkpoint(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A checkpoint at 3/4 of a schedule and the model's state when it was saved."""
    import lightning.pytorch as pl

    directory = tmp_path_factory.mktemp("pruned")
    model = TinyModule()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=15,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[GradualPruning(SCHEDULE, verbose=False)],
    )
    trainer.fit(model)
    path = directory / "pruned.ckpt"
    trainer.save_checkpoint(path)
    return path, {name: value.clone() for name, value in model.state_dict().items()}


def test_fresh_module_loads_a_pruned_checkpoint_strictly(pruned_checkpoint):
    path, state = pruned_checkpoint
    assert "net.0.weight_orig" in state

    loaded = PrunableTiny.load_from_checkpoint(path, strict=True, seed=5)

    _assert_same_state(loaded.state_dict(), state)
    assert is_pruned(loaded)
    x = torch.randn(3, 8)
    expected = TinyModule()
    expected.load_state_dict(_effective(state), strict=True)
    assert torch.equal(loaded(x), expected(x))


def _effective(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    dense = {}
    for name, value in state.items():
        if name.endswith("_orig"):
            base = name.removesuffix("_orig")
            dense[base] = value * state[base + "_mask"]
        elif not name.endswith("_mask"):
            dense[name] = value
    return dense


def test_plain_module_cannot_load_a_pruned_checkpoint_strictly(pruned_checkpoint):
    path, _ = pruned_checkpoint
    with pytest.raises(RuntimeError, match="weight_orig"):
        TinyModule.load_from_checkpoint(path, strict=True)


def test_make_permanent_leaves_a_dense_model_with_zeros(make_trainer, tmp_path):
    model = TinyModule()
    callback = GradualPruning(SCHEDULE, make_permanent=True, verbose=False)
    trainer = make_trainer(max_steps=20, max_epochs=None, callbacks=[callback], logger=False)
    trainer.fit(model)

    assert sorted(model.state_dict()) == [
        "net.0.bias",
        "net.0.weight",
        "net.2.bias",
        "net.2.weight",
    ]
    assert not is_pruned(model)
    zeros = sum(int((model.net[i].weight == 0).sum()) for i in (0, 2))
    assert zeros == round(0.8 * TOTAL)
    assert masks_of(model) == {}

    trainer.save_checkpoint(tmp_path / "dense.ckpt")
    loaded = TinyModule.load_from_checkpoint(tmp_path / "dense.ckpt", strict=True)
    _assert_same_state(loaded.state_dict(), model.state_dict())


def test_rewind_needs_the_snapshot_when_resuming_past_the_rewind_step(
    make_trainer, pruned_checkpoint
):
    path, _ = pruned_checkpoint  # saved by a run without rewinding: no snapshot in its state
    callback = GradualPruning(SCHEDULE, rewind="init", verbose=False)
    trainer = make_trainer(max_steps=20, max_epochs=None, callbacks=[callback], logger=False)

    with (
        pytest.warns(UserWarning, match=r"another configuration \(rewind: 'none' -> 'init'\)"),
        pytest.raises(RuntimeError, match="rewind snapshot of the initial values"),
    ):
        trainer.fit(TinyModule(), ckpt_path=path)


def test_callback_state_of_another_version_is_rejected():
    callback = GradualPruning(SCHEDULE)
    with pytest.raises(ValueError, match="state version 1 or a pruner state, but got 2"):
        callback.load_state_dict({"version": 2, "pruner": {}, "seed": 0, "snapshot": None})


class ScoredTiny(TinyModule):
    """A validation score that falls as training goes on: the first checkpoint is the best."""

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("score", -float(self.global_step))

    def val_dataloader(self):  # type: ignore[no-untyped-def]
        return self.train_dataloader()

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("test_loss", self.training_step(batch, batch_idx))

    def test_dataloader(self):  # type: ignore[no-untyped-def]
        return self.train_dataloader()


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_testing_the_best_checkpoint_before_the_end_warns_with_both_sparsities(
    make_trainer, tmp_path: Path, masking: str
) -> None:
    from tensorplay.callbacks import PruningRollbackWarning

    callback = GradualPruning(SCHEDULE, masking=masking, verbose=False)  # type: ignore[arg-type]
    best = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="score", mode="max")
    trainer = make_trainer(
        max_epochs=EPOCHS, callbacks=[callback, best], enable_checkpointing=True,
        limit_val_batches=1,
    )  # fmt: skip
    model = ScoredTiny()
    trainer.fit(model)
    assert callback.pruner.pruned_count() == round(0.8 * TOTAL)
    assert Path(best.best_model_path).name == "epoch=0-step=8.ckpt"

    with pytest.warns(PruningRollbackWarning) as warned:
        trainer.test(model, ckpt_path="best")
    sparsity, final = round(SCHEDULE(8) * TOTAL) / TOTAL, round(0.8 * TOTAL) / TOTAL
    rollbacks = [w for w in warned if issubclass(w.category, PruningRollbackWarning)]
    assert len(rollbacks) == 1
    message = str(rollbacks[0].message)
    assert "a checkpoint of step 8 was loaded into the model after the run had reached step 24" in (
        message
    )
    assert f"are {sparsity:.2%} sparse, not the {final:.2%} the run had pruned them to" in message
    assert 'ckpt_path="last"' in message
    # The model tested and the pruner are the checkpoint's.
    assert callback.pruner.last_step == 8
    assert callback.pruner.pruned_count() == round(SCHEDULE(8) * TOTAL)
