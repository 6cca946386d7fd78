"""docs/migration_lightning.rst, line by line: every code block runs, and what it claims holds.

The blocks are read from the .rst itself, so the page cannot drift from what is tested: a new
block fails `test_the_page_has_the_blocks_these_tests_know` until it is tested here.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback, ModelPruning
from lightning.pytorch.cli import LightningCLI
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from tensorplay.ao.pruning.targets.parameters import select_parameters
from tensorplay.callbacks import GradualPruning
from tests.callbacks.lit_helpers import TinyModule, masks_of
from tests.docs.code_blocks import code_blocks as page_code_blocks

PAGE = Path(__file__).resolve().parents[2] / "docs" / "migration_lightning.rst"


def code_blocks(path: Path = PAGE) -> list[tuple[str, str]]:
    """``(language, code)`` of every ``.. code-block::`` directive of ``path``, in page order."""
    return page_code_blocks(path)


def run_block(index: int) -> dict[str, Any]:
    language, code = code_blocks()[index]
    assert language == "python"
    namespace: dict[str, Any] = {}
    exec(compile(code, f"{PAGE.name}[{index}]", "exec"), namespace)
    return namespace


def test_the_page_has_the_blocks_these_tests_know():
    assert [language for language, _ in code_blocks()] == ["python", "yaml", "python", "python"]


# -- the table's claims about ModelPruning -------------------------------------------------------


def test_model_pruning_defaults_are_as_the_table_says():
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(ModelPruning).parameters.items()
    }
    assert defaults["parameter_names"] is None
    assert ModelPruning.PARAMETER_NAMES == ("weight", "bias")
    assert defaults["use_global_unstructured"] is True
    assert defaults["amount"] == 0.5
    assert defaults["make_pruning_permanent"] is True
    assert defaults["use_lottery_ticket_hypothesis"] is True
    assert defaults["resample_parameters"] is False
    assert defaults["prune_on_train_epoch_end"] is True
    assert defaults["verbose"] == 0


# -- "Which tensors are pruned" -----------------------------------------------------------------


class Mine(nn.Module):
    """A module of one's own with a ``weight`` and another matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.other = nn.Parameter(torch.randn(4, 4))


class Zoo(pl.LightningModule):
    """One of every kind of layer the page names."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.convs = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.LayerNorm(4)])
        self.attention = nn.MultiheadAttention(4, 2)
        self.lstm = nn.LSTM(4, 4)
        self.mine = Mine()
        self.head = nn.Linear(4, 10)


def _pairs(pairs) -> set[tuple[int, str]]:
    return {(id(module), name) for module, name in pairs}


def test_model_pruning_default_selection_is_weight_and_bias_of_every_non_container():
    model = Zoo()
    theirs = ModelPruning.sanitize_parameters_to_prune(model, (), ("weight", "bias"))
    expected = [
        (model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2])
        for name in (
            "embed.weight",
            "convs.0.weight",
            "convs.1.weight",
            "blocks.0.weight",
            "blocks.1.weight",
            "attention.out_proj.weight",
            "mine.weight",
            "head.weight",
            "convs.0.bias",
            "convs.1.bias",
            "blocks.0.bias",
            "blocks.1.bias",
            "attention.out_proj.bias",
            "head.bias",
        )
    ]
    # All the weights first, then all the biases; no in_proj_weight, no LSTM weight_ih_l0.
    assert [(id(m), n) for m, n in theirs] == [(id(m), n) for m, n in expected]


@pytest.mark.filterwarnings("ignore::tensorplay.ao.pruning.targets.SelectionWarning")
def test_the_same_selection_with_gradual_pruning(make_trainer):
    callback = run_block(0)["callback"]
    assert (callback.config.module_types, callback.config.names) == (
        ["torch.nn.Module"],
        ["weight", "bias"],
    )
    model = Zoo()
    theirs = ModelPruning.sanitize_parameters_to_prune(model, (), ("weight", "bias"))

    callback.setup(make_trainer(callbacks=[callback], logger=False), model, "fit")

    assert len(callback.pruner.pairs) == len(theirs) == 14
    assert _pairs(callback.pruner.pairs) == _pairs(theirs)


@pytest.mark.filterwarnings("ignore::tensorplay.ao.pruning.targets.SelectionWarning")
def test_gradual_pruning_default_selection_is_what_the_page_says():
    assert select_parameters(Zoo()) == [
        "convs.0.weight",
        "blocks.0.weight",
        "attention.in_proj_weight",
        "attention.out_proj.weight",
        "head.weight",
    ]


class Deeper(TinyModule):
    """:class:`TinyModule` with three layers, so that `first` and `last` leave one in between."""

    def __init__(self, seed: int = 0, lr: float = 0.1, samples: int = 64) -> None:
        super().__init__(seed, lr, samples)
        self.net = nn.Sequential(
            nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)
        )


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_keep_dense_yaml(tmp_path: Path):
    language, block = code_blocks()[1]
    assert language == "yaml"
    config = yaml.safe_load(block)
    config["trainer"].update(
        accelerator="cpu",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    config["seed_everything"] = 0
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningCLI(Deeper, args=["--config", str(path)], run=False, save_config_callback=None)
    [callback] = [c for c in cli.trainer.callbacks if isinstance(c, GradualPruning)]
    assert callback.config.keep_dense == ["embeddings", "first", "last"]

    cli.trainer.fit(cli.model)

    assert callback.pruner.targets == ["net.2.weight", "net.2.bias"]
    assert sorted(masks_of(cli.model)) == ["net.2.bias_mask", "net.2.weight_mask"]


# -- "Example" -----------------------------------------------------------------------------------


class Epochs(TinyModule):
    """160 samples: 20 optimizer steps per epoch, as in the page's example."""

    def __init__(self) -> None:
        super().__init__(seed=5, lr=0.05, samples=160)

    def train_dataloader(self) -> DataLoader[tuple[Tensor, ...]]:
        generator = torch.Generator().manual_seed(99)
        x = torch.randn(160, 8, generator=generator)
        y = torch.randint(0, 4, (160,), generator=generator)
        return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=False)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)


def _effective(model: nn.Module) -> dict[str, Tensor]:
    return {name: model.get_submodule(name).weight.detach().clone() for name in ("net.0", "net.2")}


class Refresh(Callback):
    """Recompute every pruned ``module.weight`` from ``_orig`` and ``_mask`` at epoch end.

    Placed before ``ModelPruning``: torch's ``global_unstructured`` ranks that attribute, which
    the pruning hook last computed before the epoch's last optimizer step.
    """

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for module in pl_module.modules():
            for name in ("weight", "bias"):
                if hasattr(module, f"{name}_mask"):
                    orig, mask = getattr(module, f"{name}_orig"), getattr(module, f"{name}_mask")
                    setattr(module, name, orig * mask)


@pytest.mark.slow
def test_before_and_after_prune_the_same_units_to_the_same_weights(make_trainer):
    namespace = run_block(2)
    before, after = namespace["before"], namespace["after"]
    assert isinstance(before, ModelPruning) and isinstance(after, GradualPruning)
    assert (after.config.module_types, after.config.names) == (
        ["torch.nn.Module"],
        ["weight", "bias"],
    )
    after.verbose = False
    theirs, ours = Epochs(), Epochs()
    make_trainer(callbacks=[Refresh(), before], max_epochs=3, logger=False).fit(theirs)
    make_trainer(callbacks=[after], max_epochs=3, logger=False).fit(ours)

    # ModelPruning made its pruning permanent at the end; GradualPruning keeps the masks.
    assert not masks_of(theirs)
    masks = masks_of(ours)
    assert sorted(masks) == [f"net.{i}.{n}_mask" for i in (0, 2) for n in ("bias", "weight")]
    total = 16 * 8 + 16 + 4 * 16 + 4
    # 20%, 36%, 48.8% of the 212 units after epochs 1, 2 and 3: round(0.488 * 212) = 103.
    assert sum(int((mask == 0).sum()) for mask in masks.values()) == 103 == round(0.488 * total)
    for key in ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"):
        module_name, _, name = key.rpartition(".")
        theirs_value = getattr(theirs.get_submodule(module_name), name).detach()
        ours_value = getattr(ours.get_submodule(module_name), name).detach()
        assert torch.equal(theirs_value == 0, masks[f"{key}_mask"] == 0), key
        assert torch.equal(theirs_value, ours_value), key


class EpochMasks(Callback):
    """Record the masks at every epoch end (placed after the pruning callback)."""

    def __init__(self) -> None:
        self.masks: list[dict[str, Tensor]] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.masks.append(masks_of(pl_module))


@pytest.mark.slow
def test_without_the_refresh_model_pruning_ranks_stale_weights_from_the_second_event(
    make_trainer,
):
    after = run_block(2)["after"]
    after.verbose = False
    before = ModelPruning(
        "l1_unstructured",
        amount=0.2,
        use_lottery_ticket_hypothesis=False,
        make_pruning_permanent=False,
    )
    recorded = {}
    for name, callback in (("before", before), ("after", after)):
        recorder = EpochMasks()
        make_trainer(callbacks=[callback, recorder], max_epochs=2, logger=False).fit(Epochs())
        recorded[name] = recorder.masks

    assert len(recorded["before"]) == len(recorded["after"]) == 2
    same = [
        sorted(theirs) == sorted(ours) and all(torch.equal(theirs[k], ours[k]) for k in ours)
        for theirs, ours in zip(recorded["before"], recorded["after"], strict=True)
    ]
    assert same == [True, False]


class InitRecorder(Callback):
    """Record after each epoch's pruning whether ``net.0``'s kept weights are the initial ones."""

    def __init__(self, init: Tensor) -> None:
        self.init = init
        self.at_init: list[bool] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        layer = pl_module.net[0]
        kept = layer.weight_mask.bool()
        self.at_init.append(torch.equal(layer.weight_orig.detach()[kept], self.init[kept]))


@pytest.mark.slow
def test_model_pruning_rewinds_to_init_only_at_the_first_event(make_trainer):
    schedule = run_block(2)["after"].config.schedule
    runs = {
        "model_pruning": ModelPruning("l1_unstructured", amount=0.2, make_pruning_permanent=False),
        "gradual_pruning": GradualPruning(schedule, rewind="init", verbose=False),
    }
    seen = {}
    for name, callback in runs.items():
        model = Epochs()
        recorder = InitRecorder(model.net[0].weight.detach().clone())
        # The recorder runs after the pruning callback's epoch-end hook (list order).
        make_trainer(callbacks=[callback, recorder], max_epochs=3, logger=False).fit(model)
        seen[name] = recorder.at_init

    assert seen == {"model_pruning": [True, False, False], "gradual_pruning": [True, True, True]}


def test_filter_parameters_to_prune_becomes_exclude():
    callback = run_block(3)["callback"]
    model = nn.ModuleDict({"features": nn.Linear(4, 4), "classifier": nn.Linear(4, 2)})
    assert select_parameters(model, exclude=callback.config.exclude) == ["features.weight"]
