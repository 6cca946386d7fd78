"""The mix of depth and widths searched under a budget, then pruned while a framework trains:
``search=True`` on both callbacks.

Oracles: the searched pruner the callback builds chooses what ``SearchedPruner`` chooses on a
copy of the dense model; at the end the shrunk model holds the chosen candidate's parameters and
computes the masked model's logits, and its saved folder loads with plain ``from_pretrained``;
the teacher is the dense model (the layers the search removes are in it); a run resumed from a
checkpoint ends with the unbroken run's masks; every refusal comes before anything changes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import SearchedPruner
from tensorplay.ao.pruning.distillation.distill import attached_distillation
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.ao.pruning.structured.units.budget import model_params
from tensorplay.callbacks.core.lifecycle import plain_arguments
from tests.callbacks.hf_trainer_helpers import make_trainer, masks, transformers
from tests.hf_models import tiny_llama
from tests.model_state import unchanged
from tests.moe_models import tiny_qwen3_moe

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOKENS = torch.arange(32).reshape(2, 16) % 90 + 3
MIX = {"layer": 0.5, "channel": 0.5}


def _batches() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(5)
    return [{"input_ids": torch.randint(3, 97, (2, 16), generator=generator)} for _ in range(2)]


def _hf_callback(**options: Any) -> Any:
    from tensorplay.callbacks.transformers import GradualPruningCallback

    arguments: dict[str, Any] = {
        "structure": ["layer", "channel"], "target_params": 0.8, "search": True,
        "search_batches": _batches(), "verbose": False,
    }  # fmt: skip
    arguments.update(options)
    return GradualPruningCallback(LinearSchedule(end_step=4, frequency=2), **arguments)


def _logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(TOKENS).logits.clone()


class _Record(transformers.TrainerCallback):  # type: ignore[misc]
    """The masked model's logits when training ends (put before the pruning callback, which
    shrinks the model then), and the teacher's weights of the last layer at each step."""

    def __init__(self) -> None:
        self.logits: torch.Tensor | None = None
        self.teacher_layers: list[torch.Tensor] = []

    def on_step_end(self, args, state, control, model=None, **_):  # type: ignore[no-untyped-def]
        distillation = attached_distillation(model)
        if distillation is not None and distillation.teacher is not None:
            weight = distillation.teacher.model.layers[-1].mlp.down_proj.weight
            self.teacher_layers.append(weight.detach().clone())

    def on_train_end(self, args, state, control, model=None, **_):  # type: ignore[no-untyped-def]
        self.logits = _logits(model)
        model.train()


def test_the_trainer_prunes_to_the_searched_mix_distils_from_the_dense_model_and_saves_it(
    tmp_path: Path,
) -> None:
    model = tiny_llama()
    dense = copy.deepcopy(model)
    pruning = _hf_callback(search_grid=[MIX], shrink_at_end=True, distill_weight=1.0)
    record = _Record()
    trainer = make_trainer(model, tmp_path / "run", [record, pruning], max_steps=6)
    pruner = pruning.pruner
    assert isinstance(pruner, SearchedPruner)
    oracle = SearchedPruner(
        copy.deepcopy(dense), LinearSchedule(end_step=4, frequency=2), _batches(),
        structure=("layer", "channel"), target_params=0.8, search_grid=[MIX],
    )  # fmt: skip
    assert pruner.search_report() == [
        {**row, "seconds": mine["seconds"]}
        for row, mine in zip(oracle.search_report(), pruner.search_report(), strict=True)
    ]
    trainer.train()
    # The teacher held the layer the search removed, as the dense model had it.
    dropped = dense.model.layers[int(pruner.dropped[0].rsplit(".", 1)[1])].mlp.down_proj.weight
    assert pruner.dropped and record.teacher_layers
    assert all(torch.equal(weight, dropped.detach()) for weight in record.teacher_layers)
    assert model_params(model) == pruner.chosen["params"] == pruning.shrink_report.parameters_after
    assert record.logits is not None
    torch.testing.assert_close(_logits(model), record.logits, atol=1e-5, rtol=1e-4)
    trainer.save_model(str(tmp_path / "saved"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    torch.testing.assert_close(_logits(loaded), record.logits, atol=1e-5, rtol=1e-4)


def test_the_trainer_prunes_experts_and_the_channels_inside_them_to_the_mix(
    tmp_path: Path,
) -> None:
    model = tiny_qwen3_moe()
    pruning = _hf_callback(
        structure=["expert", "channel"], search_allocation={"expert": 0.25, "channel": 0.75},
        shrink_at_end=True,
    )  # fmt: skip
    record = _Record()
    trainer = make_trainer(model, tmp_path / "run", [record, pruning], max_steps=6)
    chosen = pruning.pruner.chosen
    assert chosen["units"]["expert"] > 0 and chosen["units"]["channel"] > 0
    trainer.train()
    assert model_params(model) == chosen["params"] == pruning.shrink_report.parameters_after
    assert record.logits is not None
    torch.testing.assert_close(_logits(model), record.logits, atol=1e-5, rtol=1e-4)
    trainer.save_model(str(tmp_path / "saved"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    torch.testing.assert_close(_logits(loaded), record.logits, atol=1e-5, rtol=1e-4)


def test_a_resumed_trainer_run_ends_with_the_masks_of_the_unbroken_one(tmp_path: Path) -> None:
    unbroken = tiny_llama()
    pruning = _hf_callback(search_allocation=MIX)
    make_trainer(
        unbroken, tmp_path / "run", [pruning], max_steps=6, save_strategy="steps", save_steps=3
    ).train()
    expected = masks(unbroken)
    assert pruning.pruner.history  # the widths pruned on the schedule, after the checkpoint too
    resumed = tiny_llama()
    again = _hf_callback(search_allocation=MIX)
    trainer = make_trainer(
        resumed, tmp_path / "again", [again], max_steps=6, save_strategy="steps", save_steps=3
    )
    trainer.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-3"))
    found = masks(resumed)
    assert found.keys() == expected.keys()
    assert all(torch.equal(found[name], expected[name]) for name in expected)
    assert again.pruner.history == pruning.pruner.history


def test_lightning_prunes_to_the_searched_mix_and_resumes_to_the_same_width(
    tmp_path: Path,
) -> None:
    pytest.importorskip("lightning.pytorch")
    from tensorplay.callbacks import GradualPruning
    from tests.callbacks.lit_helpers import LlamaLM, fit_with_checkpoints

    calibration = [batch["input_ids"] for batch in _batches()]

    def fit(resume: str | None) -> tuple[LlamaLM, Any]:
        module = LlamaLM()
        pruning = GradualPruning(
            LinearSchedule(end_step=4, frequency=2), structure=["layer", "hidden", "channel"],
            target_params=0.75, search=True, search_batches=calibration,
            search_forward=lambda model, ids: model.net(input_ids=ids, labels=ids).loss,
            search_allocation={"layer": 0.25, "hidden": 0.25, "channel": 0.5},
            shrink_at_end=True, verbose=False,
        )  # fmt: skip
        fit_with_checkpoints(module, pruning, tmp_path, 6, resume)
        return module, pruning

    first, pruning = fit(None)
    assert pruning.shrink_report is not None
    assert model_params(first.net) == pruning.shrink_report.parameters_after
    resumed, again = fit(str(tmp_path / "epoch=0-step=3.ckpt"))
    assert resumed.net.config.hidden_size == first.net.config.hidden_size
    assert resumed.net.config.num_hidden_layers == first.net.config.num_hidden_layers
    assert model_params(resumed.net) == model_params(first.net)
    assert str(again.shrink_report) == str(pruning.shrink_report)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"search_batches": None}, r"`search_batches` .* with search=True"),
        ({"search": False, "search_batches": None, "search_grid": 2}, r"search=True with \["),
        ({"scope": "layerwise"}, r"scope='global' \(the default\) with search=True"),
        ({"structure": "channel"}, r"tuple of at least two kinds with search=True"),
        ({"search_grid": 2, "search_allocation": MIX}, r"either `search_grid`.*or"),
        ({"search_score": "mse"}, r"`search_score` to be 'loss' or 'kl'"),
        ({"importance": {"channel": "nope"}}, r"`importance` to name scores"),
        ({"search": False, "search_batches": None, "importance": {"channel": "wanda"}},
         r"a score per kind is for search=True"),
    ],
)  # fmt: skip
def test_search_options_are_checked_when_the_callback_is_made(
    options: dict[str, Any], message: str
) -> None:
    if not options.get("search", True):
        options = {**options, "structure": "channel", "target_params": 0.8}
    with pytest.raises((TypeError, ValueError), match=message):
        _hf_callback(**options)


def test_a_budget_no_candidate_meets_is_refused_when_the_trainer_is_made(tmp_path: Path) -> None:
    model = tiny_llama()
    check = unchanged(model)
    pruning = _hf_callback(target_params=10)
    with pytest.raises(ValueError, match="budget"):
        make_trainer(model, tmp_path / "run", [pruning])
    check()


def test_a_searched_callback_has_no_plain_data_form_with_its_batches() -> None:
    pruning = _hf_callback()
    assert plain_arguments(pruning.config, pruning._session.options) is None
