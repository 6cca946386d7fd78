"""GradualPruning in lean mode (``masking="inplace"``) in one process, under DDP, and the
strategies it refuses."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from torch import Tensor

from tensorplay.ao.pruning.pruner.schedules import CubicSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.fsdp_helpers import ShardedTiny
from tests.callbacks.lit_helpers import (
    CLI_TRAINER,
    LIGHTNING_SETS,
    TOTAL,
    PrunableTiny,
    RankMaskWriter,
    TinyModule,
    lightning_cli,
)
from tests.model_state import unchanged

# 8 optimizer steps per epoch; pruning every 2 steps until step 12, so epoch 1 ends mid-schedule.
SCHEDULE = CubicSchedule(0.75, end_step=12, frequency=2)
WEIGHTS = ("net.0", "net.2")


def _lean(**kwargs: object) -> GradualPruning:
    return GradualPruning(SCHEDULE, masking="inplace", verbose=False, **kwargs)  # type: ignore[arg-type]


def _pruning_rows(path: Path) -> list[dict[str, str]]:
    with open(path / "logs" / "version_0" / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    return [
        {k: v for k, v in row.items() if k.startswith("pruning/") or k == "step"} for row in rows
    ]


def _effective_weight(module: torch.nn.Module) -> Tensor:
    # The reparametrization's `weight` is recomputed at the next forward: read `_orig * _mask`.
    if hasattr(module, "weight_orig"):
        return (module.weight_orig * module.weight_mask).detach()
    return module.weight.detach().clone()


def _assert_lean(module: TinyModule) -> None:
    state = module.state_dict()
    assert sorted(state) == [
        "net.0.bias",
        "net.0.weight",
        "net.0.weight_mask",
        "net.2.bias",
        "net.2.weight",
        "net.2.weight_mask",
    ]
    for name in WEIGHTS:
        mask = state[f"{name}.weight_mask"]
        assert mask.dtype == torch.bool, name
        assert isinstance(module.get_submodule(name).weight, torch.nn.Parameter), name
        assert int((state[f"{name}.weight"][~mask] != 0).sum()) == 0, name


def test_lean_fit_prunes_logs_and_trains_as_the_reparametrization(make_trainer, tmp_path):
    runs = {}
    for masking in ("reparametrize", "inplace"):
        callback = GradualPruning(SCHEDULE, masking=masking, log_per_tensor=True, verbose=False)
        logger_dir = tmp_path / masking
        model = TinyModule()
        trainer = make_trainer(
            max_epochs=2, callbacks=[callback], logger=CSVLogger(logger_dir, "logs", version=0)
        )
        trainer.fit(model)
        assert callback.pruner.pruned_count() == round(0.75 * TOTAL)
        weights = {name: _effective_weight(model.get_submodule(name)) for name in WEIGHTS}
        runs[masking] = (model, weights, _pruning_rows(logger_dir))

    lean_model, lean_weights, lean_rows = runs["inplace"]
    _, reparam_weights, reparam_rows = runs["reparametrize"]
    _assert_lean(lean_model)
    assert len(lean_rows) == len(reparam_rows) == 16
    assert lean_rows == reparam_rows
    # Pruned weights are zero and kept ones see the same gradients: the same effective weights.
    for name in WEIGHTS:
        assert torch.equal(lean_weights[name], reparam_weights[name]), name


class _ClipRecorder(TinyModule):
    """Record, when Lightning clips, whether every pruned gradient is already zero."""

    def __init__(self) -> None:
        super().__init__()
        self.pruned_grads: list[int] = []

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ):  # type: ignore[no-untyped-def]
        total = 0
        for name in WEIGHTS:
            module = self.get_submodule(name)
            if hasattr(module, "weight_mask"):
                total += int((module.weight.grad[~module.weight_mask] != 0).sum())
        self.pruned_grads.append(total)
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)


def test_gradients_of_pruned_weights_are_zero_before_clipping(make_trainer):
    model = _ClipRecorder()
    callback = _lean()
    trainer = make_trainer(max_epochs=2, gradient_clip_val=0.05, callbacks=[callback], logger=False)
    trainer.fit(model)

    assert len(model.pruned_grads) == 16
    assert model.pruned_grads == [0] * 16
    assert callback.pruner.pruned_count() == round(0.75 * TOTAL)
    _assert_lean(model)


class _ManualClip(TinyModule):
    """Manual optimization that clips right after the backward, before Lightning calls any
    callback: records the norm it clips by and the norm of the gradients with every pruned
    entry left out."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.norms: list[tuple[float, float]] = []

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()  # type: ignore[union-attr]
        self.manual_backward(super().training_step(batch, batch_idx))
        kept = []
        for param in self.parameters():
            module = next((m for m in self.modules() if m._parameters.get("weight") is param), None)
            mask = getattr(module, "weight_mask", None) if module is not None else None
            kept.append(param.grad if mask is None else param.grad * mask)
        kept_norm = float(torch.nn.utils.get_total_norm(kept))
        clipped = torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm=0.05)
        self.norms.append((float(clipped), kept_norm))
        optimizer.step()  # type: ignore[union-attr]


def test_manual_optimization_clips_by_the_norm_of_the_kept_weights_gradients(make_trainer):
    model = _ManualClip()
    callback = _lean()
    trainer = make_trainer(max_epochs=2, callbacks=[callback], logger=False)
    trainer.fit(model)

    assert len(model.norms) == 16
    assert callback.pruner.pruned_count() == round(0.75 * TOTAL)
    # From the first pruning step on, the pruned entries are zero when the loop clips.
    for step, (clipped, kept) in enumerate(model.norms):
        assert clipped == pytest.approx(kept, rel=1e-6), step
    assert model.norms[-1][0] > 0
    _assert_lean(model)


def _differs(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return sorted(a) != sorted(b) or any(not torch.equal(a[k], b[k]) for k in a)


def _assert_same_state(actual: dict[str, Tensor], expected: dict[str, Tensor]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        assert torch.equal(actual[name], value), name


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_lean_resume_mid_schedule_equals_an_uninterrupted_run(make_trainer, tmp_path):
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "a", save_top_k=-1, every_n_epochs=1)
    uninterrupted = TinyModule()
    make_trainer(max_epochs=3, callbacks=[_lean(), checkpoints], enable_checkpointing=True).fit(
        uninterrupted
    )
    final = uninterrupted.state_dict()
    path = tmp_path / "a" / "epoch=0-step=8.ckpt"
    saved = torch.load(path, weights_only=True)
    assert saved["state_dict"]["net.0.weight_mask"].dtype == torch.bool
    assert _differs(saved["state_dict"], final)  # the checkpoint is mid-schedule

    resumed = TinyModule(seed=1)  # another init: everything must come from the checkpoint
    callback = _lean()
    make_trainer(max_epochs=3, callbacks=[callback], logger=False).fit(resumed, ckpt_path=path)

    _assert_same_state(resumed.state_dict(), final)
    assert callback.pruner.pruned_count() == round(0.75 * TOTAL)

    # The final checkpoint loads strictly into a fresh module, masks included.
    final_path = tmp_path / "a" / "epoch=2-step=24.ckpt"
    loaded = PrunableTiny.load_from_checkpoint(final_path, seed=1)
    _assert_same_state(loaded.state_dict(), final)
    _assert_lean(loaded)


def test_make_permanent_in_lean_mode_drops_the_masks(make_trainer):
    model = TinyModule()
    callback = _lean(make_permanent=True)
    make_trainer(max_epochs=2, callbacks=[callback], logger=False).fit(model)

    assert sorted(model.state_dict()) == [
        "net.0.bias",
        "net.0.weight",
        "net.2.bias",
        "net.2.weight",
    ]
    zeros = sum(int((model.get_submodule(n).weight == 0).sum()) for n in WEIGHTS)
    assert zeros == round(0.75 * TOTAL)


@pytest.mark.slow
@pytest.mark.distributed
def test_lean_masks_are_identical_across_two_ddp_ranks(make_trainer, tmp_path):
    schedule = CubicSchedule(0.75, end_step=4)
    callbacks = [
        RankMaskWriter(str(tmp_path)),  # first: gives each rank its own global seed
        GradualPruning(schedule, parameters=["net.0.weight"], masking="inplace", verbose=False),
        GradualPruning(
            schedule,
            method="random_unstructured",
            parameters=["net.2.weight"],
            masking="inplace",
            verbose=False,
        ),
    ]
    trainer = make_trainer(
        strategy="ddp_spawn", devices=2, max_steps=4, callbacks=callbacks, logger=False
    )
    trainer.fit(TinyModule())

    rank0 = torch.load(tmp_path / "masks_rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "masks_rank1.pt", weights_only=True)
    masks = ["net.0.weight_mask", "net.2.weight_mask"]
    assert sorted(rank0["masks"]) == sorted(rank1["masks"]) == masks
    assert int((~rank0["masks"]["net.0.weight_mask"]).sum()) == 96
    assert int((~rank0["masks"]["net.2.weight_mask"]).sum()) == 48
    for name in masks:
        assert rank0["masks"][name].dtype == torch.bool, name
        assert torch.equal(rank0["masks"][name], rank1["masks"][name]), name
    for name in WEIGHTS:
        weights = rank0["weights"][name]
        assert torch.equal(weights, rank1["weights"][name]), name
        assert int((weights[~rank0["masks"][f"{name}.weight_mask"]] != 0).sum()) == 0, name


class _CpuFSDPStrategy(FSDPStrategy):
    """Lightning refuses ``FSDPStrategy`` itself on CPU when the Trainer is made (an exact type
    check), and torch's FSDP1 needs an accelerator; a subclass reaches set-up on CPU, where the
    callback must refuse it before FSDP1 wraps anything."""


@pytest.fixture
def process_group_cleanup() -> Iterator[None]:
    """Undo what a one-process distributed strategy leaves behind: the default process group
    and the environment variables Lightning sets."""
    environ = dict(os.environ)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(environ)


@pytest.mark.usefixtures("process_group_cleanup")
@pytest.mark.parametrize(
    ("strategy", "kwargs", "match"),
    [
        pytest.param(
            lambda: _CpuFSDPStrategy(use_orig_params=True),
            {"masking": "inplace"},
            r"got Lightning's `FSDPStrategy` \(FSDP1\)",
            id="fsdp1",
        ),
        pytest.param(
            lambda: ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1),
            {},
            r"Expected `masking='inplace'` under `ModelParallelStrategy`.*'reparametrize'",
            id="model-parallel-reparametrize",
        ),
        pytest.param(
            lambda: ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1),
            {"masking": "inplace", "rewind": "init"},
            r"Expected `rewind='none'` under `ModelParallelStrategy`.*'init'",
            id="model-parallel-rewind",
        ),
    ],
)
def test_unsupported_strategy_fails_at_setup_and_leaves_the_model(
    make_trainer, strategy, kwargs, match
):
    model = ShardedTiny()
    check = unchanged(model, ignoring=LIGHTNING_SETS)
    callback = GradualPruning(SCHEDULE, verbose=False, **kwargs)
    trainer = make_trainer(strategy=strategy(), callbacks=[callback], logger=False)

    with pytest.raises(ValueError, match=match):
        trainer.fit(model)

    assert not callback.built
    check()


LEAN_CONFIG = (
    CLI_TRAINER.format(max_steps=4)
    + """        schedule:
          class_path: tensorplay.ao.pruning.pruner.schedules.LinearSchedule
          init_args:
            final_sparsity: 0.5
            end_step: 4
        masking: inplace
        verbose: false
"""
)


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_lightning_cli_builds_a_lean_callback_from_yaml(tmp_path):
    cli = lightning_cli(tmp_path, LEAN_CONFIG)
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, GradualPruning)]
    assert callback.config.masking == "inplace"

    cli.trainer.fit(cli.model)

    assert callback.pruner.masking == "inplace"
    assert callback.pruner.pruned_count() == TOTAL // 2
    _assert_lean(cli.model)
