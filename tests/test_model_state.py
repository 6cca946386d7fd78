"""``tests.model_state.unchanged`` sees each kind of change a refusal could leave behind: the
refusal tests rely on it, so each check it makes is shown to fail here."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import l1_unstructured
from tests.model_state import unchanged


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    l1_unstructured(model[0], "weight", amount=3)
    return model


def _negative_zero(model: nn.Sequential) -> None:
    with torch.no_grad():
        model[2].bias[0] = 0.0
    check = unchanged(model)
    with torch.no_grad():
        model[2].bias[0] = -0.0  # equal to 0.0, not the same bits
    check()


def _requires_grad(model: nn.Sequential) -> None:
    model[2].weight.requires_grad_(False)


def _container_method(model: nn.Sequential) -> None:
    hook = next(iter(model[0]._forward_pre_hooks.values()))
    hook._tensor_name = "bias"  # a hook's own attribute


def _gradient_hook(model: nn.Sequential) -> None:
    model[2].weight.register_post_accumulate_grad_hook(lambda param: None)


CHANGES: dict[str, tuple[Callable[[nn.Sequential], None], str]] = {
    "value": (lambda m: m[2].weight.data.add_(1), "the values of '2.weight' changed"),
    "negative-zero": (_negative_zero, "the values of '2.bias' changed"),
    "dtype": (lambda m: m[1].double(), "changed dtype"),
    "buffer": (lambda m: m[2].register_buffer("extra", torch.ones(1)), "state_dict keys"),
    "parameter-object": (
        lambda m: setattr(m[2], "bias", nn.Parameter(m[2].bias.detach().clone())),
        "the parameters changed",
    ),
    "requires-grad": (_requires_grad, "requires_grad"),
    "forward-hook": (
        lambda m: m[1].register_forward_hook(lambda *args: None),
        "the hooks of module '1'",
    ),
    "hook-state": (_container_method, r"the state of hook \('_forward_pre_hooks', \d+\)"),
    "gradient-hook": (_gradient_hook, "the gradient hooks of '2.weight'"),
    "attribute": (lambda m: setattr(m[2], "note", 1), r"\['note'\] added"),
    "attribute-value": (lambda m: setattr(m[1], "momentum", 0.5), "attribute 'momentum'"),
    "module": (lambda m: m.append(nn.ReLU()), "the modules changed"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_each_kind_of_change_is_caught_and_named(change: str) -> None:
    model = _model()
    check = unchanged(model)
    check()  # nothing changed yet
    make, message = CHANGES[change]
    with pytest.raises(AssertionError, match=message):
        make(model)
        check()


def test_an_optimizers_hooks_and_a_config_are_compared_too() -> None:
    model = _model()
    model.config = type("Config", (), {"to_dict": lambda self: dict(vars(self))})()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    check = unchanged(model, optimizer)
    optimizer.register_step_pre_hook(lambda *args: None)
    with pytest.raises(AssertionError, match="an optimizer's hooks changed"):
        check()
    check = unchanged(model, optimizer)
    model.config.hidden_size = 3
    with pytest.raises(AssertionError, match="the config's attributes changed"):
        check()


def test_ignoring_leaves_out_the_attributes_named() -> None:
    model = _model()
    check = unchanged(model, ignoring=("_trainer",))
    model._trainer = object()
    check()
    model.other = 1
    with pytest.raises(AssertionError, match=r"\['other'\] added"):
        check()
