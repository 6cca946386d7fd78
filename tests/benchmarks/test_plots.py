"""Each benchmark draws its figures from a results file: tiny results in, PNGs of the size out."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.scripts import load_script, run_script

pytest.importorskip("matplotlib")


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's header (its IHDR chunk), after checking the signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def _timing(seconds: float, params: int) -> dict[str, Any]:
    return {"seconds": seconds, "params": params}


def _global_unstructured() -> dict[str, Any]:
    rows = []
    for size, params, torch_s, ours in (("1M", 10**6, 0.5, 0.05), ("4M", 4 * 10**6, 2.0, 0.1)):
        for call in ("first", "second"):
            theirs = {**_timing(torch_s, params), "extra_bytes_per_param": 48.0}
            mine = {
                **_timing(ours, params),
                "extra_bytes_per_param": 8.0,
                "read_pass_seconds": 1e-3,
            }
            rows.append(
                {
                    "size": size,
                    "layout": "transformer",
                    "call": call,
                    "torch": theirs,
                    "tensorplay": mine,
                }
            )
    # A size torch did not run at (1B in the real file): tensorplay alone.
    for call in ("first", "second"):
        mine = {**_timing(1.0, 10**9), "extra_bytes_per_param": 8.0, "read_pass_seconds": 0.1}
        rows.append({"size": "1B", "layout": "transformer", "call": call, "tensorplay": mine})
    return {"rows": rows, "layouts": [], "repeats": 1}


def _lean_selection() -> dict[str, Any]:
    rows = []
    for size, params in (("1M", 10**6), ("4M", 4 * 10**6)):
        for call in ("first", "second"):
            row: dict[str, Any] = {"size": size, "call": call}
            for mode, seconds, peak, held in (
                ("lean", 0.1, 1.5, 1.2),
                ("reparametrize", 0.2, 8.2, 8.2),
                ("torch", 3.0, 47.0, -0.02),  # a negative held size is drawn as 0.0
            ):
                row[mode] = {
                    **_timing(seconds, params),
                    "peak_bytes_per_param": peak,
                    "held_bytes_per_param": held,
                }
            rows.append(row)
    return {"rows": rows, "repeats": 1}


def _training_overhead() -> dict[str, Any]:
    rows = [
        {
            "batch": batch,
            "seconds": {"dense": 0.1, "lean": 0.12, "reparametrize": 0.13, "floor": 0.01},
            "overhead": {"lean": 0.2, "reparametrize": 0.3},
            "floor_fraction": 0.1,
            "lean_over_floor": 2.0,
        }
        for batch in (8, 64)
    ]
    return {"width": 16, "rounds": 2, "steps": 1, "rows": rows}


def _callback_overhead() -> dict[str, Any]:
    variants = {
        name: {"seconds": seconds, "seconds_all": [seconds, seconds * 1.1], "sparsity": 0.9}
        for name, seconds in (("dense", 1.0), ("tensorplay", 1.2), ("lightning", 1.5))
    }
    return {"params": 4096, "repeats": 2, "variants": variants}


def _large_model() -> dict[str, Any]:
    def way(params: int, seconds: float, peak: float) -> dict[str, Any]:
        return {
            **_timing(seconds, params),
            "peak_bytes_per_param": peak,
            "held_bytes_per_param": 1.0,
            "weights_bytes": 2 * params,
        }

    rows = [
        {"size": "1M", "lean": way(10**6, 0.1, 1.4), "reparametrize": way(10**6, 0.2, 5.2)},
        {"size": "3M", "lean": way(3 * 10**6, 0.3, 1.1), "reparametrize": {"skipped": "no room"}},
    ]
    return {
        "machine": {"memory_gib": 0.1},
        "dtype": "bfloat16",
        "torch_reference": {"size": "1M", **way(10**6, 3.0, 28.0)},
        "rows": rows,
    }


def _structured_speed() -> dict[str, Any]:
    rows: dict[str, Any] = {
        "dense": {"kind": None, "parameters": 1000, "block_parameters": 750, "removed": 0.0}
    }
    for name, kind, removed, prefill, decode in (
        ("FFN 50%", "channel", 0.3, 1.6, 1.2),
        ("heads 25%", "head", 0.05, 1.05, 0.95),  # slower than dense: drawn above 1
        ("layers 25%", "layer", 0.2, 1.3, 1.25),
        ("floor", "floor", 0.7, 8.0, 1.6),
    ):
        rows[name] = {
            "kind": kind,
            "removed": removed,
            "prefill_speed_up": prefill,
            "decode_speed_up": decode,
        }
    return {
        "size": {"batch": 4, "tokens": 256, "new_tokens": 64},
        "machine": {"threads": 1},
        "rows": rows,
    }


def _width() -> dict[str, Any]:
    rows = [
        {"kind": "hidden", "kept": 0.75, "params": 740, "oneshot": 9.0, "recovered": 5.1},
        {"kind": "channel", "kept": 0.75, "params": 750, "oneshot": 6.0, "recovered": 4.9},
        {"kind": "head", "kept": 0.75, "refused": "at least 950 kept"},  # not drawn
        {"kind": "layer", "kept": 0.75, "params": 590, "oneshot": 10.0, "recovered": 5.8},
        {"kind": "channel", "kept": 0.5, "params": 500, "oneshot": 29.0, "recovered": 6.2},
    ]
    return {"dense": 4.9, "params": 1000, "rows": rows}


# (script, results file, its results, {figure: (width, height) in pixels at plotting.DPI})
CASES = [
    (
        "bench_global_unstructured",
        "global_unstructured.json",
        _global_unstructured(),
        {"global_unstructured.png": (1350, 570)},
    ),
    (
        "bench_lean_selection",
        "lean_selection.json",
        _lean_selection(),
        {"lean_selection_time.png": (1350, 570), "lean_selection_memory.png": (1350, 540)},
    ),
    (
        "bench_training_overhead",
        "training_overhead.json",
        _training_overhead(),
        {"training_overhead.png": (1200, 570)},
    ),
    (
        "bench_callback_overhead",
        "callback_overhead.json",
        _callback_overhead(),
        {"callback_overhead.png": (1350, 420)},
    ),
    (
        "bench_large_model",
        "large_model.json",
        _large_model(),
        {"large_model.png": (1425, 585)},
    ),
    (
        "bench_structured_speed",
        "structured_speed.json",
        _structured_speed(),
        {"structured_speed.png": (1350, 600)},
    ),
    ("bench_width", "width.json", _width(), {"width.png": (1350, 570)}),
]


@pytest.mark.parametrize(
    ("script", "results", "expected"),
    [pytest.param(script, results, expected, id=script) for script, _, results, expected in CASES],
)
def test_plot_writes_each_figure_at_its_size(
    tmp_path: Path, script: str, results: dict[str, Any], expected: dict[str, tuple[int, int]]
) -> None:
    written = load_script(script).plot(results, tmp_path / "figures")
    assert [path.name for path in written] == list(expected)
    for path in written:
        assert path.parent == tmp_path / "figures"
        assert path.stat().st_size > 10_000, path  # drawn, not a blank canvas
        assert _png_size(path) == expected[path.name]


def test_plot_option_draws_from_the_saved_json_and_measures_nothing(tmp_path: Path) -> None:
    (tmp_path / "training_overhead.json").write_text(json.dumps(_training_overhead()))
    out = run_script(
        "bench_training_overhead.py", "--out", str(tmp_path), "--plot", str(tmp_path / "png")
    )
    assert out.split() == [str(tmp_path / "png" / "training_overhead.png")]
    assert _png_size(tmp_path / "png" / "training_overhead.png") == (1200, 570)
    # No measurement ran: the results file is the one written above, and no table was written.
    assert json.loads((tmp_path / "training_overhead.json").read_text()) == _training_overhead()
    assert not (tmp_path / "training_overhead.md").exists()


def test_plot_option_without_results_names_the_missing_file(tmp_path: Path) -> None:
    plotting = load_script("plotting")
    with pytest.raises(FileNotFoundError, match=r"No results to plot at .*lean_selection\.json"):
        plotting.plot_saved(
            load_script("bench_lean_selection").plot, tmp_path / "lean_selection.json", tmp_path
        )
    assert list(tmp_path.iterdir()) == []


def test_redraw_all_draws_every_figure_of_the_results_folder(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    for _, name, content, _ in CASES:
        (results / name).write_text(json.dumps(content))
    written = load_script("plotting").redraw_all(results, tmp_path / "figures")
    expected = [figure for *_, figures in CASES for figure in figures]
    assert [path.name for path in written] == expected
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == sorted(expected)


def test_speed_up_labels_are_the_reference_time_over_each_way() -> None:
    from matplotlib.figure import Figure

    axes = Figure().add_subplot()
    load_script("plotting").time_vs_size(
        axes,
        [10**6, 10**7, 10**8],
        ["1M", "10M", "100M"],
        {"torch": [1.0, 12.0, None], "lean": [0.1, 0.4, 2.0], "read pass": [1e-3, 1e-2, 0.1]},
        reference="torch",
    )
    # 1.0 / 0.1 and 12.0 / 0.4; no label where torch has no time, none on torch or the read pass.
    assert [text.get_text() for text in axes.texts] == ["10x", "30x"]
    assert axes.get_xscale() == axes.get_yscale() == "log"
    low, high = axes.get_ylim()
    assert low < 1e-3 and high > 12.0  # every point inside, with room for the labels
