"""``examples/lm``: both configs train a tiny GPT-2 for a few steps, report, save and reload."""

from __future__ import annotations

import doctest
import math
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("transformers")

from transformers import GPT2LMHeadModel

from tensorplay.ao.pruning import load_sparse
from tensorplay.callbacks import GradualPruning
from tests.examples.scripts import LM, load_script

CONFIGS = sorted((LM / "configs").glob("*.yaml"))
# 2 blocks of width 32: per block c_attn 32x96, attn.c_proj 32x32, c_fc 32x128, mlp.c_proj 128x32.
TINY = ["--model.n_layer=2", "--model.n_embd=32", "--model.n_head=2", "--data.context=32"]
BLOCK_WEIGHTS = 32 * 96 + 32 * 32 + 32 * 128 + 128 * 32
PROJECTIONS = [
    f"transformer.h.{i}.{name}.weight"
    for i in range(2)
    for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
]

pytestmark = pytest.mark.filterwarnings(
    "ignore:LightningCLI's args parameter", "ignore:.*does not have many workers"
)


lm_train = load_script("lm_train", LM / "train.py")


def _config(path: Path, tmp_path: Path) -> Path:
    """``path`` with its pruning schedule shortened to steps 2-4 of a 6-step run."""
    config = yaml.safe_load(path.read_text())
    for callback in config.get("trainer", {}).get("callbacks", []):
        schedule = callback["init_args"]["schedule"]["init_args"]
        schedule.update(start_step=2, end_step=4, frequency=1)
    out = tmp_path / path.name
    out.write_text(yaml.safe_dump(config))
    return out


def _number(label: str, out: str) -> float:
    match = re.search(rf"^{label}\s+(\S+)", out, flags=re.MULTILINE)
    assert match is not None, f"no {label!r} line in the report:\n{out}"
    return float(match.group(1))


def test_the_configs_are_the_documented_ones() -> None:
    assert [path.stem for path in CONFIGS] == ["dense", "gradual"]


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=[path.stem for path in CONFIGS])
def test_config_trains_reports_saves_and_reloads(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = lm_train.main(
        [
            "fit",
            f"--config={_config(config, tmp_path)}",
            *TINY,
            "--data.batch_size=4",
            "--trainer.max_steps=6",
            "--trainer.val_check_interval=3",
            "--trainer.limit_val_batches=2",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
        ]
    )

    run_dir = tmp_path / config.stem / "version_0"
    hf_dir = run_dir / "hf_model"
    for name in (
        "config.yaml",
        "metrics.csv",
        "hf_model/config.json",
        "hf_model/model.safetensors",
    ):
        assert (run_dir / name).is_file(), name
    assert len(list((run_dir / "checkpoints").glob("*.ckpt"))) == 1
    out = capsys.readouterr().out
    ppl = _number("validation perplexity", out)
    reloaded_ppl = _number("reloaded perplexity", out)
    assert math.isfinite(ppl)
    assert reloaded_ppl == ppl
    assert f"Hugging Face folder     {hf_dir} (" in out

    # The saved folder loads strictly into a plain GPT-2 and gives the same logits as the model
    # that trained (still under pruning, with its masks).
    net = cli.model.net
    reloaded, info = GPT2LMHeadModel.from_pretrained(hf_dir, output_loading_info=True)
    for problem in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert list(info[problem]) == [], problem
    batch = next(iter(cli.datamodule.val_dataloader()))[:, :-1]
    net.eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=batch).logits, net(input_ids=batch).logits)
    assert reloaded.lm_head.weight is reloaded.transformer.wte.weight
    # The compressed export holds the same weights, bit for bit.
    sparse = load_sparse(run_dir / "model.sparse.safetensors")
    expected_state = reloaded.state_dict()
    assert sorted(sparse) == sorted(expected_state)
    for name, tensor in expected_state.items():
        assert torch.equal(sparse[name], tensor), name

    # The callback from the YAML selects every projection and nothing else.
    pruning = [c for c in cli.trainer.callbacks if isinstance(c, GradualPruning)]
    if config.stem == "gradual":
        assert pruning[0].pruner.targets == [f"net.{name}" for name in PROJECTIONS]
    else:
        assert pruning == []

    # Exactly the configured fraction of the projections is zero, and nothing else.
    total = 2 * BLOCK_WEIGHTS
    expected = round(0.8 * total) if config.stem == "gradual" else 0
    state = reloaded.state_dict()
    zeros = {name: int((state[name] == 0).sum()) for name in PROJECTIONS}
    assert sum(zeros.values()) == expected
    for name in ("transformer.wte.weight", "transformer.wpe.weight"):
        assert int((state[name] == 0).sum()) == 0, name
    # The per-block table agrees with the saved weights.
    for i in range(2):
        block = sum(n for name, n in zeros.items() if name.startswith(f"transformer.h.{i}."))
        assert re.search(rf"^h\.{i}\s+{BLOCK_WEIGHTS}\s+{block}\s", out, flags=re.MULTILINE)
    assert re.search(rf"^total\s+{total}\s+{expected}\s", out, flags=re.MULTILINE)


def test_docstring_examples_run() -> None:
    """The ``>>>`` examples of the shared files (the examples are not part of pytest's doctests)."""
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    # train.py imported its neighbours under their own names; the experiments' report is apart.
    names = ("pydoc_text", "tiny_gpt", "byte_text", "gpt_bytes")
    reporting = load_script("reporting", LM / "reporting.py")
    modules = [lm_train, reporting, *(sys.modules[name] for name in names)]
    attempted = 0
    for module in modules:
        for test in finder.find(module):
            result = runner.run(test)
            assert result.failed == 0, test.name
            attempted += result.attempted
    assert attempted >= 10
