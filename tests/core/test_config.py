"""PrunerConfig: one validator per rule, the same messages for the Pruner and the callback."""

from __future__ import annotations

import pytest
from torch import nn

from tensorplay.ao.pruning.parity.methods import L1Unstructured, RandomUnstructured
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.config import PrunerConfig, counts_itself
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tests.core.test_pruner import TwoOfFour

SCHEDULE = OneShotSchedule(0.5)
REWINDS = ("none", "init", "step")
EMPTY = "name at least one tensor, but got an empty sequence"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"min_density": "0.1"}, TypeError, "`min_density` to be a float in [0, 1), but got '0.1'"),
        ({"min_density": True}, TypeError, "`min_density` to be a float in [0, 1), but got True"),
        ({"scope": "local"}, ValueError, "`scope` to be 'global', 'layerwise' or 'row', but got 'local'"),  # noqa: E501
        ({"rewind": "best"}, ValueError, f"`rewind` to be one of {REWINDS}, but got 'best'"),
        ({"rewind_step": -1}, ValueError, "`rewind_step` to be an int >= 0, but got -1"),
        ({"rewind_step": 1.5}, TypeError, "`rewind_step` to be an int, but got 1.5"),
        ({"seed": "7"}, TypeError, "`seed` to be an int, but got '7'"),
        ({"parameters": ()}, ValueError, f"`parameters` to {EMPTY}"),
    ],
)  # fmt: skip
def test_each_rule_has_its_message(kwargs, error, message) -> None:
    with pytest.raises(error) as raised:
        PrunerConfig(SCHEDULE, **kwargs)
    assert str(raised.value) == f"Expected {message}."


def test_the_pruner_is_made_from_the_configuration() -> None:
    config = PrunerConfig(SCHEDULE, method="random_unstructured", rewind="init", seed=3)
    pruner = Pruner(nn.Linear(4, 4), **config.as_kwargs())
    assert pruner.config == config and pruner.method is RandomUnstructured
    assert (pruner.seed, pruner.state_dict()["rewind"]) == (3, "init")


def test_a_method_counts_itself_when_it_takes_no_amount() -> None:
    assert (counts_itself(L1Unstructured), counts_itself(TwoOfFour)) == (False, True)
