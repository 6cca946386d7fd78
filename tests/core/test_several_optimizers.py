"""Several optimizers over one pruner (a GAN's generator and discriminator): which targets each
holds, and gradient scores accumulated once per step of the optimizer that holds a target, from
the gradients that optimizer uses, against totals recorded by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule

MASKINGS = ["reparametrize", "inplace"]
GENERATOR = ["g.0.weight", "g.2.weight"]
DISCRIMINATOR = ["d.0.weight", "d.2.weight"]


class Wrapped:
    """A framework's optimizer wrapper (Lightning's LightningOptimizer): ``.optimizer``."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer


def gan() -> nn.ModuleDict:
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6))
    discriminator = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    return nn.ModuleDict({"g": generator, "d": discriminator})


def unpruned(model: nn.Module, name: str) -> Tensor:
    """The parameter the score reads: ``<name>_orig`` while reparametrized."""
    module_name, _, tensor = name.rpartition(".")
    module = model.get_submodule(module_name)
    return getattr(module, tensor + "_orig", getattr(module, tensor))


def optimizers(model: nn.ModuleDict) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    generator = torch.optim.SGD(model["g"].parameters(), lr=0.05, momentum=0.9)
    discriminator = torch.optim.Adam(model["d"].parameters(), lr=0.01)
    return generator, discriminator


def train(
    model: nn.ModuleDict,
    pruner: Pruner,
    pair: tuple[torch.optim.Optimizer, torch.optim.Optimizer],
    before_step: Callable[[torch.optim.Optimizer], object] = lambda optimizer: None,
    batches: int = 8,
) -> dict[str, Tensor]:
    """Alternate one generator and one discriminator step per batch; the generator's loss
    reaches the discriminator's weights too (foreign gradients its step does not use). Returns
    ``-sum w * g`` of each target over the steps of its own optimizer, recorded by hand."""
    generator, discriminator = pair
    expected = {name: torch.zeros_like(unpruned(model, name)) for name in pruner.targets}
    data = torch.Generator().manual_seed(1)

    def record(names: list[str]) -> None:
        for name in names:
            param = unpruned(model, name)
            assert param.grad is not None
            expected[name].sub_(param.detach() * param.grad)

    for _ in range(batches):
        noise, real = torch.randn(5, 4, generator=data), torch.randn(5, 6, generator=data)
        model.zero_grad()
        (-model["d"](model["g"](noise)).mean()).backward()
        record(GENERATOR)
        before_step(generator)
        generator.step()
        model.zero_grad()
        fake = model["g"](noise).detach()
        (model["d"](fake).mean() - model["d"](real).mean()).backward()
        record(DISCRIMINATOR)
        before_step(discriminator)
        discriminator.step()
    return expected


def check_totals(pruner: Pruner, expected: dict[str, Tensor]) -> None:
    assert pruner.importance.steps() == dict.fromkeys(pruner.targets, 8)  # type: ignore[attr-defined]
    totals = pruner.importance.totals()  # type: ignore[attr-defined]
    assert list(totals) == sorted(totals, key=pruner.targets.index)
    for name in pruner.targets:
        # The same multiply-subtract in the same order in this process: equal to rounding.
        torch.testing.assert_close(totals[name], expected[name], rtol=1e-6, atol=1e-7)


def test_held_by_names_the_targets_each_optimizer_holds_through_wrappers():
    model = gan()
    pruner = Pruner(model, OneShotSchedule(0.5))
    generator = torch.optim.SGD(model["g"].parameters(), lr=0.1)
    discriminator = torch.optim.Adam(model["d"].parameters())
    nothing = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)
    assert pruner.held_by(generator) == GENERATOR
    assert pruner.held_by(Wrapped(Wrapped(discriminator))) == DISCRIMINATOR  # type: ignore[arg-type]
    assert pruner.held_by(nothing) == []


def test_held_by_refuses_what_is_not_an_optimizer():
    pruner = Pruner(gan(), OneShotSchedule(0.5))
    with pytest.raises(
        TypeError, match=r"Expected `optimizer` to be a torch.optim.Optimizer.*Linear"
    ):
        pruner.held_by(nn.Linear(2, 2))  # type: ignore[arg-type]


@pytest.mark.parametrize("masking", MASKINGS)
def test_attached_optimizers_accumulate_only_their_own_targets_once_per_step(masking):
    model = gan()
    pruner = Pruner(model, OneShotSchedule(0.5, step=100), importance="movement", masking=masking)
    pruner.reparametrize()
    pair = optimizers(model)
    pruner.attach(*pair)
    check_totals(pruner, train(model, pruner, pair))


@pytest.mark.parametrize("masking", MASKINGS)
def test_accumulate_with_an_optimizer_adds_only_the_targets_it_holds(masking):
    model = gan()
    pruner = Pruner(model, OneShotSchedule(0.5, step=100), importance="movement", masking=masking)
    pruner.reparametrize()
    pair = optimizers(model)
    expected = train(model, pruner, pair, lambda o: pruner.accumulate(Wrapped(o)))  # type: ignore[arg-type]
    check_totals(pruner, expected)


def test_accumulate_without_an_optimizer_still_adds_every_target_that_has_a_gradient():
    model = gan()
    pruner = Pruner(model, OneShotSchedule(0.5, step=100), importance="movement")
    train(model, pruner, optimizers(model), lambda optimizer: pruner.accumulate(), batches=2)
    # The discriminator's targets also took the generator steps' gradients: every step counts.
    steps = {**dict.fromkeys(GENERATOR, 2), **dict.fromkeys(DISCRIMINATOR, 4)}
    assert pruner.importance.steps() == steps  # type: ignore[attr-defined]


def test_lean_masks_attach_the_generator_alone_when_only_it_is_pruned():
    model = gan()
    pruner = Pruner(model, OneShotSchedule(0.5, step=0), masking="inplace", include=[r"^g\."])
    generator, discriminator = optimizers(model)
    holding = [o for o in (generator, discriminator) if pruner.held_by(o)]
    assert holding == [generator]
    pruner.attach(*holding)
    pruner.step(0)
    for _ in range(3):
        model.zero_grad()
        (-model["d"](model["g"](torch.randn(5, 4))).mean()).backward()
        generator.step()
        discriminator.step()
    for name in GENERATOR:
        module = model.get_submodule(name.removesuffix(".weight"))
        assert int((module.weight[~module.weight_mask] != 0).sum()) == 0
    assert pruner.sparsity() == 0.5
