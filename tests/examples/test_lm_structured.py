"""``examples/lm/structured.py``: the gradual and one-shot runs, the shrunk model and its timing,
end to end in a few steps, and its tables render in the docs."""

from __future__ import annotations

import json
import math

import pytest

from tests.examples.scripts import LM, load_script, markdown_to_rst

pytest.importorskip("transformers")


@pytest.mark.slow
def test_the_experiment_runs_and_writes_its_tables(tmp_path, capsys):
    structured = load_script("lm_structured", LM / "structured.py")
    out = tmp_path / "structured.json"
    structured.main(
        [
            *("--steps-scale", "0.02", "--seeds", "0", "--val-windows", "8"),
            *("--speed-rounds", "1", "--cache", str(tmp_path), "--out", str(out)),
        ]
    )
    result = json.loads(out.read_text())
    assert sorted(result["cells"]) == ["continued", "dense", "gradual", "oneshot", "pruned"]
    assert all(len(v) == 1 and math.isfinite(v[0]) for v in result["cells"].values())
    assert result["recovery_steps"] == 4 and result["sparsity"] == 0.5
    shrunk = result["shrunk"]
    assert shrunk["n_inner_after"] == 128  # half of each block's 256 channels
    # Each block loses 128 columns of c_fc (64 weights and a bias each) and 128 rows of c_proj.
    assert shrunk["parameters_before"] - shrunk["parameters_after"] == 2 * 128 * (64 + 1 + 64)
    assert shrunk["largest_logit_difference"] < 1e-4
    assert result["speed"]["time_ratio"] > 0
    text = out.with_suffix(".md").read_text()
    assert text in capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("|") and "---" not in line]
    assert len(rows) == 6 + 3  # header and 5 runs, header and 2 rows of the shrunk model
    assert markdown_to_rst(text).count("   * - ") == len(rows)
