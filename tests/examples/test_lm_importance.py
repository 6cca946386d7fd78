"""``examples/lm/importance.py``: both experiments run end to end for a few steps."""

from __future__ import annotations

import json
import math
from types import ModuleType

import pytest

from tests.examples.scripts import LM, load_script

pytest.importorskip("transformers")


def _module() -> ModuleType:
    return load_script("lm_importance", LM / "importance.py")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("experiment", "rows"),
    [
        ("transfer", ["dense", "magnitude@0.9", "movement@0.9", "taylor@0.9"]),
        (
            "oneshot",
            [
                "dense",
                "magnitude global@0.5",
                "magnitude layerwise@0.5",
                "magnitude row@0.5",
                "wanda row@0.5",
            ],
        ),
    ],
)
def test_experiment_runs_and_writes_its_table(experiment, rows, tmp_path, capsys):
    importance = _module()
    sparsity = "0.9" if experiment == "transfer" else "0.5"
    out = tmp_path / "result.json"
    importance.main(
        [
            *(experiment, "--steps-scale", "0.02", "--seeds", "0", "--sparsities", sparsity),
            *("--val-windows", "8", "--cache", str(tmp_path), "--out", str(out)),
        ]
    )
    result = json.loads(out.read_text())
    assert sorted(result["cells"]) == sorted(rows)
    assert all(len(v) == 1 and math.isfinite(v[0]) for v in result["cells"].values())
    assert result["table"] in capsys.readouterr().out


def test_the_fine_tuning_text_is_the_interpreters_own_source():
    data = _module().stdlib_bytes()
    assert len(data) > 300_000 and bytes(data[:100].tolist()).isascii()
