"""A copy of a model under a pruner whose score watches the forwards (Wanda, activations, REAP)
never feeds that score: ``copy.deepcopy`` gives the copy inert hooks in place of the observers,
and the teacher copy leaves them out.

Oracle: the score's state after the original model's forwards alone; the copy's logits against
the original's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import OneShotSchedule, Pruner
from tensorplay.ao.pruning.distillation.dense_copy import dense_copy
from tensorplay.ao.pruning.edits.changes import OBSERVER_TYPES, Observer
from tests.hf_models import tiny_llama
from tests.moe_models import tiny_qwen3_moe

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CASES: list[tuple[str, Callable[[], nn.Module], dict[str, Any]]] = [
    ("wanda", tiny_llama, {"scope": "row"}),
    ("activation", tiny_llama, {"structure": "channel"}),
    ("reap", tiny_qwen3_moe, {"structure": "expert"}),
]


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(3, 90, (2, 8), generator=torch.Generator().manual_seed(seed))


def _state(pruner: Pruner) -> str:
    return repr(pruner.importance.state_dict())


def _hooks(model: nn.Module) -> list[object]:
    """Every forward and forward pre-hook of ``model``'s modules."""
    return [
        hook
        for module in model.modules()
        for hooks in (module._forward_hooks, module._forward_pre_hooks)
        for hook in hooks.values()
    ]


def _observers(model: nn.Module) -> int:
    """The live observers on ``model`` (an inert copy of one is not)."""
    return sum(isinstance(hook, Observer) for hook in _hooks(model))


@pytest.mark.parametrize(("importance", "build", "options"), CASES, ids=[c[0] for c in CASES])
def test_a_deep_copy_computes_as_the_model_and_feeds_none_of_its_statistics(
    importance: str, build: Callable[[], nn.Module], options: dict[str, Any]
) -> None:
    model = build().eval()
    pruner = Pruner(model, OneShotSchedule(0.5), importance=importance, **options)
    assert _observers(model) > 0
    with torch.no_grad():
        model(_tokens(0))
        before = _state(pruner)
        copied = copy.deepcopy(model)
        torch.testing.assert_close(copied(_tokens(1)).logits, model(_tokens(1)).logits)
    after_both = _state(pruner)
    assert after_both != before  # the model's own forward was observed
    with torch.no_grad():
        copied(_tokens(2))
    assert _state(pruner) == after_both  # the copy's was not
    assert _observers(copied) == 0


@pytest.mark.parametrize(("importance", "build", "options"), CASES, ids=[c[0] for c in CASES])
def test_the_teacher_copy_leaves_the_observers_out(
    importance: str, build: Callable[[], nn.Module], options: dict[str, Any]
) -> None:
    model = build().eval()
    pruner = Pruner(model, OneShotSchedule(0.5), importance=importance, **options)
    teacher = dense_copy(model)
    before = _state(pruner)
    with torch.no_grad():
        teacher(_tokens(3))
    assert _state(pruner) == before
    assert not any(isinstance(hook, OBSERVER_TYPES) for hook in _hooks(teacher))
