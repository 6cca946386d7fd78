"""A refusal, at build or at a step, from every core entry point, leaves the model exactly as it
was: state_dict bit for bit, parameters, buffers, hooks, attributes and config
(``tests/model_state.py``). The adapters' refusals are tested in ``tests/callbacks``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import Distillation, OneShotSchedule, Pruner, prune_one_shot
from tensorplay.ao.pruning.masking.lean_masks import install_mask
from tests.model_state import unchanged
from tests.moe_models import tiny_mixtral

TOKENS = torch.tensor([[5, 17, 3, 88, 41, 9, 60], [1, 2, 3, 4, 5, 6, 7]])


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))


def test_a_structured_pruner_refused_after_its_units_were_found_leaves_no_record() -> None:
    model = mlp()
    install_mask([(model[0], "weight")], torch.ones(16, 4, dtype=torch.bool))  # lean already
    check = unchanged(model)
    with pytest.raises(ValueError, match="not to carry a lean bool mask"):
        Pruner(model, OneShotSchedule(0.5), structure="channel", example_inputs=torch.randn(2, 4))
    check()  # no tensorplay_unit_groups, no hooks, no masks


def test_a_multiple_wider_than_a_group_leaves_nothing() -> None:
    model = mlp()
    check = unchanged(model)
    with pytest.raises(ValueError, match="at most the width of every channel group"):
        Pruner(
            model,
            OneShotSchedule(0.5),
            structure="channel",
            example_inputs=torch.randn(2, 4),
            multiple_of=12,
        )
    check()


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_a_one_shot_expert_call_refused_leaves_no_routing_hook(masking: str) -> None:
    model = tiny_mixtral()
    check = unchanged(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="top_k"):
            prune_one_shot(model, [TOKENS], 0.9, structure="expert", masking=masking)
    check()


def test_a_refused_step_leaves_the_model_as_the_build_left_it() -> None:
    model = mlp()
    pruner = Pruner(model, OneShotSchedule(0.5), importance="wanda", scope="row")
    check = unchanged(model)
    with pytest.raises(RuntimeError, match="saw none: run a calibration pass"):
        pruner.step()  # no calibration forward ran
    check()


def test_a_distillation_refused_at_attach_leaves_the_student_alone() -> None:
    student = mlp()
    check = unchanged(student)
    with pytest.raises(ValueError, match="share"):
        Distillation(teacher=nn.Sequential(student[0])).attach(student)
    check()


def test_a_budget_above_the_models_size_is_refused_naming_both_numbers() -> None:
    model = mlp()
    total = sum(p.numel() for p in model.parameters())
    check = unchanged(model)
    with pytest.raises(ValueError, match=rf"at most the model's {total} parameters, but got "
                       rf"{total + 1}: nothing would be pruned"):  # fmt: skip
        prune_one_shot(
            model,
            [torch.randn(2, 4)],
            target_params=total + 1,
            structure="channel",
            example_inputs=torch.randn(2, 4),
        )
    check()
