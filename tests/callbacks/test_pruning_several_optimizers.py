"""A GAN under Lightning's manual optimization, pruning its generator alone: two optimizer steps
per batch (``global_step`` moves by 2), exact counts on the pruning steps the counter passes,
lean masks on the generator's optimizer alone, and gradient scores accumulated once per step of
the optimizer that holds each target, from the gradients it steps with."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule, Schedule
from tensorplay.callbacks import GradualPruning

GENERATOR = ["g.0.weight", "g.2.weight"]
BATCHES = 8


class TinyGAN(pl.LightningModule):
    """A generator and a discriminator, one step of each per batch (manual optimization); the
    generator's loss reaches the discriminator's weights too. Records, as the oracle, ``-sum w*g``
    of each generator weight from the gradients its optimizer steps with."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.g = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6))
            self.d = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        self.expected: dict[str, Tensor] = {}

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        noise, real = batch
        generator, discriminator = self.optimizers()  # type: ignore[misc]
        generator.zero_grad()
        self.manual_backward(-self.d(self.g(noise)).mean())
        self._record()
        generator.step()
        discriminator.zero_grad()
        fake = self.g(noise).detach()
        self.manual_backward(self.d(fake).mean() - self.d(real).mean())
        discriminator.step()

    def _record(self) -> None:
        for name in GENERATOR:
            module = self.get_submodule(name.removesuffix(".weight"))
            param = getattr(module, "weight_orig", module.weight)
            term = -(param.detach() * param.grad)
            self.expected[name] = self.expected.get(name, torch.zeros_like(term)) + term

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.SGD(self.g.parameters(), lr=0.05, momentum=0.9),
            torch.optim.Adam(self.d.parameters(), lr=0.01),
        ]

    def train_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        data = torch.Generator().manual_seed(1)
        noise, real = torch.randn(5 * BATCHES, 4, generator=data), torch.randn(5 * BATCHES, 6)
        return DataLoader(TensorDataset(noise, real), batch_size=5)


class Counts(pl.Callback):
    """The generator's pruned units after each batch, by ``global_step``."""

    def __init__(self) -> None:
        self.pruned: dict[int, int] = {}

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object
    ) -> None:
        masks = [pl_module.get_submodule(n.removesuffix(".weight")).weight_mask for n in GENERATOR]
        self.pruned[trainer.global_step] = sum(int((mask == 0).sum()) for mask in masks)


TOTAL = 4 * 8 + 8 * 6  # the generator's two weights


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
@pytest.mark.parametrize(
    ("schedule", "steps"),
    [
        pytest.param(OneShotSchedule(0.5, step=5), [6], id="one-shot-at-an-odd-step"),
        pytest.param(LinearSchedule(0.6, end_step=10, frequency=5), [6, 10], id="linear-every-5"),
    ],
)
def test_a_gan_prunes_its_generator_exactly_on_the_steps_the_counter_passes(
    make_trainer, masking: str, schedule: Schedule, steps: list[int]
) -> None:
    pruning = GradualPruning(
        schedule,
        include=[r"^g\."],
        masking=masking,
        verbose=False,  # type: ignore[arg-type]
    )
    counts = Counts()
    trainer = make_trainer(callbacks=[pruning, counts], logger=False)
    model = TinyGAN()
    trainer.fit(model)

    assert pruning.pruner.targets == GENERATOR
    assert list(counts.pruned) == list(range(2, 2 * BATCHES + 1, 2))  # two optimizer steps a batch
    final = round(schedule(2 * BATCHES) * TOTAL)
    assert [step for step, _, _ in pruning.pruner.history] == steps
    assert pruning.pruner.pruned_count() == final == counts.pruned[2 * BATCHES]
    for step, pruned in counts.pruned.items():
        assert pruned == (round(schedule(step) * TOTAL) if step >= steps[0] else 0), step
    if masking == "inplace":  # the generator's weights are plain tensors, zero where pruned
        for name in GENERATOR:
            module = model.get_submodule(name.removesuffix(".weight"))
            assert int((module.weight[~module.weight_mask] != 0).sum()) == 0
        assert not any(
            name.startswith("d.") and name.endswith("_mask") for name, _ in model.named_buffers()
        )


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_movement_accumulates_each_generator_target_once_per_generator_step(
    make_trainer, masking: str
) -> None:
    pruning = GradualPruning(
        OneShotSchedule(0.5, step=100), include=[r"^g\."], masking=masking,  # type: ignore[arg-type]
        importance="movement", verbose=False,
    )  # fmt: skip
    trainer = make_trainer(callbacks=[pruning], logger=False)
    model = TinyGAN()
    trainer.fit(model)

    assert pruning.pruner.importance.steps() == dict.fromkeys(GENERATOR, BATCHES)  # type: ignore[attr-defined]
    totals = pruning.pruner.importance.totals()  # type: ignore[attr-defined]
    assert sorted(totals) == sorted(model.expected) == GENERATOR
    for name in GENERATOR:
        # The same multiply-subtract in the same order in this process: equal to rounding.
        torch.testing.assert_close(totals[name], model.expected[name], rtol=1e-6, atol=1e-7)
