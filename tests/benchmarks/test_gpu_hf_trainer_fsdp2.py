"""The GPU script of the Trainer under FSDP2 (``benchmarks/gpu_hf_trainer_fsdp2.py``) on a machine
without GPUs: it says it skips, and its checks tell a one-device run from an FSDP2 one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.benchmarks.scripts import BENCHMARKS, load_script

pytest.importorskip("transformers")


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="runs the comparison where GPUs are")
def test_without_two_gpus_the_script_skips_with_status_2() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_hf_trainer_fsdp2.py")],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout.startswith("SKIP: needs 2 CUDA GPUs")


@pytest.mark.slow
def test_its_checks_fail_a_run_that_is_not_sharded_and_pass_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The one-device run (here on the CPU) stands in for the FSDP2 one: the same masks,
    # weights, losses and saved folder, but plain parameters.
    from tensorplay.ao.pruning import install_saved_masks, shrink

    script = load_script("gpu_hf_trainer_fsdp2")
    script.train(tmp_path, "single", 2)
    shutil.copy(tmp_path / "single.pt", tmp_path / "fsdp2.pt")
    shutil.copytree(tmp_path / "saved-single", tmp_path / "saved-fsdp2")
    # What shrink_at_end writes under FSDP2: the trained model, its masks installed, shrunk.
    found = torch.load(tmp_path / "single.pt", weights_only=False)
    model = script.tiny_llama()
    model.load_state_dict(found["weights"], strict=False)
    install_saved_masks(model, found["masks"])
    shrink(model)
    model.save_pretrained(tmp_path / "fsdp2" / "shrunk")
    assert not script.compare(tmp_path)
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:4] in ("PASS", "FAIL")]
    assert [line[:4] for line in lines] == ["FAIL", "PASS", "PASS", "PASS", "PASS"], lines
    assert "DTensor" in lines[0]
    # A folder of the model not shrunk fails the fifth check.
    shutil.rmtree(tmp_path / "fsdp2" / "shrunk")
    shutil.copytree(tmp_path / "saved-single", tmp_path / "fsdp2" / "shrunk")
    script.compare(tmp_path)
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:4] in ("PASS", "FAIL")]
    assert lines[4].startswith("FAIL  5."), lines
