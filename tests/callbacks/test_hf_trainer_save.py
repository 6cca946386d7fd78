"""After ``Trainer.train``: every default save of a model still under pruning gives a folder that
plain ``from_pretrained`` loads cleanly in a fresh process; lean masks keep pruned weights exactly
zero through AdamW, weight decay and accumulation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import make_trainer, transformers
from tests.hf_models import tiny_gpt2, tiny_llama

SCHEDULE = LinearSchedule(0.7, end_step=4, frequency=2)  # prunes at steps 2 and 4


# Run in a fresh interpreter that never imports tensorplay: each folder loads with plain
# from_pretrained, cleanly, to the logits and zeros the trained model had.
RELOAD = """
import json, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM

for folder in sys.argv[1:]:
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    found = sorted(k for k in config if k in ("sparsity_config", "quantization_config",
                                               "compression_config"))
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    expected = torch.load(folder / "expected.pt", weights_only=True)
    with torch.no_grad():
        logits = model.eval()(expected["tokens"]).logits
    zeros = {name: (model.get_parameter(name) == 0) for name in expected["pruned"]}
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    print(json.dumps({
        "folder": folder.name,
        "problems": {key: list(value) for key, value in info.items() if value},
        "config": found,
        "logits": (logits - expected["logits"]).abs().max().item(),
        "zeros": all(torch.equal(zeros[name], expected["pruned"][name]) for name in zeros),
        "tied": tied,
        "tensorplay": any(name.startswith("tensorplay") for name in sys.modules),
    }))
"""


def _expectations(pruning: GradualPruningCallback, folder: Path) -> None:
    """What a reload of ``folder`` must give: the trained model's logits and pruned units."""
    model = pruning.pruner.model.eval()
    tokens = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(tokens).logits
    pruned = {}
    for target, (module, name) in zip(pruning.pruner.targets, pruning.pruner.pairs, strict=True):
        pruned[target] = getattr(module, name + "_mask") == 0
    torch.save({"tokens": tokens, "logits": logits, "pruned": pruned}, folder / "expected.pt")


@pytest.mark.slow
def test_every_default_save_loads_with_plain_from_pretrained(tmp_path: Path) -> None:
    """``trainer.save_model`` and ``model.save_pretrained`` of a model still under pruning, in
    both masking modes, untied (Llama, GQA) and tied (GPT-2): no make_permanent."""
    runs = [("llama", tiny_llama, "reparametrize"), ("llama", tiny_llama, "inplace"),
            ("gpt2", tiny_gpt2, "inplace")]  # fmt: skip
    folders = []
    for label, build, masking in runs:
        model = build().train()
        pruning = GradualPruningCallback(SCHEDULE, masking=masking, verbose=False)  # type: ignore[arg-type]
        trainer = make_trainer(model, tmp_path / f"run-{label}-{masking}", [pruning])
        trainer.train()
        assert pruning.pruner.pruned_count() == round(0.7 * pruning.pruner.total_count())
        for how in ("save_model", "save_pretrained"):
            folder = tmp_path / f"{label}-{masking}-{how}"
            if how == "save_model":
                trainer.save_model(str(folder))
            else:
                model.save_pretrained(folder)
            _expectations(pruning, folder)
            folders.append((folder, label))
        # The model is still under pruning: its masks, and its training-form state on request.
        assert any(name.endswith("_mask") for name in model.state_dict(keep_vars=True))

    done = subprocess.run(
        [sys.executable, "-c", RELOAD, *(str(folder) for folder, _ in folders)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [result["folder"] for result in results] == [folder.name for folder, _ in folders]
    for result, (_, label) in zip(results, folders, strict=True):
        assert result["problems"] == {}, result
        assert result["config"] == [], result
        assert result["logits"] < 1e-5, result  # a fresh process on the same machine
        assert result["zeros"], result  # exactly the pruned units, no other zero
        assert result["tied"] == (label == "gpt2"), result
        assert not result["tensorplay"], result


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


class NormRecorder(transformers.TrainerCallback):  # type: ignore[misc]
    """The norm of every gradient right before each optimizer step (the Trainer has clipped by
    then), as ``clip_grad_norm_`` computes it."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        grads = [p.grad for p in kwargs["model"].parameters() if p.grad is not None]
        self.norms.append(float(torch.nn.utils.get_total_norm(grads)))


def test_lean_grad_norm_the_trainer_clips_by_and_logs_leaves_out_pruned_weights(
    tmp_path: Path,
) -> None:
    model = tiny_gpt2().train()
    pruning = GradualPruningCallback(SCHEDULE, masking="inplace", verbose=False)
    recorder = NormRecorder()
    # A bound the norm never reaches: the gradients are left as they were when it was computed.
    trainer = make_trainer(
        model, tmp_path, [pruning, recorder], max_grad_norm=1e6, gradient_accumulation_steps=2
    )
    trainer.train()
    logged = [entry["grad_norm"] for entry in trainer.state.log_history if "grad_norm" in entry]
    assert len(logged) == len(recorder.norms) == 6
    # After the pruning steps (2 and 4) the pruned gradients are zero when the Trainer computes
    # the norm, so it is the norm of the kept weights' gradients.
    for step, (norm, expected) in enumerate(zip(logged, recorder.norms, strict=True), start=1):
        assert norm == pytest.approx(expected, rel=1e-5), step
    assert pruning.pruner.pruned_count() == round(0.7 * pruning.pruner.total_count())
