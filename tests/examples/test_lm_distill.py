"""``examples/lm/distill.py``: the recovery runs and the cost measurement, end to end in a few
steps, and its tables render in the docs."""

from __future__ import annotations

import json
import math

import pytest

from tests.examples.scripts import LM, load_script, markdown_to_rst

pytest.importorskip("transformers")


@pytest.mark.slow
def test_the_experiment_runs_and_writes_its_tables(tmp_path, capsys):
    distill = load_script("lm_distill", LM / "distill.py")
    out = tmp_path / "distillation.json"
    distill.main(
        [
            *("--steps-scale", "0.02", "--seeds", "0", "--val-windows", "8"),
            *("--cost-rounds", "1", "--cache", str(tmp_path), "--out", str(out)),
        ]
    )
    result = json.loads(out.read_text())
    runs = ["oneshot/plain", "oneshot/distilled", "gradual/plain", "gradual/distilled"]
    assert sorted(result["cells"]) == sorted(["dense", "pruned", *runs])
    assert all(len(v) == 1 and math.isfinite(v[0]) for v in result["cells"].values())
    assert result["recovery_steps"] == 4 and result["sparsity"] == 0.9
    cost = result["cost"]
    assert cost["teacher_bytes_per_parameter"] == {"float32": 4.0, "bfloat16": 2.0}
    assert cost["held_mb"]["distilled"] > cost["held_mb"]["plain"] > 0  # the teacher is held
    assert cost["peak_mb"]["distilled"] > cost["peak_mb"]["plain"]
    assert cost["time_ratio"] > 0
    text = out.with_suffix(".md").read_text()
    assert text in capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("|") and "---" not in line]
    assert len(rows) == 3 + 3 + 3  # header and 2 runs, header and 2 costs, header and 2 dtypes
    assert markdown_to_rst(text).count("   * - ") == len(rows)


@pytest.mark.slow
def test_the_callback_measurement_runs_and_writes_its_table(tmp_path, capsys):
    trainer_script = load_script("lm_distill_trainer", LM / "distill_trainer.py")
    out = tmp_path / "distillation_trainer.json"
    trainer_script.main(
        [
            *("--steps-scale", "0.02", "--seeds", "0", "--val-windows", "8"),
            *("--cache", str(tmp_path), "--out", str(out)),
        ]
    )
    cells = json.loads(out.read_text())
    assert sorted(cells) == ["dense", "distilled", "plain", "steps"]
    assert cells["steps"] == [4.0]
    assert all(len(v) == 1 and math.isfinite(v[0]) for v in cells.values())
    assert cells["distilled"] != cells["plain"]  # the KD term changed the training
    text = out.with_suffix(".md").read_text()
    assert text in capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("|") and "---" not in line]
    assert len(rows) == 2
    assert markdown_to_rst(text).count("   * - ") == len(rows)


@pytest.mark.slow
def test_the_experiment_prunes_ffn_channels_and_shrinks(tmp_path):
    distill = load_script("lm_distill_channel", LM / "distill.py")
    out = tmp_path / "distillation_channel.json"
    distill.main(
        [
            *("--steps-scale", "0.02", "--seeds", "0", "--val-windows", "8"),
            *("--structure", "channel", "--sparsity", "0.5"),
            *("--cost-rounds", "1", "--cache", str(tmp_path), "--out", str(out)),
        ]
    )
    result = json.loads(out.read_text())
    assert result["structure"] == "channel" and result["sparsity"] == 0.5
    assert all(len(v) == 1 and math.isfinite(v[0]) for v in result["cells"].values())
    assert (
        "pruned to 50% of the FFN channels ranked globally, shrunk"
        in out.with_suffix(".md").read_text()
    )
