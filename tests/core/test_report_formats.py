"""The report command on every format it reads: safetensors, the compressed export, Hugging Face
folders (single file, sharded, ``pytorch_model.bin``), and corrupt files in each; all-zero
tensors without a mask are never counted as pruned, and tied tensors are counted once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import (
    L1Unstructured,
    global_unstructured,
    l1_unstructured,
    permanent_state_dict,
    save_sparse,
)
from tensorplay.report import all_zero_tensors, main, read_weights, state_dict_report
from tests.hf_models import tiny_gpt2

safetensors_torch = pytest.importorskip("safetensors.torch")

TABLE = """\
tensor    shape   numel  pruned  sparsity
0.weight  (4, 3)     12       5    41.67%
2.weight  (2, 4)      8       2    25.00%
total                20       7    35.00%"""
INDEX = {"safetensors": "model.safetensors.index.json", "bin": "pytorch_model.bin.index.json"}
GLOBAL = "global sparsity 35.00%: 7 of 20 units pruned"


def _permanent_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    l1_unstructured(model[0], "weight", amount=5)
    l1_unstructured(model[2], "weight", amount=2)
    return permanent_state_dict(model)


def _run(path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main([str(path)]) == 0
    return capsys.readouterr().out.splitlines()


def _exit_message(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([str(path)])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_plain_safetensors_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(_permanent_state(), str(path))
    assert _run(path, capsys) == [
        f"safetensors file: {path}",
        "permanent or dense state_dict (zeros counted)",
        *TABLE.splitlines(),
        GLOBAL,
    ]


def test_sparse_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save_sparse(_permanent_state(), tmp_path / "model.safetensors")
    assert _run(path, capsys) == [
        f"tensorplay.sparse export (bitmask + non-zero values, safetensors): {path}",
        "permanent or dense state_dict (zeros counted)",
        *TABLE.splitlines(),
        GLOBAL,
    ]


def test_folder_with_model_safetensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    safetensors_torch.save_file(_permanent_state(), str(tmp_path / "model.safetensors"))
    out = _run(tmp_path, capsys)
    assert out[0] == f"Hugging Face folder (model.safetensors): {tmp_path}"
    assert out[2:] == [*TABLE.splitlines(), GLOBAL]


def test_folder_with_pytorch_model_bin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save(_permanent_state(), tmp_path / "pytorch_model.bin")
    out = _run(tmp_path, capsys)
    assert out[0] == f"Hugging Face folder (pytorch_model.bin): {tmp_path}"
    assert out[2:] == [*TABLE.splitlines(), GLOBAL]


def _write_shards(folder: Path, kind: str = "safetensors") -> dict[str, str]:
    state = _permanent_state()
    keys = list(state)
    shards = {"model-00001-of-00002": keys[:2], "model-00002-of-00002": keys[2:]}
    weight_map = {}
    for stem, names in shards.items():
        part = {name: state[name] for name in names}
        if kind == "safetensors":
            safetensors_torch.save_file(part, str(folder / f"{stem}.safetensors"))
        else:
            torch.save(part, folder / f"{stem}.bin")
        weight_map.update({name: f"{stem}.{kind}" for name in names})
    (folder / INDEX[kind]).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_sharded_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    _write_shards(tmp_path, kind)
    out = _run(tmp_path, capsys)
    assert out[0] == f"Hugging Face folder (2 shards via {INDEX[kind]}): {tmp_path}"
    assert out[2:] == [*TABLE.splitlines(), GLOBAL]


def test_all_zero_weight_without_mask_is_not_counted_as_pruned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = {**_permanent_state(), "lora_B.weight": torch.zeros(4, 8)}
    assert [row.name for row in all_zero_tensors(state)] == ["lora_B.weight"]
    assert str(state_dict_report(state)) == TABLE  # the global figure is unchanged
    path = tmp_path / "adapter.safetensors"
    safetensors_torch.save_file(state, str(path))

    assert _run(path, capsys)[2:] == [
        *TABLE.splitlines(),
        GLOBAL,
        "not counted: 1 all-zero weight(s) without a mask, 32 units (zero-initialised, or pruned "
        "entirely: a file without masks cannot tell): lora_B.weight (4, 8)",
    ]


def test_all_zero_weight_beside_masks_is_listed_apart(capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), nn.Linear(2, 2))
    nn.init.zeros_(model[3].weight)  # a zero-initialised head, not pruned
    l1_unstructured(model[0], "weight", amount=5)
    l1_unstructured(model[2], "weight", amount=2)
    state = model.state_dict()
    assert str(state_dict_report(state)) == TABLE
    assert [(row.name, row.pruned) for row in all_zero_tensors(state)] == [("3.weight", 4)]


def test_tied_tensors_are_counted_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    embedding, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight
    model = nn.ModuleDict({"wte": embedding, "lm_head": head})
    global_unstructured([(head, "weight"), (embedding, "weight")], L1Unstructured, amount=30)
    expected = [
        "tensor      shape    numel  pruned  sparsity",
        "wte.weight  (10, 4)     40      30    75.00%",
        "total                   40      30    75.00%",
        "global sparsity 75.00%: 30 of 40 units pruned",
        "counted once (tied): lm_head.weight = wte.weight",
    ]
    pruned = tmp_path / "pruned.pt"
    torch.save(model.state_dict(), pruned)
    assert _run(pruned, capsys)[2:] == expected
    export = save_sparse(model, tmp_path / "model.safetensors")
    assert _run(export, capsys)[2:] == expected


def _gpt2_folder(folder: Path, **save: Any) -> dict[str, torch.Tensor]:
    model = tiny_gpt2()
    pairs = [(m, "weight") for m in model.modules() if type(m).__name__ == "Conv1D"]
    global_unstructured(pairs, L1Unstructured, amount=0.9)
    state = permanent_state_dict(model)
    model.save_pretrained(folder, state_dict=dict(state), **save)
    return state


@pytest.mark.slow
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_hugging_face_save_pretrained_folder_reads_like_the_state_dict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sharded: bool
) -> None:
    state = _gpt2_folder(tmp_path, **({"max_shard_size": "40KB"} if sharded else {}))
    index = tmp_path / "model.safetensors.index.json"
    assert index.is_file() == sharded

    loaded, source = read_weights(tmp_path)

    shards = len(set(json.loads(index.read_text())["weight_map"].values())) if sharded else 0
    assert shards != 1
    assert source == (
        f"Hugging Face folder ({shards} shards via model.safetensors.index.json)"
        if sharded
        else "Hugging Face folder (model.safetensors)"
    )
    expected = {row.name: row for row in state_dict_report(state).rows}
    got = {row.name: row for row in state_dict_report(loaded).rows}
    assert "lm_head.weight" not in loaded  # HF de-duplicates the tied head
    assert got == {k: v for k, v in expected.items() if k != "lm_head.weight"}
    pruned = sum(row.pruned for name, row in got.items() if ".h." in name)
    assert pruned == round(0.9 * sum(row.numel for name, row in got.items() if ".h." in name))
    assert _run(tmp_path, capsys)[0].startswith("Hugging Face folder (")


# --- corrupt files, one per format -----------------------------------------------------------


def _truncate(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 16])
    return path


def test_truncated_safetensors_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(_permanent_state(), str(path))
    err = _exit_message(_truncate(path), capsys)
    assert f"Expected {str(path)!r} to be a readable safetensors file, but: " in err


def test_truncated_sparse_export_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _truncate(save_sparse(_permanent_state(), tmp_path / "model.safetensors"))
    assert f"Expected {str(path)!r} to be a readable safetensors file" in _exit_message(
        path, capsys
    )


def test_inconsistent_sparse_export_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save_sparse({"w": torch.zeros(8, 8)}, tmp_path / "model.safetensors")
    raw = safetensors_torch.load_file(str(path))
    meta = {"format": "tensorplay.sparse", "format_version": "1", "tensors": '{"w": []}'}
    safetensors_torch.save_file(raw, str(path), metadata=meta)
    err = _exit_message(path, capsys)
    assert f"Expected the 'tensors' table of {str(path)!r} to map names to objects" in err


def test_corrupt_header_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes((20).to_bytes(8, "little") + b"{not json at all}   ")
    assert "to be a readable safetensors file" in _exit_message(path, capsys)


def test_truncated_file_in_a_folder_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    safetensors_torch.save_file(_permanent_state(), str(tmp_path / "model.safetensors"))
    _truncate(tmp_path / "model.safetensors")
    err = _exit_message(tmp_path, capsys)
    assert f"{str(tmp_path / 'model.safetensors')!r} to be a readable safetensors file" in err


def test_truncated_pytorch_model_bin_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save(_permanent_state(), tmp_path / "pytorch_model.bin")
    _truncate(tmp_path / "pytorch_model.bin")
    assert "to be a readable checkpoint: " in _exit_message(tmp_path, capsys)


def test_pytorch_model_bin_is_read_with_weights_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save({**_permanent_state(), "extra": nn.Linear(2, 2)}, tmp_path / "pytorch_model.bin")
    err = _exit_message(tmp_path, capsys)
    assert "weights_only=True refused it (loading it could run code)" in err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param("not json", "to be a JSON index with a 'weight_map'", id="not-json"),
        pytest.param({"metadata": {}}, "to be a JSON index with a 'weight_map'", id="no-map"),
        pytest.param({"weight_map": [1]}, "to map tensor names to file names", id="map-type"),
        pytest.param(
            {"weight_map": {"0.weight": "missing.safetensors"}},
            "Expected the shard 'missing.safetensors' named in",
            id="missing-shard",
        ),
        pytest.param(
            {"weight_map": {"0.weight": "../model-00001-of-00002.safetensors"}},
            "Expected the shard '../model-00001-of-00002.safetensors' named in",
            id="outside-folder",
        ),
        pytest.param(
            {"weight_map": {"9.weight": "model-00001-of-00002.safetensors"}},
            "to hold '9.weight', as model.safetensors.index.json says",
            id="key-not-in-shard",
        ),
    ],
)
def test_bad_index_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: object, message: str
) -> None:
    _write_shards(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(change if isinstance(change, str) else json.dumps(change))
    assert message in _exit_message(tmp_path, capsys)


def test_safetensors_file_without_safetensors_installed_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(_permanent_state(), str(path))
    monkeypatch.setitem(__import__("sys").modules, "safetensors.torch", None)
    err = _exit_message(path, capsys)
    assert "Expected the optional package safetensors, to read" in err
    assert "pip install 'tensorplay[safetensors]'" in err


def test_safetensors_header_of_128_bytes_is_not_taken_for_a_pickle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header = json.dumps({"0.weight": {"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]}})
    raw = header.encode().ljust(128)
    path = tmp_path / "w.safetensors"
    path.write_bytes(
        len(raw).to_bytes(8, "little") + raw + torch.tensor([0.0, 1.0]).numpy().tobytes()
    )
    assert path.read_bytes()[:1] == b"\x80"  # also torch's legacy pickle magic
    assert _run(path, capsys)[0] == f"safetensors file: {path}"
