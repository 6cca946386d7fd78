"""``tensorplay.report``: the sparsity of a checkpoint file, from Python and the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning.parity.methods import l1_unstructured, remove
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.report import load_state_dict, main, state_dict_report

EXPECTED_TABLE = """\
tensor    shape   numel  pruned  sparsity
0.weight  (4, 3)     12       5    41.67%
2.weight  (2, 4)      8       2    25.00%
total                20       7    35.00%"""


def _pruned_model() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    l1_unstructured(model[0], "weight", amount=5)
    l1_unstructured(model[2], "weight", amount=2)
    return model


def _save(obj: object, path: Path) -> Path:
    torch.save(obj, path)
    return path


_UNPICKLED: list[str] = []


def _record_unpickling() -> None:
    _UNPICKLED.append("ran")


class _CodeOnLoad:
    """Runs ``_record_unpickling`` when unpickled by an unrestricted ``torch.load``."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_record_unpickling, ())


def test_pruned_state_dict_counts_mask_zeros_even_where_orig_is_not_zero() -> None:
    state = _pruned_model().state_dict()
    assert torch.count_nonzero(state["0.weight_orig"]) == 12  # the pruned values are kept

    report = state_dict_report(state)

    assert str(report) == EXPECTED_TABLE
    assert [row.name for row in report.rows] == ["0.weight", "2.weight"]


def test_permanent_state_dict_counts_zeros_and_matches_the_pruned_report() -> None:
    model = _pruned_model()
    pruned_report = state_dict_report(model.state_dict())
    remove(model[0], "weight")
    remove(model[2], "weight")
    state = model.state_dict()
    assert not any(key.endswith(("_orig", "_mask")) for key in state)

    assert state_dict_report(state) == pruned_report


def test_dense_state_dict_reports_two_dimensional_weights_only() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    report = state_dict_report(model.state_dict())
    assert [row.name for row in report.rows] == ["0.weight", "2.weight"]
    assert (report.pruned, report.total) == (0, 20)


def test_lightning_checkpoint_and_plain_state_dict_load_the_same(tmp_path: Path) -> None:
    state = _pruned_model().state_dict()
    plain = load_state_dict(_save(state, tmp_path / "plain.pt"))
    ckpt = {"state_dict": state, "epoch": 3, "hyper_parameters": {"lr": 0.1}}
    lightning = load_state_dict(_save(ckpt, tmp_path / "run.ckpt"))

    assert list(plain) == list(state) == list(lightning)
    for key, value in state.items():
        assert torch.equal(plain[key], value)
        assert torch.equal(lightning[key], value)


def test_command_prints_the_table_and_global_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _save({"state_dict": _pruned_model().state_dict()}, tmp_path / "run.ckpt")

    assert main([str(path)]) == 0

    assert capsys.readouterr().out.splitlines() == [
        f"torch.save file (Lightning checkpoint): {path}",
        "pruned state_dict (units whose mask is 0 counted)",
        *EXPECTED_TABLE.splitlines(),
        "global sparsity 35.00%: 7 of 20 units pruned",
    ]


def test_command_on_a_permanent_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _pruned_model()
    remove(model[0], "weight")
    remove(model[2], "weight")
    path = _save(model.state_dict(), tmp_path / "model.pt")

    assert main([str(path)]) == 0

    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        f"torch.save file (state_dict): {path}",
        "permanent or dense state_dict (zeros counted)",
    ]
    assert out[2:] == [*EXPECTED_TABLE.splitlines(), "global sparsity 35.00%: 7 of 20 units pruned"]


def test_command_on_a_lean_checkpoint_counts_its_masks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    Pruner(model, OneShotSchedule(0.5), masking="inplace").step()
    path = _save(model.state_dict(), tmp_path / "lean.pt")

    assert main([str(path)]) == 0

    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        f"torch.save file (state_dict): {path}",
        "pruned state_dict (units whose mask is 0 counted)",
    ]
    assert out[-1] == "global sparsity 50.00%: 12 of 24 units pruned"


def test_command_saves_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = _save(_pruned_model().state_dict(), tmp_path / "model.pt")
    png = tmp_path / "layers.png"

    assert main([str(path), "--plot", str(png)]) == 0

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.splitlines()[-1] == f"plot: {png}"


def _exit_message(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _exit_message([str(tmp_path / "nope.ckpt")], capsys)
    assert "Expected `path` to be a checkpoint file or a model folder, but got" in err
    assert "nope.ckpt" in err


def test_folder_without_weights_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text("{}")
    err = _exit_message([str(tmp_path)], capsys)
    assert f"Expected {str(tmp_path)!r} to be a Hugging Face model folder holding one of" in err
    assert "model.safetensors.index.json, model.safetensors, pytorch_model.bin" in err


def test_text_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.ckpt"
    path.write_text("not a checkpoint\n")
    err = _exit_message([str(path)], capsys)
    assert "to be a checkpoint written by torch.save or a .safetensors file, but it starts " in err
    assert "with b'not '" in err


def test_truncated_checkpoint_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = _save({"w": torch.ones(100)}, tmp_path / "whole.pt").read_bytes()
    path = tmp_path / "cut.pt"
    path.write_bytes(whole[: len(whole) // 2])
    assert "to be a readable checkpoint: " in _exit_message([str(path)], capsys)


def test_file_that_would_run_code_is_refused_without_running_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _save({"state_dict": {"w": torch.ones(2, 2)}, "payload": _CodeOnLoad()}, tmp_path / "x")
    err = _exit_message([str(path)], capsys)
    assert "to hold only tensors and plain data, but weights_only=True refused it" in err
    assert "Unsupported global" in err
    assert "_record_unpickling" in err
    assert _UNPICKLED == []


@pytest.mark.parametrize(
    ("obj", "got"),
    [
        pytest.param(torch.ones(3), "but got a Tensor", id="a-tensor"),
        pytest.param(
            {"epoch": 3}, "but got a dict with no tensors (keys ['epoch'])", id="no-tensor"
        ),
        pytest.param([1, 2], "but got a list", id="a-list"),
    ],
)
def test_file_without_a_state_dict_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], obj: object, got: str
) -> None:
    err = _exit_message([str(_save(obj, tmp_path / "x.pt"))], capsys)
    assert "to hold a state_dict or a dict with a 'state_dict'" in err
    assert got in err


def test_state_dict_without_prunable_tensors_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = {"0.bias": torch.zeros(4), "norm.weight": torch.ones(4), "idx": torch.ones(2, 2).long()}
    err = _exit_message([str(_save(state, tmp_path / "bias.pt"))], capsys)
    assert "but got none among 3 keys" in err


def test_python_dash_m_entry_point_exits_2_with_the_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tensorplay.report", str(tmp_path / "missing.ckpt")],
        capture_output=True,
        text=True,
        timeout=600,  # a fresh interpreter importing torch: seconds alone, far more under load
    )
    assert result.returncode == 2
    assert result.stderr.startswith("usage: tensorplay-report")
    assert "Expected `path` to be a checkpoint file or a model folder" in result.stderr


def test_plot_without_matplotlib_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # importing it now fails
    path = _save(_pruned_model().state_dict(), tmp_path / "model.pt")
    err = _exit_message([str(path), "--plot", str(tmp_path / "layers.png")], capsys)
    assert "--plot needs matplotlib: pip install matplotlib" in err
    assert not (tmp_path / "layers.png").exists()
