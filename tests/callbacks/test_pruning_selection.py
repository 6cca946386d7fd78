"""GradualPruning's selection: `names` and `keep_dense` (in Python and YAML), the core's checks,
and several callbacks on one model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.cli import LightningCLI
from torch import nn

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tensorplay.ao.pruning.targets.parameters import select_parameters
from tensorplay.callbacks import GradualPruning
from tests.callbacks.lit_helpers import CLI_TRAINER, TinyModule, lightning_cli, masks_of
from tests.callbacks.test_migration_guide import code_blocks

SCHEDULE = LinearSchedule(0.5, end_step=4)


class TiedModule(TinyModule):
    """:class:`TinyModule` plus two 16 x 16 layers that share one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(16, 16)
        self.second = nn.Linear(16, 16)
        self.second.weight = self.first.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.net[0](x))
        return self.net[2](self.second(self.first(hidden)))  # type: ignore[no-any-return]


def _error(call) -> tuple[type[Exception], str]:
    try:
        call()
    except (TypeError, ValueError) as error:
        return type(error), str(error)
    raise AssertionError("expected an error")


# -- arguments -----------------------------------------------------------------------------------


# The core's tests pin each message (tests/core/test_selection_real_models.py); here the
# callback must raise the very same error at construction.
@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"keep_dense": ["head"]}, id="keep-dense-unknown"),
        pytest.param({"names": []}, id="names-empty"),
        pytest.param({"names": ["net.0.weight"]}, id="names-qualified"),
        pytest.param({"include": ["("]}, id="regex"),
        pytest.param({"module_types": ["no_such_pkg.Linear"]}, id="module-type-path"),
        pytest.param({"parameters": ["net.0.weight"], "names": ["weight"]}, id="parameters-names"),
        pytest.param({"parameters": ["net.0.weight"], "keep_dense": ["last"]}, id="keep-dense"),
        pytest.param({"parameters": ["net.0.weight"], "include": ["net"]}, id="exclusive"),
    ],
)
def test_bad_selection_fails_at_construction_with_the_cores_error(kwargs):
    core = _error(lambda: Pruner(TinyModule(), SCHEDULE, **kwargs))
    assert _error(lambda: GradualPruning(SCHEDULE, **kwargs)) == core


def test_names_and_keep_dense_select_through_the_pruner(make_trainer):
    model = TinyModule()
    callback = GradualPruning(
        OneShotSchedule(0.5), names=["weight", "bias"], keep_dense=["last"], verbose=False
    )
    make_trainer(callbacks=[callback], max_steps=1, logger=False).fit(model)

    assert callback.pruner.targets == ["net.0.weight", "net.0.bias"]
    assert sorted(masks_of(model)) == ["net.0.bias_mask", "net.0.weight_mask"]
    assert callback.pruner.pruned_count() == (16 * 8 + 16) // 2


def test_state_key_is_unchanged_unless_names_or_keep_dense_are_set():
    plain = GradualPruning(SCHEDULE)
    assert "names" not in plain.state_key and "keep_dense" not in plain.state_key
    named = GradualPruning(SCHEDULE, names=["weight"])
    dense = GradualPruning(SCHEDULE, keep_dense=["first"])
    assert len({plain.state_key, named.state_key, dense.state_key}) == 3


# -- several callbacks ---------------------------------------------------------------------------


def test_two_callbacks_on_disjoint_tensors_both_prune(make_trainer):
    model = TinyModule()
    first = GradualPruning(OneShotSchedule(0.5), parameters=["net.0.weight"], verbose=False)
    second = GradualPruning(OneShotSchedule(0.25), exclude=["^net\\.0\\."], verbose=False)
    make_trainer(callbacks=[first, second], max_steps=1, logger=False).fit(model)

    masks = masks_of(model)
    assert sorted(masks) == ["net.0.weight_mask", "net.2.weight_mask"]
    assert int((masks["net.0.weight_mask"] == 0).sum()) == 64
    assert int((masks["net.2.weight_mask"] == 0).sum()) == 16


def test_two_callbacks_on_one_tensor_fail_at_setup(make_trainer):
    first = GradualPruning(SCHEDULE, verbose=False)
    second = GradualPruning(OneShotSchedule(0.9), include=["^net\\.2\\."], verbose=False)
    trainer = make_trainer(callbacks=[first, second], logger=False)

    with pytest.raises(
        ValueError,
        match=r"Expected GradualPruning callbacks to prune disjoint tensors, but "
        r"trainer.callbacks\[1\] and trainer.callbacks\[0\] both select \['net.2.weight'\]\.",
    ):
        trainer.fit(TinyModule())


def test_two_callbacks_on_aliases_of_one_tied_tensor_fail_at_setup(make_trainer):
    model = TiedModule()
    first = GradualPruning(SCHEDULE, parameters=["first.weight"], verbose=False)
    second = GradualPruning(SCHEDULE, parameters=["second.weight"], verbose=False)
    trainer = make_trainer(callbacks=[first, second], logger=False)

    with pytest.raises(
        ValueError,
        match=r"trainer.callbacks\[1\] and trainer.callbacks\[0\] both select "
        r"\['first.weight = second.weight'\]",
    ):
        trainer.fit(model)


# -- YAML --------------------------------------------------------------------------------------

CONFIG = (
    CLI_TRAINER.format(max_steps=1)
    + """        schedule:
          class_path: tensorplay.ao.pruning.pruner.schedules.OneShotSchedule
          init_args: {sparsity: 0.5}
        names: [weight, bias]
        keep_dense: [embeddings, first]
        verbose: false
seed_everything: 0
"""
)


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_names_and_keep_dense_from_yaml(tmp_path: Path):
    cli = lightning_cli(tmp_path, CONFIG)
    [callback] = [c for c in cli.trainer.callbacks if isinstance(c, GradualPruning)]
    assert (callback.config.names, callback.config.keep_dense) == (
        ["weight", "bias"],
        ["embeddings", "first"],
    )

    cli.trainer.fit(cli.model)

    expected = select_parameters(
        TinyModule(), names=["weight", "bias"], keep_dense=["embeddings", "first"]
    )
    assert callback.pruner.targets == expected == ["net.2.weight", "net.2.bias"]
    assert sorted(masks_of(cli.model)) == ["net.2.bias_mask", "net.2.weight_mask"]


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_yaml_rejects_an_unknown_keep_dense_entry(tmp_path: Path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.replace("[embeddings, first]", "[embeddings, head]"))
    with pytest.raises((ValueError, SystemExit)) as raised:
        LightningCLI(
            TinyModule,
            args=["--config", str(path), f"--trainer.default_root_dir={tmp_path}"],
            run=False,
            save_config_callback=None,
        )
    message = str(raised.value) + capsys.readouterr().err
    assert "head" in message and "keep_dense" in message


class Encoded(TinyModule):
    """An ``encoder`` and a ``head``, as in docs/callback.rst's two-callback config."""

    def __init__(self, seed: int = 0, lr: float = 0.1, samples: int = 64) -> None:
        super().__init__(seed, lr, samples)
        del self.net
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))  # type: ignore[no-any-return]


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_two_callbacks_config_from_the_callback_page(tmp_path: Path):
    page = Path(__file__).resolve().parents[2] / "docs" / "callback.rst"
    [block] = [code for language, code in code_blocks(page) if "OneShotSchedule" in code]
    config = {
        "trainer": {
            **yaml.safe_load(block),
            "accelerator": "cpu",
            "max_steps": 1,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(tmp_path),
        },
        "seed_everything": 0,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningCLI(Encoded, args=["--config", str(path)], run=False, save_config_callback=None)

    cli.trainer.fit(cli.model)

    masks = masks_of(cli.model)
    assert sorted(masks) == ["encoder.0.weight_mask", "head.weight_mask"]
    assert int((masks["encoder.0.weight_mask"] == 0).sum()) == 64  # 50% of 16 x 8
    assert int((masks["head.weight_mask"] == 0).sum()) == 58  # round(90% of 4 x 16)
