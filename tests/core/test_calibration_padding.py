"""Padding left out of calibration: a tokenizer pads a batch (``padding=True``) and marks it in
``attention_mask``; the padding's positions are no tokens of the calibration text. Oracles: what
the padding holds changes no score, no mask and no search score; a padded batch scores as its
sequences do unpadded, one by one; a layer that cannot tell padding apart is refused, naming it,
with the model as it was."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import OneShotSchedule, Pruner, prune_one_shot
from tensorplay.ao.pruning.calibration.padding import padding_of, real_rows, real_samples
from tensorplay.ao.pruning.pruner.one_shot import calibrate
from tests.hf_models import VOCAB, tiny_llama
from tests.model_state import unchanged
from tests.moe_models import tiny_qwen2_moe, tiny_qwen3_moe

pytest.importorskip("transformers")

LENGTHS = (7, 4, 6)
"""Three sequences right-padded to 7 tokens."""


def _padded(pad: Callable[[int], Tensor]) -> dict[str, Tensor]:
    """The three sequences' tokens (the same for every ``pad``), padded with ``pad(count)``."""
    generator = torch.Generator().manual_seed(3)
    rows, masks = [], []
    for length in LENGTHS:
        real = torch.randint(3, VOCAB, (length,), generator=generator)
        rows.append(torch.cat([real, pad(max(LENGTHS) - length)]))
        masks.append(torch.arange(max(LENGTHS)) < length)
    return {"input_ids": torch.stack(rows), "attention_mask": torch.stack(masks).long()}


def _zeros(count: int) -> Tensor:
    return torch.zeros(count, dtype=torch.long)


def _noise(count: int) -> Tensor:
    return torch.randint(3, VOCAB, (count,), generator=torch.Generator().manual_seed(count))


def _unpadded() -> list[dict[str, Tensor]]:
    """Each sequence alone, without padding or a mask."""
    batch = _padded(_zeros)
    return [
        {"input_ids": batch["input_ids"][i : i + 1, :length]} for i, length in enumerate(LENGTHS)
    ]


def _masks(model: nn.Module) -> dict[str, Tensor]:
    return {key: value for key, value in model.state_dict().items() if key.endswith("_mask")}


CASES = [
    (tiny_llama, "channel", "activation", None),
    (tiny_llama, "head", "activation", None),
    (tiny_llama, "hidden", "activation", None),
    (tiny_llama, "element", "wanda", None),
    (tiny_qwen2_moe, "channel", "activation", [r"shared_expert\."]),  # reads tokens flattened
    (tiny_qwen3_moe, "expert", "reap", None),
]


@pytest.mark.parametrize(("build", "structure", "importance", "include"), CASES)
def test_what_the_padding_holds_changes_no_mask(
    build: Callable[[], nn.Module], structure: str, importance: str, include: list[str] | None
) -> None:
    masks = []
    for pad in (_zeros, _noise):
        model = build()
        prune_one_shot(model, [_padded(pad)], sparsity=0.5, structure=structure,
                       importance=importance, make_permanent=False, include=include)  # fmt: skip
        masks.append(_masks(model))
    assert masks[0].keys() == masks[1].keys() and masks[0]
    for key in masks[0]:
        assert torch.equal(masks[0][key], masks[1][key]), key


@pytest.mark.parametrize("structure", ["channel", "head", "hidden"])
def test_a_padded_batch_scores_as_its_sequences_unpadded(structure: str) -> None:
    scores = []
    for batches in ([_padded(_noise)], _unpadded()):
        model = tiny_llama()
        pruner = Pruner(model, OneShotSchedule(0.5), structure=structure,  # type: ignore[arg-type]
                        importance="activation")  # fmt: skip
        calibrate(pruner, batches)
        groups = pruner.structure.groups
        scores.append(torch.cat([pruner.importance.unit_scores(g) for g in groups]))  # type: ignore[misc]
    torch.testing.assert_close(scores[0], scores[1], atol=1e-5, rtol=1e-5)


def test_wanda_sums_the_real_tokens_alone() -> None:
    sums = []
    for batches in ([_padded(_noise)], _unpadded()):
        model = tiny_llama()
        pruner = Pruner(model, OneShotSchedule(0.5), importance="wanda")
        calibrate(pruner, batches)
        sums.append(torch.cat([t.flatten() for t in pruner.importance.scores(pruner._targets)]))
    torch.testing.assert_close(sums[0], sums[1], atol=1e-4, rtol=1e-5)


def test_the_search_scores_the_real_tokens_alone() -> None:
    reports = []
    for pad in (_zeros, _noise):
        found = prune_one_shot(
            tiny_llama(), [_padded(pad)], target_params=0.8, structure=("layer", "channel"),
            search=True, search_grid=2,
        )  # fmt: skip
        reports.append([(row["units"], row["score"]) for row in found.search_report()])
    assert [units for units, _ in reports[0]] == [units for units, _ in reports[1]]
    for (_, first), (_, second) in zip(reports[0], reports[1], strict=True):
        assert first == pytest.approx(second, rel=1e-5)


class _Pooled(nn.Module):
    """Embeds tokens, averages them over the sequence, then a two-layer head: the head reads
    one row per sequence, not per token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.head = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 2))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.head(self.embed(input_ids).mean(dim=1))


def test_a_layer_that_cannot_tell_padding_apart_is_refused_naming_it() -> None:
    model = _Pooled()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"'head\.0'.*attention_mask \(3, 7\)"):
        prune_one_shot(model, [_padded(_zeros)], sparsity=0.5, importance="wanda",
                       parameters=["head.0.weight"])  # fmt: skip
    check()
    prune_one_shot(model, [{"input_ids": _padded(_zeros)["input_ids"]}], sparsity=0.5,
                   importance="wanda", parameters=["head.0.weight"])  # fmt: skip


def test_the_helpers_leave_out_the_padding_by_hand() -> None:
    batch = {"attention_mask": torch.tensor([[1, 1, 0], [0, 0, 0]])}
    x = torch.arange(12.0).reshape(2, 3, 2)
    with padding_of(batch):
        assert real_rows(x, "m").tolist() == [[0.0, 1.0], [2.0, 3.0]]
        assert real_rows(x.reshape(6, 2), "m").tolist() == [[0.0, 1.0], [2.0, 3.0]]
        samples = real_samples(x, "m")  # the second sample holds no real token
        assert samples.tolist() == [[[0.0, 1.0], [2.0, 3.0], [0.0, 0.0]]]
        with pytest.raises(ValueError, match="'m'"):
            real_rows(torch.ones(5, 2), "m")
    with padding_of({"attention_mask": torch.ones(2, 3)}):  # no padding: every position
        assert real_rows(x, "m").shape == (6, 2)
