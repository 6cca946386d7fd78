"""``examples/sweep.py``: the configs it derives, the table it writes, and a tiny real sweep."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from sweep import DENSE, main_sweep, scaled_config, summarize, write_markdown, write_rst


def _schedule(config: dict[str, object]) -> object:
    return config["trainer"]["callbacks"][0]["init_args"]["schedule"]["init_args"]  # type: ignore[index]


def test_scaled_config_halves_the_gradual_schedule_and_sets_the_sparsity() -> None:
    config = scaled_config("gradual", epochs=30, seed=2, sparsity=0.8)

    assert config["seed_everything"] == 2
    assert config["trainer"]["max_epochs"] == 30
    assert config["trainer"]["logger"] is False
    assert _schedule(config) == {
        "final_sparsity": 0.8,
        "start_step": 100,
        "end_step": 400,
        "frequency": 10,
    }


def test_scaled_config_of_one_shot_and_lottery() -> None:
    assert _schedule(scaled_config("oneshot", epochs=6, seed=0, sparsity=0.5)) == {
        "sparsity": 0.5,
        "step": 60,
    }
    # Intervals never drop below one step.
    assert _schedule(scaled_config("lottery", epochs=1, seed=0)) == {
        "rate": 0.2,
        "every": 3,
        "start_step": 3,
        "rounds": 5,
    }


def test_dense_config_gets_no_callbacks() -> None:
    config = scaled_config("dense", epochs=2, seed=1, sparsity=0.0)
    assert "callbacks" not in config["trainer"]


ROWS = [
    {"method": DENSE, "target": 0.0, "test_acc": 0.98},
    {"method": DENSE, "target": 0.0, "test_acc": 0.96},
    {"method": "gradual", "target": 0.9, "test_acc": 0.97},
    {"method": "gradual", "target": 0.9, "test_acc": 0.95},
    {"method": "layerwise", "target": 0.9, "test_acc": 0.93},
    {"method": "layerwise", "target": 0.9, "test_acc": 0.95},
]


def test_summary_is_mean_and_sample_std_in_percent() -> None:
    summary = summarize(ROWS)
    assert list(summary) == [DENSE, "gradual", "layerwise"]
    mean, std = summary["gradual"][0.9]
    assert mean == pytest.approx(96.0)
    assert std == pytest.approx(2**0.5)


def test_markdown_table_bolds_the_best_method_and_leaves_missing_cells_empty() -> None:
    table = write_markdown(summarize(ROWS), [0.9], "Caption.")
    assert table.splitlines() == [
        "Caption.",
        "",
        "| sparsity | gradual, global | gradual, layer-wise | one-shot + fine-tune |",
        "|---:|---:|---:|---:|",
        "| 90% | **96.00 ± 1.41** | 94.00 ± 1.41 |  |",
    ]


def test_rst_table_has_one_row_per_sparsity() -> None:
    table = write_rst(summarize(ROWS), [0.9], "Made by `sweep.py`.")
    assert table.splitlines() == [
        "Made by ``sweep.py``.",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "",
        "   * - sparsity",
        "     - gradual, global",
        "     - gradual, layer-wise",
        "     - one-shot + fine-tune",
        "   * - 90%",
        "     - **96.00 ± 1.41**",
        "     - 94.00 ± 1.41",
        "     - ..",
        "",
        ".. image:: /results/sweep.png",
        "   :alt: test accuracy against sparsity",
    ]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_a_tiny_sweep_writes_its_files(tmp_path: Path) -> None:
    flags = ["--sparsities", "0.5", "--seeds", "1", "--epochs", "1", "--out", str(tmp_path)]
    main_sweep([*flags, "--methods", "gradual"])

    with open(tmp_path / "sweep.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [(row["method"], row["target"]) for row in rows] == [
        (DENSE, "0.0"),
        ("gradual", "0.5"),
    ]
    assert float(rows[1]["sparsity"]) == pytest.approx(0.5, abs=1e-5)
    assert (tmp_path / "sweep.md").read_text().splitlines()[-1].startswith("| 50% | **")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "sweep.rst").is_file()


def test_plot_redraws_the_figure_from_the_runs_of_sweep_csv_alone(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    fields = ["method", "target", "seed", "epochs", "sparsity", "test_acc", "seconds"]
    with open(tmp_path / "sweep.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fields)
        writer.writeheader()
        for row in ROWS:
            writer.writerow(
                {**row, "seed": 0, "epochs": 1, "sparsity": row["target"], "seconds": 1}
            )
    main_sweep(["--plot", "--out", str(tmp_path)])

    png = (tmp_path / "sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (1200, 480)
    # Nothing was trained: the folder holds the runs it was given and the figure, no table.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.csv", "sweep.png"]


def test_plot_without_a_sweep_names_the_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main_sweep(["--plot", "--out", str(tmp_path)])
    assert f"no {tmp_path / 'sweep.csv'}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
