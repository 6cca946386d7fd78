"""The benchmark scripts run end to end at a tiny size and write their tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_script


@pytest.mark.slow
def test_global_unstructured_benchmark_compares_with_torch(tmp_path: Path) -> None:
    out = run_script(
        "bench_global_unstructured.py",
        *("--sizes", "1M", "--repeats", "1", "--no-billion", "--no-layouts"),
        *("--out", str(tmp_path)),
    )
    results = json.loads((tmp_path / "global_unstructured.json").read_text())
    assert [(row["size"], row["call"]) for row in results["rows"]] == [
        ("1M", "first"),
        ("1M", "second"),
    ]
    for row in results["rows"]:
        for library in ("torch", "tensorplay"):
            assert row[library]["seconds"] > 0, row  # an error would have no time
    table = (tmp_path / "global_unstructured.md").read_text()
    assert table in out and "| 1M | first |" in table and "x |" in table


@pytest.mark.slow
def test_callback_overhead_benchmark_compares_with_model_pruning(tmp_path: Path) -> None:
    run_script(
        "bench_callback_overhead.py", "--width", "32", "--repeats", "1", "--out", str(tmp_path)
    )
    results = json.loads((tmp_path / "callback_overhead.json").read_text())
    variants = results["variants"]
    assert set(variants) == {"dense", "tensorplay", "lightning"}
    assert variants["dense"]["sparsity"] == 0
    # 4 x 32 x 32 weights: tensorplay prunes exactly round(0.9 * 4096); ModelPruning rounds
    # each incremental amount on its own, so it may land a unit or two off.
    assert variants["tensorplay"]["sparsity"] == round(0.9 * 4096) / 4096
    assert variants["lightning"]["sparsity"] == pytest.approx(0.9, abs=0.005)
    assert "| lightning |" in (tmp_path / "callback_overhead.md").read_text()


@pytest.mark.slow
def test_hf_trainer_overhead_benchmark_compares_both_modes_with_dense(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = run_script(
        "bench_hf_trainer_overhead.py",
        *("--width", "32", "--layers", "1", "--steps", "12", "--repeats", "1"),
        *("--out", str(tmp_path)),
    )
    results = json.loads((tmp_path / "hf_trainer_overhead.json").read_text())
    variants = results["variants"]
    assert list(variants) == ["dense", "reparametrize", "inplace"]
    assert variants["dense"]["sparsity"] == 0 and variants["dense"]["events"] == 0
    for mode in ("reparametrize", "inplace"):
        row = variants[mode]
        # The projections and the tied embedding: exactly round(0.8 * weights), in 8 events.
        selected = row["selected_weights"]
        assert row["sparsity"] == round(0.8 * selected) / selected
        assert row["events"] == 8 and row["seconds"] > 0
    table = (tmp_path / "hf_trainer_overhead.md").read_text()
    assert table in out and "| inplace |" in table and "x |" in table


@pytest.mark.slow
def test_trainer_checkpoint_size_benchmark_measures_each_masking(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = run_script("bench_trainer_checkpoint_size.py", "--tiny", "--out", str(tmp_path))
    results = json.loads((tmp_path / "trainer_checkpoint_size.json").read_text())
    ways = results["ways"]
    assert list(ways) == ["dense", "reparametrize", "inplace"]
    for way in ("reparametrize", "inplace"):
        # The permanent form: the model file of the dense run, the masks in no file.
        assert ways[way]["model_safetensors"] == ways["dense"]["model_safetensors"]
        assert ways[way]["training_form"] > ways["dense"]["training_form"]
        assert ways[way]["sparsity"] == pytest.approx(0.8, abs=1e-3)
    assert ways["reparametrize"]["training_form"] > ways["inplace"]["training_form"]
    assert list(results["kept_zero_bytes"]) == ["10", "100"]
    assert all(size > 8 for size in results["kept_zero_bytes"].values())  # an int64 index each
    table = (tmp_path / "trainer_checkpoint_size.md").read_text()
    assert table in out and "| inplace |" in table


@pytest.mark.slow
def test_importance_overhead_benchmark_compares_with_magnitude(tmp_path: Path) -> None:
    out = run_script("bench_importance_overhead.py", "--quick", "--out", str(tmp_path))
    results = json.loads((tmp_path / "importance_overhead.json").read_text())
    ways = results["ways"]
    assert list(ways) == ["magnitude", "movement", "movement-bf16", "taylor", "wanda"]
    assert ways["magnitude"]["ratio_to_magnitude"] == 1.0
    # 4 x 64 x 64 weights: float32 sums are 4 bytes a parameter, bfloat16 2, Wanda's norms
    # one float32 per input feature (4 / 64 bytes a parameter).
    assert [ways[name]["accumulator_bytes_per_parameter"] for name in ways] == [0, 4, 2, 4, 4 / 64]
    assert results["calibration"]["calibrate_ms"] > 0
    assert (tmp_path / "importance_overhead.md").read_text() in out


@pytest.mark.slow
def test_structured_overhead_benchmark_compares_with_element_masks_and_dense(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    out = run_script("bench_structured_overhead.py", "--quick", "--out", str(tmp_path))
    results = json.loads((tmp_path / "structured_overhead.json").read_text())
    ways = results["ways"]
    assert list(ways) == [
        "dense",
        "element-reparametrize",
        "element-inplace",
        "channel-reparametrize",
        "channel-inplace",
    ]
    assert ways["dense"]["ratio_to_dense"] == 1.0
    # 2 layers: 7 Linear weights each and the LM head as elements; gate, up and down as channels.
    assert [ways[name]["masked_tensors"] for name in ways] == [0, 15, 15, 6, 6]
    assert [ways[name]["sparsity"] for name in ways] == [0.0, 0.5, 0.5, 0.5, 0.5]
    assert (tmp_path / "structured_overhead.md").read_text() in out


@pytest.mark.slow
def test_the_entry_points_benchmark_times_its_four_calls(tmp_path: Path) -> None:
    out = run_script(
        "bench_entry_points.py", "--params", "1M", "--repeats", "1", "--steps", "20",
        "--out", str(tmp_path),
    )  # fmt: skip
    rows = json.loads((tmp_path / "entry_points.json").read_text())["rows"]
    assert [row["case"] for row in rows] == [
        "global_unstructured",
        "one-shot channels, reconstructed",
        "dense teacher copy",
        "callback step",
    ]
    assert all(row["tensorplay"]["seconds"] > 0 for row in rows)
    assert "| callback step |" in out
