"""``examples/lm/train_trainer.py``: the Trainer variant trains dense and pruned for a few steps,
saves the pruned model and reloads it to the same perplexity."""

from __future__ import annotations

import doctest
import math
import re
from pathlib import Path

import pytest

from tests.examples.scripts import LM, load_script

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

TINY = ["--n-layer=2", "--n-embd=32", "--n-head=2", "--context=32", "--batch-size=4"]


example = load_script("lm_train_trainer", LM / "train_trainer.py")


@pytest.mark.slow
@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_the_trainer_example_prunes_saves_and_reloads(
    masking: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import GPT2LMHeadModel

    numbers = example.main(  # type: ignore[attr-defined]
        [*TINY, "--max-steps=12", "--val-batches=2", f"--masking={masking}", f"--out={tmp_path}"]
    )
    out = capsys.readouterr().out
    assert math.isfinite(numbers["dense"]) and math.isfinite(numbers["pruned"])
    assert numbers["reloaded"] == numbers["pruned"]
    assert re.search(r"^reloaded perplexity\s+\S+ \(identical\)$", out, flags=re.MULTILINE)
    # 12 steps: the schedule prunes at steps 2..8 to 80% of the 2 blocks' projections.
    per_block = 32 * 96 + 32 * 32 + 32 * 128 + 128 * 32
    total = 2 * per_block
    assert f"projections pruned      80.00% ({round(0.8 * total):,} of {total:,})" in out
    reloaded, info = GPT2LMHeadModel.from_pretrained(
        tmp_path / "gradual/hf_model", output_loading_info=True
    )
    assert list(info["missing_keys"]) == list(info["unexpected_keys"]) == []
    zeros = sum(
        int((parameter == 0).sum())
        for name, parameter in reloaded.named_parameters()
        if re.search(r"\.h\.\d+\.(attn|mlp)\.c_", name) and name.endswith(".weight")
    )
    assert zeros == round(0.8 * total)


def test_docstring_examples_run() -> None:
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    attempted = 0
    for test in finder.find(example):
        result = runner.run(test)
        assert result.failed == 0, test.name
        attempted += result.attempted
    assert attempted >= 3
