"""docs/distillation.rst: the loop runs as written, and what the page says of it holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tensorplay.ao.pruning import Distillation, dense_copy
from tests.callbacks.test_migration_guide import code_blocks
from tests.hf_models import VOCAB, tiny_gpt2

PAGE = Path(__file__).resolve().parents[2] / "docs" / "distillation.rst"


def test_the_page_has_the_blocks_these_tests_know() -> None:
    assert [language for language, _ in code_blocks(PAGE)] == ["python", "bash"]


def test_the_loop_distils_a_pruned_model_from_its_dense_self() -> None:
    model = tiny_gpt2()
    dense = dense_copy(model)
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, VOCAB, (2, 8), generator=generator) for _ in range(3)]
    namespace: dict[str, Any] = {
        "model": model,
        "batches": [{"input_ids": i, "labels": i} for i in ids],
    }
    exec(compile(code_blocks(PAGE)[0][1], f"{PAGE.name}[0]", "exec"), namespace)
    distill: Distillation = namespace["distill"]
    assert not distill.attached and not model._forward_hooks
    assert namespace["pruner"].sparsity() == 0.9
    teacher = distill.teacher
    assert teacher is not None
    for name, value in dense.state_dict().items():  # the dense model, untouched by training
        assert torch.equal(teacher.state_dict()[name], value), name
    assert distill.last_loss is not None and float(distill.last_loss) > 0
