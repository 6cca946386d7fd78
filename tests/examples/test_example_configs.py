"""Every YAML config in ``examples/configs/`` parses, trains, tests and reports."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from sweep import scaled_config
from train import main

from tensorplay.ao.pruning.masking.stats import sparsity_report
from tensorplay.report import load_state_dict, state_dict_report

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "examples/configs").glob("*.yaml"))
NAMES = [path.stem for path in CONFIGS]
# Units of the three weight tensors of the 64-256-256-10 MLP.
NUMELS = {"net.fc1.weight": 64 * 256, "net.fc2.weight": 256 * 256, "net.fc3.weight": 256 * 10}
TOTAL = sum(NUMELS.values())

pytestmark = pytest.mark.filterwarnings(
    "ignore:LightningCLI's args parameter", "ignore:.*does not have many workers"
)


def test_the_configs_are_the_documented_ones() -> None:
    assert NAMES == ["dense", "gradual", "layerwise", "lottery", "oneshot"]


@pytest.mark.parametrize("config", CONFIGS, ids=NAMES)
def test_config_runs_from_the_command_line(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(
        [
            "fit",
            f"--config={config}",
            "--trainer.max_steps=3",
            "--trainer.limit_val_batches=1",
            "--trainer.log_every_n_steps=1",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
        ]
    )

    run_dir = tmp_path / config.stem / "version_0"
    [checkpoint] = (run_dir / "checkpoints").glob("*.ckpt")
    out = capsys.readouterr().out
    assert "test accuracy   " in out
    assert f"checkpoint      {checkpoint}" in out
    for name in ("config.yaml", "metrics.csv", "layers.png"):
        assert (run_dir / name).is_file(), name
    # The pruning configs log the sparsity curve from step 0 (nothing pruned this early).
    assert (run_dir / "sparsity.png").is_file() == (config.stem != "dense")
    with open(run_dir / "metrics.csv", newline="") as file:
        assert any(row["test/acc"] for row in csv.DictReader(file))
    # The saved checkpoint is readable by the report command and holds the same tensors.
    assert [row.name for row in state_dict_report(load_state_dict(checkpoint)).rows] == list(NUMELS)


def _fit(config: dict[str, object]) -> torch.nn.Module:
    cli = main(config, run=False, save_config_callback=None)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.model


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("gradual", {"total": round(0.9 * TOTAL)}, id="gradual-global"),
        pytest.param("oneshot", {"total": round(0.9 * TOTAL)}, id="oneshot"),
        pytest.param(
            "layerwise", {name: round(0.9 * n) for name, n in NUMELS.items()}, id="layerwise"
        ),
        pytest.param("lottery", {"total": round((1 - 0.8**5) * TOTAL)}, id="lottery-5-rounds"),
    ],
)
def test_config_shortened_to_one_epoch_reaches_its_sparsity_exactly(
    name: str, expected: dict[str, int]
) -> None:
    model = _fit(scaled_config(name, epochs=1, seed=0))

    report = sparsity_report(model)
    assert [row.name for row in report.rows] == list(NUMELS)
    if "total" in expected:
        assert report.pruned == expected["total"]
    else:
        assert {row.name: row.pruned for row in report.rows} == expected
