"""The Trainer's sharded set-ups: what ``GradualPruningCallback`` refuses, before any mask.

A Trainer in one process refuses ``fsdp`` itself, so its events are called here as it would call
them (with real ``TrainingArguments``). What the Trainer really does under ``torchrun`` with
``fsdp`` on CPU, and the sharded teacher's checkpoint, run on two gloo ranks
(``test_hf_trainer_fsdp2.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks.core.fsdp2_config import check_fsdp2_config
from tensorplay.callbacks.core.lifecycle import split_arguments
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tensorplay.callbacks.transformers.sharded_setups import (
    check_fresh_under_fsdp2,
    fsdp_version,
    refuse_loads_before_build,
    trainer_shards_with_fsdp2,
)
from tests.callbacks.hf_trainer_helpers import masks, training_args
from tests.hf_models import tiny_gpt2
from tests.model_state import unchanged

transformers = pytest.importorskip("transformers")

SCHEDULE = LinearSchedule(0.5, end_step=4, frequency=1)


def _init_end(callback: GradualPruningCallback, args: Any) -> None:
    model = tiny_gpt2().train()
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    try:
        callback.on_init_end(args, state, control, model=model)
    finally:
        assert masks(model) == {}  # refused before any mask was made


def test_fsdp2_on_cpu_is_refused_saying_why_and_what_works(tmp_path: Path) -> None:
    args = training_args(tmp_path, fsdp=True)  # FSDP2: the Trainer's default version
    assert fsdp_version(args) == 2
    callback = GradualPruningCallback(SCHEDULE, masking="inplace")
    expected = (
        # Accelerate's state: "not made", or that of a Trainer made earlier in this process.
        r"`fsdp` \(FSDP2\).*use_cpu=True.*Accelerate's state: .*drops the FSDP plugin"
        r".*ModelParallelStrategy"
    )
    with pytest.raises(ValueError, match=expected):
        _init_end(callback, args)


def test_fsdp1_is_refused_naming_the_version(tmp_path: Path) -> None:
    args = training_args(tmp_path, fsdp=True, fsdp_config={"version": 1})
    with pytest.raises(ValueError, match=r"got FSDP version 1: FSDP1 flattens"):
        _init_end(GradualPruningCallback(SCHEDULE, masking="inplace"), args)


def test_deepspeed_is_refused_naming_its_value(tmp_path: Path) -> None:
    # TrainingArguments(deepspeed=...) needs the deepspeed package to be made: set afterwards.
    args = training_args(tmp_path)
    args.deepspeed = "ds_config.json"
    with pytest.raises(ValueError, match=r"without `deepspeed`.*deepspeed='ds_config.json'"):
        _init_end(GradualPruningCallback(SCHEDULE), args)


def test_without_sharding_the_callback_builds_when_the_trainer_is_made(tmp_path: Path) -> None:
    config, _ = split_arguments({"schedule": SCHEDULE})
    assert not trainer_shards_with_fsdp2(training_args(tmp_path), config)


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        pytest.param({}, r"`masking='inplace'`.*masking='reparametrize'", id="masking"),
        pytest.param(
            {"masking": "inplace", "rewind": "init"}, r"`rewind='none'`.*rewind='init'", id="rewind"
        ),
        pytest.param(
            {
                "schedule": LinearSchedule(end_step=4),
                "structure": ["layer", "hidden"],
                "target_params": 0.8,
                "search": True,
                "search_batches": [torch.ones(1, 2)],
            },
            r"search=False under the Trainer's FSDP2.*masks in the forward",
            id="search",
        ),
    ],
)
def test_fsdp2_refuses_what_sharded_parameters_cannot_hold(
    arguments: dict[str, Any], match: str
) -> None:
    config, _ = split_arguments({"schedule": SCHEDULE, **arguments})  # a schedule given wins
    with pytest.raises(ValueError, match=match):
        check_fsdp2_config(config, "the Trainer's FSDP2")


def test_fsdp2_accepts_lean_masks_distillation_and_shrinking_at_the_end() -> None:
    config, _ = split_arguments(
        {
            "schedule": SCHEDULE,
            "masking": "inplace",
            "distill_weight": 1.0,
            "structure": "channel",
            "shrink_at_end": True,
        }
    )
    check_fsdp2_config(config, "the Trainer's FSDP2")  # no error


def test_a_resumed_run_under_fsdp2_is_refused_saying_what_works() -> None:
    check_fresh_under_fsdp2(0)  # a fresh run
    with pytest.raises(ValueError, match=r"start at step 0.*got step 3.*ModelParallelStrategy"):
        check_fresh_under_fsdp2(3)


def test_a_checkpoint_with_masks_is_refused_before_the_pruner_exists_and_nothing_loads() -> None:
    model = tiny_gpt2().train()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    saved = {key: torch.zeros_like(value) for key, value in before.items()}
    saved["transformer.h.0.attn.c_attn.weight_mask"] = torch.ones(32, 96, dtype=torch.bool)
    built = False
    handle = refuse_loads_before_build(model, lambda: built)
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"'transformer.h.0.attn.c_attn.weight_mask'.*FSDP2"):
        model.load_state_dict(saved)
    check()
    model.load_state_dict(before)  # no masks: a load the guard lets through
    built = True
    with pytest.raises(RuntimeError, match="Unexpected key"):  # torch's own error: not the guard
        model.load_state_dict(saved)
    handle.remove()
