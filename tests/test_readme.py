"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_global_unstructured_example_prunes_exactly_eighty_percent() -> None:
    namespace: dict[str, object] = {}
    exec(_python_blocks()[0], namespace)
    model = namespace["model"]
    assert isinstance(model, torch.nn.Sequential)
    first, last = model[0], model[2]
    # The first layer was made permanent, the last still carries its mask.
    assert sorted(first.state_dict()) == ["bias", "weight"]
    pruned = int((first.weight == 0).sum()) + int((last.weight_mask == 0).sum())
    assert pruned == round(0.8 * (first.weight.numel() + last.weight_mask.numel()))


def test_plain_loop_example_reaches_the_final_sparsity() -> None:
    namespace: dict[str, object] = {}
    first, loop = _python_blocks()[:2]
    exec(first + loop, namespace)
    pruner = namespace["pruner"]
    total = pruner.total_count()  # type: ignore[attr-defined]
    assert pruner.pruned_count() == round(0.9 * total)  # type: ignore[attr-defined]
