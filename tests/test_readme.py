"""The README runs as written, and says what it prints.

Every Python block of ``README.md`` runs, in order, as one script in a fresh interpreter (the
Lightning and Hugging Face blocks too), with the README's own line numbers. After each block no
pruned tensor of any model the script holds may have lost every unit (layer collapse), and lean
(``bool``) masks must still hold their weights at zero; a layer-collapse warning is an error.

A comment on a ``print(...)`` line quotes, in double quotes, what that line prints: each quoted
excerpt must be in its output (runs of whitespace count as one space). A digit outside the quotes
of such a comment would be a claim nothing checks, and fails the test. The README quotes only
values exact by construction (counts, and sparsities that are ratios of exact counts), so they
are compared as text.
"""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"

# Runs the script (argv[2]) compiled as README.md (argv[1]); writes what each line printed to
# argv[3] as JSON.
RUNNER = textwrap.dedent(
    """
    import io, json, sys, warnings
    from pathlib import Path
    from torch import nn

    readme, script, out = sys.argv[1:4]
    printed = {}

    def traced_print(*args, **kwargs):
        buffer = io.StringIO()
        print(*args, **{**kwargs, "file": buffer})
        line = str(sys._getframe(1).f_lineno)
        printed[line] = printed.get(line, "") + buffer.getvalue()
        print(*args, **kwargs)

    def after_block():
        for value in list(namespace.values()):
            if not isinstance(value, nn.Module):
                continue
            for name, mask in value.named_buffers():
                if not name.endswith("_mask"):
                    continue
                assert mask.any(), f"{name} is 100% pruned (layer collapse)"
                if mask.dtype is torch.bool:  # lean masks: the weights themselves hold zeros
                    path, _, tensor = name[: -len("_mask")].rpartition(".")
                    weight = getattr(value.get_submodule(path), tensor)
                    assert not weight[~mask].any(), f"{name}: a pruned weight is not zero"

    import torch

    warnings.filterwarnings("error", message=".*layer collapse")
    namespace = {"__name__": "__main__", "print": traced_print, "_after_block": after_block}
    exec(compile(Path(script).read_text(), readme, "exec"), namespace)
    Path(out).write_text(json.dumps(printed))
    """
)


def readme_script(text: str) -> str:
    """The README's Python blocks as one script, each at its README line; the line of each
    block's closing fence calls ``_after_block()``."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if not inside and line == "```python":
            inside = True
            out.append("")
        elif inside and line == "```":
            inside = False
            out.append("_after_block()")
        else:
            out.append(line if inside else "")
    assert not inside, "an unclosed ```python block"
    return "\n".join(out) + "\n"


def quoted_outputs(script: str) -> dict[int, list[str]]:
    """Per line of a ``print(...)`` call, the excerpts its comment quotes.

    Raises:
        AssertionError: a digit outside the quotes of such a comment, or a commented ``print``
            spread over several lines.
    """
    calls = {
        node.lineno: node
        for node in ast.walk(ast.parse(script))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
    }
    claims: dict[int, list[str]] = {}
    for token in tokenize.generate_tokens(io.StringIO(script).readline):
        line = token.start[0]
        if token.type != tokenize.COMMENT or line not in calls:
            continue
        assert calls[line].end_lineno == line, f"README line {line}: a print over several lines"
        comment = token.string.lstrip("#").strip()
        unquoted = re.sub(r'"[^"]*"', "", comment)
        assert not re.search(r"\d", unquoted), (
            f"README line {line}: {comment!r} states a number outside quotes, which nothing "
            "checks; quote what the line prints"
        )
        claims[line] = re.findall(r'"([^"]*)"', comment)
    return claims


def _normal(text: str) -> str:
    return " ".join(text.split())


def check_outputs(claims: dict[int, list[str]], printed: dict[str, str]) -> None:
    """Each quoted excerpt is in what its line printed (whitespace runs as one space)."""
    for line, excerpts in claims.items():
        output = _normal(printed.get(str(line), ""))
        for excerpt in excerpts:
            assert _normal(excerpt) in output, (
                f"README line {line} quotes {excerpt!r}, but it printed {output!r}"
            )


def test_the_claims_are_read_from_print_comments_and_checked() -> None:
    script = readme_script(
        "text\n```python\nn = 4262\nprint(n, 'of', 4736)  # prints \"4262 of 4736\"\n"
        "x = 1  # 90% here is prose\n```\n"
    )
    assert script.splitlines()[5] == "_after_block()"  # README line 6, the closing fence
    claims = quoted_outputs(script)
    assert claims == {4: ["4262 of 4736"]}
    check_outputs(claims, {"4": "4262  of\n4736\n"})
    with pytest.raises(AssertionError, match="quotes '4262 of 4736'"):
        check_outputs(claims, {"4": "4263 of 4736\n"})
    with pytest.raises(AssertionError, match="outside quotes"):
        quoted_outputs("print(n)  # about 90.00% of the weights, exactly\n")


def test_every_python_block_runs_in_order_and_prints_what_its_comments_quote(
    tmp_path: Path,
) -> None:
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    script = readme_script(README.read_text())
    claims = quoted_outputs(script)
    assert len(claims) >= 3  # the global, plain-loop and lean examples quote their output
    (tmp_path / "readme.py").write_text(script)
    (tmp_path / "runner.py").write_text(RUNNER)
    done = subprocess.run(
        [sys.executable, "runner.py", str(README), "readme.py", "printed.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    check_outputs(claims, json.loads((tmp_path / "printed.json").read_text()))


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def _block(needle: str) -> str:
    (block,) = [block for block in _python_blocks() if needle in block]
    return block


@pytest.mark.slow
def test_hugging_face_example_saves_a_folder_that_loads_to_the_same_logits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    transformers = pytest.importorskip("transformers")
    from tensorplay.ao.pruning import load_sparse
    from tensorplay.report import main as report

    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    torch.manual_seed(0)
    exec(_block("GPT2LMHeadModel"), namespace)
    model, pruner = namespace["model"], namespace["pruner"]
    model.eval()
    # Every Conv1D projection and the tied head/embedding, counted once, exactly 80%.
    conv1d = {n for n, m in model.named_modules() if type(m).__name__ == "Conv1D"}
    assert {t.rpartition(".")[0] for t in pruner.targets} == conv1d | {"transformer.wte"}
    assert pruner.pruned_count() == round(0.8 * pruner.total_count())
    assert torch.equal(model.lm_head.weight, model.transformer.wte.weight)
    tokens = torch.randint(0, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        expected = model(tokens).logits
        reloaded = transformers.GPT2LMHeadModel.from_pretrained("gpt2-pruned").eval()
        assert torch.equal(reloaded(tokens).logits, expected)
        fresh = transformers.GPT2LMHeadModel(model.config).eval()
        fresh.load_state_dict(load_sparse("gpt2-pruned.safetensors"), strict=True)
        assert torch.equal(fresh(tokens).logits, expected)
    assert report(["gpt2-pruned"]) == 0
    assert "global sparsity" in capsys.readouterr().out


def test_structured_example_asks_for_channels_shrunk_at_the_end() -> None:
    pytest.importorskip("transformers")
    namespace: dict[str, Any] = {}
    exec(_block('structure="channel"'), namespace)
    pruning = namespace["pruning"]
    assert (pruning.config.structure, pruning.config.scope) == ("channel", "layerwise")
    assert pruning.shrink_at_end and pruning.shrink_report is None  # shrunk when training ends
