"""``save_sparse`` / ``load_sparse``: bitmask + packed non-zeros in safetensors, bit-exact."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import (
    L1Unstructured,
    global_unstructured,
    load_sparse,
    permanent_state_dict,
    save_sparse,
)

safetensors_torch = pytest.importorskip("safetensors.torch")

INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def _bits(tensor: Tensor) -> Tensor:
    return tensor.view(INT_VIEW[tensor.dtype]) if tensor.dtype in INT_VIEW else tensor


def _assert_bit_exact(loaded: dict[str, Tensor], expected: dict[str, Tensor]) -> None:
    assert list(loaded) == list(expected)
    for key, value in expected.items():
        assert loaded[key].dtype == value.dtype, key
        assert loaded[key].shape == value.shape, key
        assert torch.equal(_bits(loaded[key]), _bits(value)), key


def _metadata(path: Path) -> dict[str, dict[str, object]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as file:
        metadata = file.metadata()
        assert metadata["format"] == "tensorplay.sparse"
        assert metadata["format_version"] == "1"
        return json.loads(metadata["tensors"])


def _stored_keys(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as file:
        return sorted(file.keys())


def _special(dtype: torch.dtype) -> Tensor:
    """90% zeros, with -0.0, NaN (a non-default payload where it has one), inf and subnormals."""
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(40, 25, generator=generator, dtype=torch.float64).to(dtype)
    values[torch.rand(40, 25, generator=generator) < 0.9] = 0.0
    flat = values.view(-1)
    flat[:6] = torch.tensor([-0.0, float("nan"), float("inf"), -float("inf"), 0.0, -0.0]).to(dtype)
    flat[6] = torch.finfo(dtype).smallest_normal / 4  # subnormal
    payload = flat[7:8].view(INT_VIEW[dtype])
    payload.fill_(-1)  # all bits set: a NaN with a payload torch's own NaN lacks
    return values


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float16, torch.bfloat16, torch.float64],
    ids=["fp32", "fp16", "bf16", "fp64"],
)
def test_round_trip_is_bit_exact(tmp_path: Path, dtype: torch.dtype) -> None:
    state = {
        "w": _special(dtype),
        "dense": torch.randn(3, 4, dtype=torch.float64).to(dtype),
        "empty": torch.empty(0, 5, dtype=dtype),
        "scalar_zero": torch.tensor(0.0, dtype=dtype),
        "scalar_neg_zero": torch.tensor(-0.0, dtype=dtype),
        "scalar": torch.tensor(1.5, dtype=dtype),
        "count": torch.tensor([0, 0, 0, 0, 0, 0, 0, 0, 0, 7]),
        "flags": torch.tensor([True, False]),
    }
    assert torch.isnan(state["w"]).sum() == 2 and (_bits(state["w"]) == 0).float().mean() > 0.85

    path = save_sparse(state, tmp_path / "w.safetensors")
    loaded = load_sparse(path)

    _assert_bit_exact(loaded, state)
    encodings = {name: entry["encoding"] for name, entry in _metadata(path).items()}
    assert encodings == {
        "w": "bitmask",
        "dense": "dense",
        "empty": "dense",
        "scalar_zero": "bitmask",  # one byte of mask, no value: smaller than the scalar
        "scalar_neg_zero": "dense",  # -0.0 is a value
        "scalar": "dense",
        "count": "dense",  # integers are stored as they are
        "flags": "dense",
    }
    entry = {"shape": [40, 25], "dtype": str(dtype).removeprefix("torch."), "encoding": "bitmask"}
    assert _metadata(path)["w"] == entry


def test_bit_order_is_row_major_least_significant_bit_first(tmp_path: Path) -> None:
    weight = torch.zeros(2, 10)
    weight[0, 0], weight[0, 9], weight[1, 7] = 1.0, 2.0, 3.0  # units 0, 9 and 17
    path = save_sparse({"w": weight}, tmp_path / "w.safetensors")
    raw = safetensors_torch.load_file(str(path))
    assert sorted(raw) == ["w:bitmask", "w:values"]
    assert raw["w:bitmask"].tolist() == [0b00000001, 0b00000010, 0b00000010]
    assert raw["w:values"].tolist() == [1.0, 2.0, 3.0]


def _mlp(seed: int, width: int = 64) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(width, 4 * width),
        nn.GELU(),
        nn.Linear(4 * width, 4 * width),
        nn.LayerNorm(4 * width),
        nn.Linear(4 * width, width),
    )


def _prune_globally(model: nn.Module, amount: float) -> None:
    pairs = [(m, "weight") for m in model.modules() if isinstance(m, nn.Linear)]
    global_unstructured(pairs, L1Unstructured, amount=amount)


def test_model_under_pruning_loads_strictly_into_a_fresh_model(tmp_path: Path) -> None:
    model = _mlp(0)
    _prune_globally(model, 0.9)
    path = save_sparse(model, tmp_path / "model.safetensors")

    state = load_sparse(path)

    fresh = _mlp(1)
    inputs = torch.randn(5, 64)
    assert not torch.equal(fresh(inputs), model(inputs))
    fresh.load_state_dict(state, strict=True)
    assert torch.equal(fresh(inputs), model(inputs))
    _assert_bit_exact(state, permanent_state_dict(model))


def test_pruned_state_dict_is_made_permanent_first(tmp_path: Path) -> None:
    model = _mlp(0, width=8)
    _prune_globally(model, 0.5)
    pruned = model.state_dict()
    assert any(key.endswith("_orig") for key in pruned)

    from_state = load_sparse(save_sparse(pruned, tmp_path / "state.safetensors"))
    from_model = load_sparse(save_sparse(model, tmp_path / "model.safetensors"))

    assert sorted(from_state) == sorted(from_model)
    for key, value in from_model.items():
        assert torch.equal(_bits(from_state[key]), _bits(value)), key


def test_tied_weights_are_stored_once_and_come_back_shared(tmp_path: Path) -> None:
    torch.manual_seed(0)
    embedding, head = nn.Embedding(100, 16), nn.Linear(16, 100, bias=False)
    head.weight = embedding.weight
    model = nn.ModuleDict({"wte": embedding, "lm_head": head})
    global_unstructured([(head, "weight"), (embedding, "weight")], L1Unstructured, amount=0.9)

    path = save_sparse(model, tmp_path / "tied.safetensors")

    assert _metadata(path)["lm_head.weight"] == {"encoding": "alias", "of": "wte.weight"}
    assert _stored_keys(path) == ["wte.weight:bitmask", "wte.weight:values"]
    state = load_sparse(path)
    assert list(state) == ["wte.weight", "lm_head.weight"]
    assert state["wte.weight"] is state["lm_head.weight"]
    fresh = nn.ModuleDict({"wte": nn.Embedding(100, 16), "lm_head": nn.Linear(16, 100, bias=False)})
    fresh["lm_head"].weight = fresh["wte"].weight
    fresh.load_state_dict(state, strict=True)
    assert torch.equal(fresh["wte"].weight, embedding.weight)


def test_plain_state_dict_with_tied_entries_stores_them_once(tmp_path: Path) -> None:
    first, second = nn.Linear(8, 8), nn.Linear(8, 8)
    second.weight = first.weight
    state = nn.Sequential(first, second).state_dict()
    path = save_sparse(state, tmp_path / "tied.safetensors")
    assert _metadata(path)["1.weight"] == {"encoding": "alias", "of": "0.weight"}
    loaded = load_sparse(path)
    assert loaded["0.weight"] is loaded["1.weight"]
    assert torch.equal(loaded["1.weight"], first.weight)


def test_file_is_at_most_0_16_of_the_dense_file_at_90_percent(tmp_path: Path) -> None:
    model = _mlp(0, width=128)
    _prune_globally(model, 0.9)
    state = permanent_state_dict(model)
    weights = sum(t.numel() for k, t in state.items() if k.endswith("weight") and t.dim() == 2)
    assert weights / sum(t.numel() for t in state.values()) > 0.99
    dense = tmp_path / "dense.safetensors"
    safetensors_torch.save_file({k: v.contiguous() for k, v in state.items()}, str(dense))

    sparse = save_sparse(model, tmp_path / "sparse.safetensors")

    ratio = sparse.stat().st_size / dense.stat().st_size
    assert ratio <= 0.16, ratio
    assert ratio >= 0.125  # one bit per unit and 10% of the values: it cannot be smaller


def _corrupt(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _with_metadata(path: Path, change: dict[str, object]) -> Path:
    """Rewrite the file's header with ``change`` applied to the tensors table."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    tensors = json.loads(header["__metadata__"]["tensors"])
    tensors.update(change)
    header["__metadata__"]["tensors"] = json.dumps(tensors)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length :])
    return path


def test_corrupt_and_foreign_files_raise_value_errors_naming_the_path(tmp_path: Path) -> None:
    good = save_sparse({"w": _special(torch.float32)}, tmp_path / "good.safetensors")
    whole = good.read_bytes()
    plain = tmp_path / "plain.safetensors"
    safetensors_torch.save_file({"w": torch.ones(2)}, str(plain))
    torch_file = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2)}, torch_file)
    cases = {
        _corrupt(tmp_path, "cut.safetensors", whole[: len(whole) // 2]): "readable safetensors",
        _corrupt(tmp_path, "text.safetensors", b"hello world, not a tensor file"): "readable",
        torch_file: "readable safetensors",
        plain: r"to be a tensorplay.sparse export \(written by save_sparse\)",
    }
    for path, message in cases.items():
        with pytest.raises(ValueError, match=message) as error:
            load_sparse(path)
        assert str(path) in str(error.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"w": {"shape": [5, 5], "dtype": "float32", "encoding": "bitmask"}},
                     "its bitmask does not match", id="shape"),
        pytest.param({"w": {"shape": [40, 25], "dtype": "float16", "encoding": "bitmask"}},
                     "its values does not match", id="dtype"),
        pytest.param({"w": {"shape": [40, 25], "dtype": "float32", "encoding": "zip"}},
                     "unknown encoding 'zip'", id="encoding"),
        pytest.param({"w": {"shape": [40, 25], "dtype": "floaty", "encoding": "dense"}},
                     "unknown dtype 'floaty'", id="unknown-dtype"),
        pytest.param({"v": {"encoding": "alias", "of": "nothing"}},
                     "an alias of 'nothing', which is no earlier tensor", id="alias"),
        pytest.param({"u": {"shape": [2], "dtype": "float32", "encoding": "dense"}},
                     "the file holds no tensor 'u'", id="missing-tensor"),
        pytest.param({"u": {"shape": [64], "dtype": "float32", "encoding": "bitmask"}},
                     "the file holds no tensor 'u:bitmask'", id="missing-bitmask"),
        pytest.param({"w": {"dtype": "float32", "encoding": "dense"}},
                     "shape None is not a list of sizes", id="no-shape"),
    ],
)  # fmt: skip
def test_inconsistent_metadata_raises_naming_path_and_tensor(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    path = save_sparse({"w": _special(torch.float32)}, tmp_path / "w.safetensors")
    _with_metadata(path, change)
    with pytest.raises(ValueError, match=r"consistent tensorplay\.sparse export") as error:
        load_sparse(path)
    assert str(path) in str(error.value) and message in str(error.value)


def test_values_that_disagree_with_the_bitmask_are_refused(tmp_path: Path) -> None:
    weight = torch.zeros(100)
    weight[3] = 1.0
    path = save_sparse({"w": weight}, tmp_path / "w.safetensors")
    raw = safetensors_torch.load_file(str(path))
    raw["w:bitmask"][0] = 0xFF  # eight units set, one value stored
    metadata = {"format": "tensorplay.sparse", "format_version": "1"}
    metadata["tensors"] = json.dumps(_metadata(path))
    safetensors_torch.save_file(raw, str(path), metadata=metadata)
    with pytest.raises(ValueError, match=r"its values does not match the metadata"):
        load_sparse(path)


def test_unknown_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.safetensors"
    meta = {"format": "tensorplay.sparse", "format_version": "2", "tensors": "{}"}
    safetensors_torch.save_file({"w": torch.ones(1)}, str(path), metadata=meta)
    with pytest.raises(ValueError, match="version '1', but got '2'"):
        load_sparse(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.safetensors"):
        load_sparse(tmp_path / "nope.safetensors")


def test_wrong_input_type() -> None:
    with pytest.raises(TypeError, match=r"Expected `model_or_state_dict` to be an nn\.Module"):
        save_sparse([torch.ones(2)], "unused.safetensors")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'epoch' holds int"):
        save_sparse({"w": torch.ones(2), "epoch": 3}, "unused.safetensors")  # type: ignore[dict-item]


def test_name_clashing_with_a_part_of_another_is_refused(tmp_path: Path) -> None:
    state = {"w": torch.zeros(64), "w:bitmask": torch.ones(8)}
    with pytest.raises(ValueError, match="'w:bitmask' is both a tensor and a part of one"):
        save_sparse(state, tmp_path / "clash.safetensors")
    assert not (tmp_path / "clash.safetensors").exists()


def test_without_safetensors_a_clear_import_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)  # importing it now fails
    with pytest.raises(ImportError, match=r"pip install 'tensorplay\[safetensors\]'"):
        save_sparse({"w": torch.ones(2)}, tmp_path / "w.safetensors")
    with pytest.raises(ImportError, match="`load_sparse` needs the optional package safetensors"):
        load_sparse(tmp_path / "w.safetensors")


WITHOUT_SAFETENSORS = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "safetensors":
            raise ImportError(f"{name} is blocked in this test")

sys.meta_path.insert(0, Block())
import torch
import tensorplay.ao.pruning as prune
import tensorplay.report

model = prune.l1_unstructured(torch.nn.Linear(4, 4), "weight", amount=8)
assert int((prune.permanent_state_dict(model)["weight"] == 0).sum()) == 8
try:
    prune.save_sparse(model, "unused.safetensors")
except ImportError as error:
    print(error)
assert not [name for name in sys.modules if name.startswith("safetensors")]
"""


@pytest.mark.slow
def test_core_imports_without_safetensors() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_SAFETENSORS],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "`save_sparse` needs the optional package safetensors: "
        "pip install 'tensorplay[safetensors]'"
    )


def test_distinct_views_of_one_storage_are_stored_apart(tmp_path: Path) -> None:
    base = torch.randn(2, 8)
    state = {"a": base[0], "b": base[1], "c": base}  # one storage, three tensors: no tie
    with pytest.raises(RuntimeError, match="Some tensors share memory"):  # plain safetensors
        safetensors_torch.save_file(state, str(tmp_path / "plain.safetensors"))
    loaded = load_sparse(save_sparse(state, tmp_path / "views.safetensors"))
    assert loaded["a"] is not loaded["b"]
    _assert_bit_exact(loaded, state)
