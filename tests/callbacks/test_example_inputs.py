"""The callbacks trace a plain model with example inputs for structure="channel": given, the
module's ``example_input_array``, or those of its first training forward; every conv is then a
unit, and the schedule's sparsity is spread over all of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

from tensorplay.ao.pruning import DependencyGraph
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tensorplay.callbacks import GradualPruning, PrunableMixin
from tests.callbacks.cnn_helpers import (
    CHANNELS,
    CnnModule,
    CnnNet,
    CnnNetTakingKwargs,
    Images,
    cnn,
    images,
)
from tests.callbacks.lit_helpers import masks_of
from tests.model_state import unchanged

CONVS = ["net.0", "net.3"]


class BuiltAtStart(Callback):
    """Whether the pruning callback (first in the list) had built its pruner when training
    started, and the hooks on the module then."""

    def __init__(self) -> None:
        self.built: bool | None = None
        self.pre_hooks = -1

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.built = trainer.callbacks[0].built  # type: ignore[attr-defined]
        self.pre_hooks = len(pl_module._forward_pre_hooks)


def convs_pruned(pruner: Any) -> dict[str, int]:
    """Output channels pruned per conv (rows of its weight mask that are all zero)."""
    masks = {name: pruner.model.get_submodule(name).weight_mask for name in CONVS}
    return {name: int((mask.flatten(1) == 0).all(dim=1).sum()) for name, mask in masks.items()}


def test_the_tracing_without_inputs_misses_the_pooled_conv() -> None:
    """Why the callbacks need inputs: the second conv's output is pooled into the Linear."""
    without = DependencyGraph(cnn()).groups("channel")
    traced = DependencyGraph(cnn(), images(2)[0]).groups("channel")
    assert sum(group.size for group in without) == 8
    assert sum(group.size for group in traced) == CHANNELS


@pytest.mark.parametrize("source", ["first_forward", "example_input_array", "example_inputs"])
def test_every_conv_is_a_unit_whatever_gives_the_inputs(make_trainer, source: str) -> None:
    x = images(2)[0]
    module = CnnModule(example_input_array=x if source == "example_input_array" else None)
    pruning = GradualPruning(
        OneShotSchedule(0.5), structure="channel", verbose=False,
        example_inputs=x if source == "example_inputs" else None,
    )  # fmt: skip
    start = BuiltAtStart()
    make_trainer(max_steps=2, callbacks=[pruning, start]).fit(module)

    assert pruning.pruner.total_count() == CHANNELS
    assert [row.name for row in pruning.pruner.report().rows] == CONVS
    assert pruning.pruner.history == [(0, 0.5, CHANNELS // 2)]  # step 0, as always
    pruned = convs_pruned(pruning.pruner)
    assert sum(pruned.values()) == CHANNELS // 2 and min(pruned.values()) > 0
    # Given inputs build at set-up; the first forward's build the pruner after it.
    assert start.built is (source != "first_forward")
    assert start.pre_hooks == (1 if source == "first_forward" else 0)
    assert len(module._forward_pre_hooks) == 0


def test_the_first_forward_build_follows_a_schedule(make_trainer) -> None:
    schedule = LinearSchedule(0.5, end_step=4, frequency=2)
    pruning = GradualPruning(schedule, structure="channel", verbose=False)
    make_trainer(max_steps=4, accumulate_grad_batches=1, callbacks=[pruning]).fit(CnnModule())
    expected = [round(schedule(step) * CHANNELS) for step in (2, 4)]
    assert [(step, count) for step, _, count in pruning.pruner.history] == [
        (2, expected[0]),
        (4, expected[1] - expected[0]),
    ]


class PrunableCnn(PrunableMixin, CnnModule):
    """Loads pruned checkpoints: the masks exist before the first forward builds the pruner."""


def test_a_run_built_from_the_first_forward_resumes_with_prunable_mixin(
    make_trainer, tmp_path: Path
) -> None:
    schedule = LinearSchedule(0.5, end_step=4)

    def pruning() -> GradualPruning:
        # Random units depend on the seed, the step and the units pruned before alone.
        return GradualPruning(
            schedule, structure="channel", method="random_unstructured", seed=3, verbose=False
        )

    whole, uninterrupted = pruning(), PrunableCnn()
    make_trainer(max_steps=4, callbacks=[whole]).fit(uninterrupted)
    saving = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    trainer = make_trainer(max_steps=2, callbacks=[pruning(), saving], enable_checkpointing=True)
    trainer.fit(PrunableCnn())
    resumed, model = pruning(), PrunableCnn()
    make_trainer(max_steps=4, callbacks=[resumed]).fit(
        model, ckpt_path=tmp_path / "ckpt" / "epoch=0-step=2.ckpt"
    )
    assert resumed.pruner.history == whole.pruner.history
    assert [count for _, _, count in whole.pruner.history] == [3, 3, 3, 3]
    ours, theirs = masks_of(model), masks_of(uninterrupted)
    assert sorted(ours) == sorted(theirs) and len(ours) == 9  # 2 convs, 2 norms, the Linear
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


def test_shrink_at_end_removes_the_units_traced_from_the_first_forward(make_trainer) -> None:
    pruning = GradualPruning(
        OneShotSchedule(0.5), structure="channel", shrink_at_end=True, verbose=False
    )
    module = CnnModule()
    make_trainer(max_steps=2, callbacks=[pruning]).fit(module)
    kept = {name: module.get_submodule(name).out_channels for name in CONVS}
    assert sum(kept.values()) == CHANNELS // 2 and min(kept.values()) > 0
    assert module.net[8].in_features == kept["net.3"]
    assert module(images(2)[0]).shape == (2, 4)


def test_a_step_without_a_forward_of_the_module_is_an_error(make_trainer) -> None:
    module = CnnModule(forward_in_step=False)
    pruning = GradualPruning(OneShotSchedule(0.5), structure="channel", verbose=False)
    with pytest.raises(RuntimeError, match=r"expected a training forward of CnnModule .*"
                       r"Pass `example_inputs`"):  # fmt: skip
        make_trainer(max_steps=2, callbacks=[pruning]).fit(module)
    assert not pruning.built and len(module._forward_pre_hooks) == 0


def test_example_inputs_are_checked_when_the_callback_is_made() -> None:
    with pytest.raises(TypeError, match=r"`example_inputs` to be a tensor, a tuple .* got list"):
        GradualPruning(OneShotSchedule(0.5), structure="channel", example_inputs=[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="structure` to be 'channel' with `example_inputs`"):
        GradualPruning(OneShotSchedule(0.5), example_inputs=torch.ones(1))


@pytest.mark.parametrize("net", [CnnNet, CnnNetTakingKwargs])
def test_the_trainer_callback_traces_a_plain_model_with_its_first_inputs(
    tmp_path: Path, net: type[CnnNet]
) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
    from tests.callbacks.hf_trainer_helpers import training_args

    pruning = GradualPruningCallback(OneShotSchedule(0.5), structure="channel", verbose=False)
    model = net()
    args = training_args(tmp_path, max_steps=2, per_device_train_batch_size=8)
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Images(), callbacks=[pruning]
    )
    assert not pruning._session.built  # waits for the first forward
    trainer.train()

    assert pruning.pruner.total_count() == CHANNELS
    assert pruning.pruner.history == [(0, 0.5, CHANNELS // 2)]
    assert [row.name for row in pruning.pruner.report().rows] == CONVS
    assert min(convs_pruned(pruning.pruner).values()) > 0
    assert len(model._forward_pre_hooks) == 0


def test_the_trainer_callback_refuses_to_resume_a_run_built_from_the_first_forward(
    tmp_path: Path,
) -> None:
    transformers = pytest.importorskip("transformers")
    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
    from tests.callbacks.hf_trainer_helpers import training_args

    pruning = GradualPruningCallback(OneShotSchedule(0.5), structure="channel", verbose=False)
    model = CnnNet()
    args, control = training_args(tmp_path), transformers.TrainerControl()
    check = unchanged(model)
    pruning.on_init_end(args, transformers.TrainerState(), control, model=model)
    resumed = transformers.TrainerState(global_step=3)
    with pytest.raises(ValueError, match=r"Expected `example_inputs` .* to resume training CnnNet"):
        pruning.on_train_begin(args, resumed, control, model=model)
    assert not pruning._session.built
    check()  # the hook on_init_end put on it to wait for the first forward is gone too


def test_a_frameworks_example_inputs_become_positional_inputs() -> None:
    from tensorplay.callbacks.core.example_inputs import as_example_inputs

    model, x = CnnNet(), images(2)[0]
    assert as_example_inputs(model, [x])[0] is x  # type: ignore[index]
    assert as_example_inputs(model, {"pixel_values": x})[0] is x  # type: ignore[index]
    with pytest.raises(ValueError, match=r"but 'labels' follows a parameter that was not given"):
        as_example_inputs(model, {"labels": x})
    with pytest.raises(ValueError, match=r"but got an unexpected keyword argument 'labels'"):
        as_example_inputs(nn.Linear(2, 2), {"labels": x})
    with pytest.raises(TypeError, match=r"example inputs of CnnNet to be a tensor, .* got set"):
        as_example_inputs(model, {1})


def test_example_inputs_have_no_plain_form_for_restored_callback_states(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
    from tests.callbacks.hf_trainer_helpers import training_args

    pruning = GradualPruningCallback(
        OneShotSchedule(0.5), structure="channel", example_inputs=images(2)[0]
    )
    args = training_args(tmp_path, restore_callback_states_from_checkpoint=True)
    with pytest.raises(ValueError, match=r"`example_inputs` were given"):
        pruning.on_init_end(args, transformers.TrainerState(), transformers.TrainerControl())
