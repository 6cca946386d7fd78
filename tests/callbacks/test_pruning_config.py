"""GradualPruning's configuration: errors that name the argument, and LightningCLI YAML."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning.pytorch.cli import LightningCLI

from tensorplay.ao.pruning.schedules import CubicSchedule, LinearSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.lit_helpers import TinyModule, masks_of

SCHEDULE = LinearSchedule(0.5, end_step=4)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        pytest.param(
            lambda: CubicSchedule(1.0, end_step=10),
            ValueError,
            "`final_sparsity`",
            id="final-sparsity-one",
        ),
        pytest.param(
            lambda: CubicSchedule(-0.1, end_step=10),
            ValueError,
            "`final_sparsity`",
            id="final-sparsity-negative",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=2, start_step=5),
            ValueError,
            "`end_step`",
            id="end-before-start",
        ),
        pytest.param(
            lambda: CubicSchedule(0.5, end_step=10, frequency=0),
            ValueError,
            "`frequency`",
            id="frequency-zero",
        ),
        pytest.param(lambda: GradualPruning("cubic"), TypeError, "`schedule`", id="schedule-str"),
        pytest.param(
            lambda: GradualPruning(SCHEDULE, method="ln_structured"),
            ValueError,
            "`method` to be an unstructured",
            id="structured-method",
        ),
        pytest.param(
            lambda: GradualPruning(SCHEDULE, method="magnitude"),
            ValueError,
            "`method` to be one of",
            id="unknown-method",
        ),
        pytest.param(
            lambda: GradualPruning(SCHEDULE, scope="local"), ValueError, "`scope`", id="scope"
        ),
        pytest.param(
            lambda: GradualPruning(SCHEDULE, min_density=1.0),
            ValueError,
            "`min_density`",
            id="min-density",
        ),
        pytest.param(
            lambda: GradualPruning(SCHEDULE, rewind="best"), ValueError, "`rewind`", id="rewind"
        ),
        pytest.param(
            lambda: GradualPruning(SCHEDULE, rewind="step", rewind_step=-1),
            ValueError,
            "`rewind_step`",
            id="rewind-step",
        ),
        pytest.param(lambda: GradualPruning(SCHEDULE, seed=-1), ValueError, "`seed`", id="seed"),
        pytest.param(
            lambda: GradualPruning(SCHEDULE, parameters=[]),
            ValueError,
            "`parameters`",
            id="parameters-empty",
        ),
        pytest.param(
            lambda: GradualPruning(SCHEDULE, parameters=["net.0.weight"], include=["net"]),
            ValueError,
            "`parameters`",
            id="parameters-and-include",
        ),
    ],
)
def test_bad_configuration_fails_at_construction(build, error, match):
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"include": [r"^encoder\."]}, "include=", id="include-matches-nothing"),
        pytest.param({"module_types": ["Conv2d"]}, "none matched", id="no-module-of-type"),
        pytest.param({"parameters": ["net.1.weight"]}, "'net.1.weight'", id="unknown-parameter"),
    ],
)
def test_bad_selection_fails_at_setup_and_leaves_the_model(make_trainer, kwargs, match):
    model = TinyModule()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    trainer = make_trainer(callbacks=[GradualPruning(SCHEDULE, **kwargs)], logger=False)

    with pytest.raises(ValueError, match=match):
        trainer.fit(model)

    after = model.state_dict()
    assert sorted(after) == sorted(before)
    assert all(after[name].equal(value) for name, value in before.items())


CONFIG = """
trainer:
  accelerator: cpu
  max_steps: 4
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
  callbacks:
    - class_path: tensorplay.callbacks.GradualPruning
      init_args:
        schedule:
          class_path: tensorplay.ao.pruning.schedules.LinearSchedule
          init_args:
            final_sparsity: 0.5
            end_step: 4
        method: tensorplay.ao.pruning.RandomUnstructured
        module_types: [torch.nn.Linear]
        exclude: ['^net\\.2\\.']
        min_density: 0.1
        seed: 7
        verbose: false
model:
  seed: 3
seed_everything: 0
"""


def _cli(tmp_path: Path, config: str) -> LightningCLI:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    return LightningCLI(
        TinyModule,
        args=["--config", str(path), f"--trainer.default_root_dir={tmp_path}"],
        run=False,
        save_config_callback=None,
    )


# pytest's own command line is in sys.argv; `args=` is what LightningCLI parses.
@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_lightning_cli_builds_the_callback_from_yaml(tmp_path):
    cli = _cli(tmp_path, CONFIG)

    callbacks = [c for c in cli.trainer.callbacks if isinstance(c, GradualPruning)]
    assert len(callbacks) == 1
    callback = callbacks[0]
    config = callback.config
    assert config.schedule == LinearSchedule(final_sparsity=0.5, end_step=4)
    assert (config.method, config.module_types, config.exclude) == (
        "tensorplay.ao.pruning.RandomUnstructured",
        ["torch.nn.Linear"],
        [r"^net\.2\."],
    )
    assert (config.min_density, config.seed, callback.verbose) == (0.1, 7, False)

    cli.trainer.fit(cli.model)

    assert sorted(masks_of(cli.model)) == ["net.0.weight_mask"]
    assert int((masks_of(cli.model)["net.0.weight_mask"] == 0).sum()) == 64
    assert callback.pruner.targets == ["net.0.weight"]


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_lightning_cli_rejects_a_bad_schedule_naming_the_argument(tmp_path, capsys):
    # jsonargparse exits (SystemExit, message on stderr) or raises, depending on its settings.
    with pytest.raises((ValueError, SystemExit)) as raised:
        _cli(tmp_path, CONFIG.replace("final_sparsity: 0.5", "final_sparsity: 1.5"))

    message = str(raised.value) + capsys.readouterr().err
    assert "Expected `final_sparsity` to be a float in [0, 1), but got 1.5." in message
