"""``trainer.train(resume_from_checkpoint=...)`` continues mid-schedule, into a fresh model too:
the checkpoint's masks, the pruner's state (step, history, seed, rewind snapshot), exact counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
from tensorplay.callbacks.transformers.gradual_pruning_callback import GradualPruningCallback
from tests.callbacks.hf_trainer_helpers import StepRecorder, make_trainer, masked_zeros
from tests.hf_models import tiny_gpt2

SCHEDULE = LinearSchedule(0.6, end_step=6, frequency=1)  # prunes at steps 1..6


def _callback(masking: str, rewind: str) -> GradualPruningCallback:
    return GradualPruningCallback(
        SCHEDULE,
        method="random_unstructured",  # the seed matters: it must come back too
        masking=masking,  # type: ignore[arg-type]
        rewind=rewind,  # type: ignore[arg-type]
        verbose=False,
    )


@pytest.mark.parametrize(
    ("masking", "rewind", "restore"),
    [
        pytest.param("reparametrize", "none", False, id="reparametrize"),
        pytest.param("inplace", "init", False, id="inplace-rewind"),
        # The Trainer replaces the callback by one rebuilt from trainer_state.json.
        pytest.param("inplace", "none", True, id="inplace-restore-callback-states"),
    ],
)
def test_resume_into_a_fresh_model_continues_the_schedule(
    masking: str, rewind: str, restore: bool, tmp_path: Path
) -> None:
    first = _callback(masking, rewind)
    recorder = StepRecorder(first)
    trainer = make_trainer(
        tiny_gpt2(seed=0).train(), tmp_path, [first, recorder], max_steps=3,
        save_strategy="steps", save_steps=3,
    )  # fmt: skip
    trainer.train()
    checkpoint = tmp_path / "checkpoint-3"
    assert (checkpoint / "trainer_state.json").is_file()
    saved_state = first.pruner.state_dict()

    fresh = tiny_gpt2(seed=1).train()  # other weights: all of them must come from the checkpoint
    second = _callback(masking, rewind)
    resumed = StepRecorder(second)
    # Another global seed: the pruner's must come from the checkpoint.
    trainer = make_trainer(
        fresh, tmp_path, [second, resumed], max_steps=8, seed=5,
        restore_callback_states_from_checkpoint=restore,
    )  # fmt: skip
    # The state of the first pruner differs from the fresh one's before the resume.
    assert second.pruner.last_step == -1 and second.pruner.history == []
    assert second.pruner.seed == 5 != saved_state["seed"]
    trainer.train(resume_from_checkpoint=str(checkpoint))
    pruning = [c for c in trainer.callback_handler.callbacks if isinstance(c, type(second))]
    assert len(pruning) == 1 and (pruning[0] is not second) == restore  # rebuilt, or kept
    assert pruning[0].pruner is second.pruner  # one pruner: its masks are the model's

    # The masks after the load are the checkpoint's, exactly (under every name of a tied one).
    assert sorted(resumed.begin) == sorted(recorder.masks[3])
    for name, mask in recorder.masks[3].items():
        assert torch.equal(resumed.begin[name], mask), name
    # No unit pruned at the checkpoint comes back; the schedule reaches its exact final count.
    for name, mask in recorder.masks[3].items():
        assert not bool(resumed.masks[8][name][mask == 0].any()), name
    total = second.pruner.total_count()
    counts = {step: round(SCHEDULE(step) * total) for step in range(1, 9)}
    pruned, reached = 0, {}
    for step, _, newly in second.pruner.history:
        pruned += newly
        reached[step] = pruned
    assert reached == {step: counts[step] for step in range(1, 7)}
    if not restore:
        # The Trainer appends the callback it rebuilds after the others: the recorder then
        # reads the masks of each step before that step's pruning.
        assert resumed.pruned == {step: counts[step] for step in range(4, 9)}
    # The pruner's state came back: steps, history, seed, and the rewind snapshot.
    assert second.pruner.history[:3] == saved_state["history"]
    assert [step for step, _, _ in second.pruner.history] == [1, 2, 3, 4, 5, 6]
    assert second.pruner.seed == saved_state["seed"]
    if rewind == "init":
        snapshot = second.pruner.state_dict()["snapshot"]
        assert sorted(snapshot) == sorted(saved_state["snapshot"])
        for name, value in saved_state["snapshot"].items():
            assert torch.equal(snapshot[name], value), name
    assert masked_zeros(fresh) == round(0.6 * total)

    # Random masks depend on the seed and the step alone: the resumed run's are, unit for unit,
    # those of the same run never interrupted (its weights are not: the Trainer's resume is not
    # bit-exact on CPU).
    whole = _callback(masking, rewind)
    straight = StepRecorder(whole)
    make_trainer(
        tiny_gpt2(seed=0).train(), tmp_path / "whole", [whole, straight], max_steps=8
    ).train()
    assert sorted(straight.masks[8]) == sorted(resumed.masks[8])
    for name, mask in straight.masks[8].items():
        assert torch.equal(resumed.masks[8][name], mask), name


def test_resume_without_this_callbacks_state_is_an_error(tmp_path: Path) -> None:
    trainer = make_trainer(
        tiny_gpt2().train(), tmp_path, [], max_steps=2, save_strategy="steps", save_steps=2
    )
    trainer.train()
    pruning = _callback("reparametrize", "none")
    trainer = make_trainer(tiny_gpt2().train(), tmp_path, [pruning], max_steps=4)
    with pytest.raises(ValueError, match=r"trainer_state\.json has none"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_kept_weights_that_are_exactly_zero_stay_kept_after_a_resume(
    masking: str, tmp_path: Path
) -> None:
    """The checkpoint's weights hold every pruned unit as zero; a kept weight that is exactly
    zero too (a frozen, zero-initialised one) comes back kept, from trainer_state.json."""

    def model() -> torch.nn.Module:
        built = tiny_gpt2(seed=0).train()
        frozen = built.transformer.h[1].mlp.c_proj.weight
        frozen.requires_grad_(False)
        with torch.no_grad():
            frozen.zero_()
        return built

    def callback() -> GradualPruningCallback:
        return GradualPruningCallback(
            LinearSchedule(0.5, end_step=4, frequency=2), scope="layerwise",
            masking=masking, verbose=False,  # type: ignore[arg-type]
        )  # fmt: skip

    first = callback()
    recorder = StepRecorder(first)
    make_trainer(
        model(), tmp_path, [first, recorder], max_steps=2, save_strategy="steps", save_steps=2
    ).train()
    mask = recorder.masks[2]["transformer.h.1.mlp.c_proj.weight_mask"]
    assert 0 < int((mask == 0).sum()) < mask.numel()  # half pruned, half kept: all zero

    second = callback()
    resumed = StepRecorder(second)
    trainer = make_trainer(model(), tmp_path, [second, resumed], max_steps=3)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert sorted(resumed.begin) == sorted(recorder.masks[2])
    for name, value in recorder.masks[2].items():
        assert torch.equal(resumed.begin[name], value), name


def test_two_callbacks_resume_each_from_its_latest_saved_state(tmp_path: Path) -> None:
    """The Trainer files the states of several callbacks of one class as a list it appends to at
    every checkpoint: each callback resumes from its own latest entry."""

    def callbacks() -> list[GradualPruningCallback]:
        return [
            GradualPruningCallback(SCHEDULE, include=[r"\.h\.0\."], verbose=False),
            GradualPruningCallback(SCHEDULE, include=[r"\.h\.1\."], verbose=False),
        ]

    first = callbacks()
    make_trainer(
        tiny_gpt2().train(), tmp_path, first, max_steps=3, save_strategy="steps", save_steps=1
    ).train()
    saved = [callback.pruner.state_dict() for callback in first]
    second = callbacks()
    trainer = make_trainer(tiny_gpt2(seed=1).train(), tmp_path, second, max_steps=4)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    for before, after in zip(saved, second, strict=True):
        assert before["history"] == after.pruner.history[:3]
        assert [step for step, _, _ in after.pruner.history] == [1, 2, 3, 4]
