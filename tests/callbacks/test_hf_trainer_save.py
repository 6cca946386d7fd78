"""After ``Trainer.train``: ``trainer.save_model`` gives a folder ``from_pretrained`` loads cleanly;
lean masks keep pruned weights exactly zero through AdamW, weight decay and accumulation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tensorplay.ao.pruning.schedules import LinearSchedule
from tensorplay.callbacks.transformers import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import make_trainer, transformers
from tests.hf_models import tiny_gpt2

SCHEDULE = LinearSchedule(0.7, end_step=4, frequency=2)  # prunes at steps 2 and 4


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_the_saved_folder_reloads_with_no_missing_keys_to_the_same_logits(
    masking: str, tmp_path: Path
) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(
        SCHEDULE,
        masking=masking,
        make_permanent=True,
        verbose=False,  # type: ignore[arg-type]
    )
    trainer = make_trainer(model, tmp_path / "run", [pruning])
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))

    reloaded, info = transformers.GPT2LMHeadModel.from_pretrained(
        tmp_path / "saved", output_loading_info=True
    )
    for problem in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert list(info[problem]) == [], problem
    assert reloaded.lm_head.weight is reloaded.transformer.wte.weight
    assert model.lm_head.weight is model.transformer.wte.weight  # tied again when permanent
    tokens = torch.randint(0, 97, (2, 12))
    model.eval()
    reloaded.eval()
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, model(tokens).logits)
    zeros = sum(int((reloaded.get_parameter(t) == 0).sum()) for t in pruning.pruner.targets)
    assert zeros == round(0.7 * pruning.pruner.total_count())


class LeanWatcher(transformers.TrainerCallback):  # type: ignore[misc]
    """After each optimizer step: the pruned weights' values, and the optimizer's state size."""

    def __init__(self, pruning: GradualPruningCallback) -> None:
        self.pruning = pruning
        self.revived: dict[int, int] = {}
        self.state_sizes: dict[int, int] = {}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = self.pruning.pruner.model
        revived = 0
        for target in self.pruning.pruner.targets:
            module, _, name = target.rpartition(".")
            layer = model.get_submodule(module)
            revived += int((getattr(layer, name)[~getattr(layer, name + "_mask")] != 0).sum())
        self.revived[state.global_step] = revived
        self.state_sizes[state.global_step] = len(kwargs["optimizer"].state)


@pytest.mark.parametrize("reset", [False, True], ids=["keep-state", "reset-state"])
def test_lean_pruned_weights_stay_exactly_zero_through_adamw(reset: bool, tmp_path: Path) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(
        SCHEDULE, masking="inplace", reset_optimizer_state=reset, verbose=False
    )
    watcher = LeanWatcher(pruning)
    trainer = make_trainer(
        model, tmp_path, [pruning, watcher], weight_decay=0.1, gradient_accumulation_steps=2,
        max_grad_norm=1.0,
    )  # fmt: skip
    trainer.train()
    assert watcher.revived == dict.fromkeys(range(1, 7), 0)
    assert pruning.pruner.pruned_count() == round(0.7 * pruning.pruner.total_count())
    # The masks are bool buffers beside plain parameters: no reparametrization, no hook.
    assert model.transformer.h[0].mlp.c_fc.weight_mask.dtype == torch.bool
    assert not model.transformer.h[0].mlp.c_fc._forward_pre_hooks
    all_params = len(list(model.parameters()))
    if reset:  # cleared by the pruning steps (2, 4), refilled by the next optimizer step
        assert watcher.state_sizes == {1: all_params, 2: 0, 3: all_params, 4: 0, 5: all_params,
                                       6: all_params}  # fmt: skip
    else:
        assert watcher.state_sizes == dict.fromkeys(range(1, 7), all_params)
