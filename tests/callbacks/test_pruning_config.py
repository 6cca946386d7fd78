"""GradualPruning's configuration: errors that name the argument, and LightningCLI YAML."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks import GradualPruning
from tests.callbacks.lit_helpers import (
    CLI_TRAINER,
    LIGHTNING_SETS,
    TinyModule,
    lightning_cli,
    masks_of,
)
from tests.model_state import unchanged

SCHEDULE = LinearSchedule(0.5, end_step=4)


def error_of(build: Callable[[], object]) -> tuple[type[Exception], str]:
    with pytest.raises((TypeError, ValueError)) as raised:
        build()
    return type(raised.value), str(raised.value)


# Every pruning argument of the callback, with a bad value: (argument, value).
BAD_ARGUMENTS = [
    ("schedule", "cubic"),
    ("method", "ln_structured"),
    ("method", "magnitude"),
    ("parameters", []),
    ("module_types", [3]),
    ("names", ["1x"]),
    ("include", ["("]),
    ("exclude", ["["]),
    ("keep_dense", ["middle"]),
    ("scope", "local"),
    ("min_density", 1.0),
    ("min_density", "0.1"),
    ("rewind", "best"),
    ("rewind_step", -1),
    ("rewind_step", 1.5),
    ("seed", -1),
    ("seed", "7"),
    ("masking", "lean"),
    ("importance", "l3"),
    ("accumulator_dtype", "float16"),
    ("structure", "block"),
    ("multiple_of", 0),
]


@pytest.mark.parametrize(
    ("name", "value"), BAD_ARGUMENTS, ids=[f"{n}={v!r}" for n, v in BAD_ARGUMENTS]
)
def test_a_bad_argument_fails_with_the_pruners_message(name, value):
    kwargs = {"schedule": SCHEDULE, name: value}
    callback = error_of(lambda: GradualPruning(**kwargs))
    pruner = error_of(lambda: Pruner(TinyModule(), **kwargs))
    assert callback == pruner
    assert f"`{name}`" in callback[1]


def test_parameters_with_a_filter_fail_with_the_pruners_message():
    kwargs = {"schedule": SCHEDULE, "parameters": ["net.0.weight"], "include": ["net"]}
    message = error_of(lambda: GradualPruning(**kwargs))
    assert message == error_of(lambda: Pruner(TinyModule(), **kwargs))
    assert message[1].startswith("Expected either `parameters` or the selection filters")


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
    check = unchanged(model, ignoring=LIGHTNING_SETS)
    trainer = make_trainer(callbacks=[GradualPruning(SCHEDULE, **kwargs)], logger=False)

    with pytest.raises(ValueError, match=match):
        trainer.fit(model)

    check()


CONFIG = (
    CLI_TRAINER.format(max_steps=4)
    + """        schedule:
          class_path: tensorplay.ao.pruning.pruner.schedules.LinearSchedule
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
)


# pytest's own command line is in sys.argv; `args=` is what LightningCLI parses.
@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_lightning_cli_builds_the_callback_from_yaml(tmp_path):
    cli = lightning_cli(tmp_path, CONFIG)

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


STRUCTURED = CONFIG.replace(
    "        method: tensorplay.ao.pruning.RandomUnstructured\n", "        structure: channel\n"
).replace("        exclude: ['^net\\.2\\.']\n        min_density: 0.1\n", "")


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_lightning_cli_prunes_channels_from_yaml(tmp_path):
    cli = lightning_cli(tmp_path, STRUCTURED)
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, GradualPruning))
    assert callback.config.structure == "channel"

    cli.trainer.fit(cli.model)

    # The hidden layer's 16 channels: 8 pruned in its weight rows, its bias and the next
    # layer's input columns.
    masks = masks_of(cli.model)
    assert sorted(masks) == ["net.0.bias_mask", "net.0.weight_mask", "net.2.weight_mask"]
    pruned = masks["net.0.bias_mask"] == 0
    assert int(pruned.sum()) == 8
    assert torch.equal(masks["net.0.weight_mask"].sum(dim=1) == 0, pruned)
    assert torch.equal(masks["net.2.weight_mask"].sum(dim=0) == 0, pruned)


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_lightning_cli_rejects_a_bad_schedule_naming_the_argument(tmp_path, capsys):
    # jsonargparse exits (SystemExit, message on stderr) or raises, depending on its settings.
    with pytest.raises((ValueError, SystemExit)) as raised:
        lightning_cli(tmp_path, CONFIG.replace("final_sparsity: 0.5", "final_sparsity: 1.5"))

    message = str(raised.value) + capsys.readouterr().err
    assert "Expected `final_sparsity` to be a float in [0, 1), but got 1.5." in message
