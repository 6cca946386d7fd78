"""The structured-pruning benchmarks run end to end at a tiny size and write their tables."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from torch import nn

from tests.benchmarks.scripts import load_script, run_script

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

# The tiny Llama of the speed benchmark (hidden 64, 4 layers, 8 query heads on 4 key/value heads
# of width 8, FFN 128, vocabulary 512 tied): 32,768 embedding + 64 final norm + 4 blocks of
# 12,288 attention + 24,576 FFN + 128 norm parameters. Removing a quarter of the FFN channels
# takes 3 x 64 x 32 per block; a key/value head with its 2 query heads takes 4 x 64 x 8.
TINY_PARAMETERS = {
    "dense": 180_800,
    "FFN 25%": 180_800 - 4 * 6_144,
    "FFN 50%": 180_800 - 4 * 12_288,
    "FFN 75%": 180_800 - 4 * 18_432,
    "heads 25%": 180_800 - 4 * 3_072,
    "heads 50%": 180_800 - 4 * 6_144,
    "layers 25%": 180_800 - 36_992,
    # One FFN channel and one key/value head with its 2 query heads left in every block.
    "floor": 180_800 - 4 * (127 * 192 + 3 * 3_072),
}


@pytest.mark.slow
def test_speed_benchmark_shrinks_saves_loads_and_times_every_configuration(
    tmp_path: Path,
) -> None:
    out = run_script("bench_structured_speed.py", "--tiny", "--out", str(tmp_path))
    results = json.loads((tmp_path / "structured_speed.json").read_text())
    rows = results["rows"]
    assert {name: row["parameters"] for name, row in rows.items()} == TINY_PARAMETERS
    for name, row in rows.items():
        assert row["file_bytes"] == pytest.approx(4 * row["parameters"], abs=20_000), name
        assert row["prefill_speed_up"] > 0 and row["decode_tokens_per_second"] > 0, name
        assert row["loaded_difference"] <= 1e-4, name
        if name != "dense":
            assert row["masked_difference"] <= 1e-5, name
    # 6 query heads cannot divide the hidden size 64 in transformers' Llama config, so that copy
    # loads with tensorplay's load_shrunk; every other one with plain from_pretrained.
    loads = {name: row["loads_with"] for name, row in rows.items()}
    assert loads == {name: "from_pretrained" for name in rows} | {"heads 25%": "load_shrunk"}
    assert rows["heads 25%"]["from_pretrained_error"].startswith("RuntimeError")
    table = (tmp_path / "structured_speed.md").read_text()
    assert table in out and "| layers 25% | 0.1M | 20.5% |" in table


def _resnet18(widths: tuple[int, ...], classes: int) -> nn.Module:
    module: nn.Module = load_script("bench_structure_tracing").resnet18(widths, classes)
    return module


@pytest.mark.slow
def test_peer_benchmark_runs_tensorplay_alone_without_the_peer(tmp_path: Path) -> None:
    out = run_script(
        "bench_structured_peer.py", "--tiny", "--no-peer", "--repeats", "1", "--out", str(tmp_path)
    )
    results = json.loads((tmp_path / "structured_peer.json").read_text())
    assert results["peer"] is None
    rows = results["cnn"]["rows"]
    assert list(rows) == ["dense", "tensorplay", "filters alone masked"]
    # Half of every group of the ResNet-18 of widths 4-32 is the ResNet-18 of widths 2-16.
    halved = sum(p.numel() for p in _resnet18((2, 4, 8, 16), 10).parameters())
    assert rows["tensorplay"]["parameters"] == halved
    assert rows["tensorplay"]["vs_masked"]["relative"] < 1e-5
    # BatchNorm's shift passes a masked filter: not the model with the channel removed.
    assert rows["filters alone masked"]["vs_masked"]["relative"] > 1e-3
    assert rows["tensorplay"]["seconds"] > 0 and rows["tensorplay"]["speed_up"] > 0
    llama = {recipe["recipe"]: recipe for recipe in results["llama"]}
    assert list(llama) == ["FFN 50%", "heads 50%"]
    assert llama["FFN 50%"]["tensorplay"]["parameters"] == TINY_PARAMETERS["FFN 50%"]
    assert llama["heads 50%"]["tensorplay"]["parameters"] == TINY_PARAMETERS["heads 50%"]
    for recipe in llama.values():
        assert "Torch-Pruning" not in recipe
        assert recipe["tensorplay"]["loads"] == "yes, the same logits"
    table = (tmp_path / "structured_peer.md").read_text()
    assert table in out and "Torch-Pruning not installed" in table
    assert "left out" in out.splitlines()[0]


@pytest.mark.slow
def test_torch_pruning_removing_tensorplays_channels_gives_the_masked_model() -> None:
    pytest.importorskip("torch_pruning")
    peer = load_script("bench_structured_peer")
    rows = peer.cnn(tiny=True, repeats=1, peer=True)["rows"]
    same = rows["Torch-Pruning, tensorplay's channels"]
    assert same["parameters"] == rows["tensorplay"]["parameters"]
    assert same["vs_masked"]["relative"] < 1e-5
    assert rows["Torch-Pruning"]["seconds"] > 0 and rows["Torch-Pruning"]["speed_up"] > 0


@pytest.mark.slow
def test_torch_pruning_on_the_llama_finishes_or_is_stopped_at_the_time_limit() -> None:
    pytest.importorskip("torch_pruning")
    peer = load_script("bench_structured_peer")
    result = peer.llama_recipe("FFN 50%", peer.TINY, timeout=60, repeats=1, peer=True)
    assert result["tensorplay"]["parameters"] == TINY_PARAMETERS["FFN 50%"]
    theirs = result["Torch-Pruning"]
    assert theirs["status"] in ("finished", "stopped after 60 s"), theirs
    if theirs["status"] == "finished":
        assert theirs["parameters"] == TINY_PARAMETERS["FFN 50%"]
        assert theirs["loads"].startswith("no: size mismatch")  # its config still says 128
        assert theirs["config_widths"]["intermediate_size"] == [128, 64]
    started = time.perf_counter()
    result = peer.llama_recipe("every width 50%", peer.TINY, timeout=2, repeats=1, peer=True)
    assert time.perf_counter() - started < 60
    assert "tensorplay" not in result  # tensorplay never prunes the residual width
    theirs = result["Torch-Pruning"]
    if theirs["status"] != "finished":
        assert theirs["status"] == "stopped after 2 s" and theirs["where"], theirs
