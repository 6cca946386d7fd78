"""``prune_one_shot(..., search=True)``: the mix of depth and widths searched under a budget.

Each search is checked against what it claims: the candidates are the grid's (counted and listed
independently), exactly one is chosen and it has the lowest score among those meeting the budget,
an oracle (plain ``prune_one_shot`` per kind on a deep copy of the dense model) gives the chosen
candidate's score, the shrunk model holds the report's parameters and computes the masked
model's logits, and every refusal leaves the model as it was.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from fractions import Fraction

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import SearchResult, prune_one_shot, shrink
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.structured.units.budget import model_params
from tensorplay.ao.pruning.structured.units.kept_grid import read_kept_grid
from tests.family_models import FAMILY_MODELS
from tests.model_state import unchanged

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _batches(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(3, 97, (2, 16), generator=generator)} for _ in range(2)]


def _loss(model: nn.Module, batches: list[dict[str, torch.Tensor]]) -> float:
    with torch.no_grad():
        values = [float(model(**b, labels=b["input_ids"]).loss) for b in batches]
    return sum(values) / len(values)


def _grid(kinds: tuple[str, ...], steps: int) -> list[dict[str, float]]:
    """Every allocation with shares in multiples of 1/steps, found by brute force."""
    found = []
    for parts in itertools.product(range(steps + 1), repeat=len(kinds)):
        if sum(parts) == steps:
            found.append(
                {kind: float(Fraction(p, steps)) for kind, p in zip(kinds, parts, strict=True)}
            )
    return found


def _logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


def _check_search(result: SearchResult, kinds: tuple[str, ...], steps: int, budget: int) -> None:
    rows = result.search_report()
    expected = _grid(kinds, steps)
    assert len(rows) == len(expected)
    assert sorted(tuple(r["allocation"].values()) for r in rows) == sorted(
        tuple(a[k] for k in kinds) for a in expected
    )
    assert [list(r["allocation"]) for r in rows] == [list(kinds)] * len(rows)
    assert sum(r["chosen"] is True for r in rows) == 1
    feasible = [r for r in rows if r["meets"]]
    assert feasible and all(r["params"] <= budget for r in feasible)
    assert all(r["params"] > budget for r in rows if r["params"] is not None and not r["meets"])
    assert result.chosen["score"] == min(r["score"] for r in feasible)
    assert result.chosen["meets"] and result.chosen["reason"] is None
    assert all(r["reason"] for r in rows if r["params"] is None)
    assert list(result.pruners) == [k for k in kinds if result.chosen["units"].get(k)]


def test_llama_layer_head_channel() -> None:
    """Tiny Llama (GQA): 3 kinds in halves, 6 candidates; lands within one layer of the budget."""
    model = FAMILY_MODELS["llama"].build()
    batches = _batches()
    total = model_params(model)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    budget = int(0.7 * total)
    kinds = ("layer", "head", "channel")
    result = prune_one_shot(
        model, batches, target_params=budget, structure=("channel", "layer", "head"),
        search=True, search_grid=2, make_permanent=False,
    )  # fmt: skip
    _check_search(result, kinds, 2, budget)
    for row in result.search_report():
        if row["meets"]:
            assert budget - row["params"] < layer, row  # within one unit of the coarsest kind
    masked = _logits(model, batches[0])
    assert (
        read_kept_grid(model).count == result.chosen["params"]
    )  # the plan's count is the shrunk count
    report = shrink(model)
    assert report.parameters_after == result.chosen["params"] <= budget
    torch.testing.assert_close(_logits(model, batches[0]), masked, atol=1e-5, rtol=1e-5)


def test_gpt2_chosen_score_matches_the_oracle() -> None:
    """GPT-2 (Conv1D, tied LM head): the chosen candidate, realized again with plain
    ``prune_one_shot`` calls per kind (as many units in every layer) on a deep copy of the dense
    model, has the same score."""
    model = FAMILY_MODELS["gpt2"].build()
    dense = copy.deepcopy(model)
    batches = _batches(1)
    budget = int(0.75 * model_params(model))
    result = prune_one_shot(
        model, batches, target_params=budget, structure=("head", "channel"), search=True,
        search_grid=4, make_permanent=False,
    )  # fmt: skip
    _check_search(result, ("head", "channel"), 4, budget)
    units = result.chosen["units"]
    totals = {"head": 2 * 4, "channel": 2 * 128}  # 2 blocks of 4 heads and 128 FFN channels
    for kind in ("head", "channel"):
        if units.get(kind):
            prune_one_shot(
                dense, batches, units[kind] / totals[kind], structure=kind, scope="layerwise",
                make_permanent=False,
            )  # fmt: skip
    # The same masks on the same weights: only float summation order may differ.
    assert _loss(dense, batches) == pytest.approx(result.chosen["score"], abs=1e-5)
    masked = _logits(model, batches[0])
    torch.testing.assert_close(_logits(dense, batches[0]), masked, atol=1e-6, rtol=1e-6)
    assert shrink(model).parameters_after == result.chosen["params"] <= budget
    torch.testing.assert_close(_logits(model, batches[0]), masked, atol=1e-5, rtol=1e-5)


def test_gpt2_hidden_and_layer_made_permanent() -> None:
    """Depth then the hidden width (the width pruned in the blocks that remain), permanent."""
    model = FAMILY_MODELS["gpt2"].build()
    batches = _batches(2)
    budget = int(0.8 * model_params(model))
    result = prune_one_shot(
        model, batches, target_params=budget, structure=("hidden", "layer"), search=True,
        search_grid=[{"hidden": 0.5, "layer": 0.5}],
    )  # fmt: skip
    rows = result.search_report()
    assert [r["allocation"] for r in rows] == [
        {"layer": 0.5, "hidden": 0.5}, {"layer": 1.0, "hidden": 0.0},
        {"layer": 0.0, "hidden": 1.0},
    ]  # fmt: skip
    assert not any(name.endswith("_orig") for name, _ in model.named_parameters())
    masked = _logits(model, batches[0])
    assert shrink(model).parameters_after == result.chosen["params"] <= budget
    torch.testing.assert_close(_logits(model, batches[0]), masked, atol=1e-5, rtol=1e-5)


def test_moe_experts_and_channels() -> None:
    """Qwen3-MoE: experts and (routed experts') channels; active parameters reported."""
    model = FAMILY_MODELS["qwen3_moe"].build()
    batches = _batches(3)
    budget = int(0.8 * model_params(model))
    result = prune_one_shot(
        model, batches, target_params=budget, structure=("expert", "channel"), search=True,
        search_grid=2, importance={"channel": "magnitude"}, make_permanent=False,
    )  # fmt: skip
    _check_search(result, ("channel", "expert"), 2, budget)
    rows = [r for r in result.search_report() if r["params"] is not None]
    assert rows and all(r["active_params"] <= r["params"] for r in rows)
    masked = _logits(model, batches[0])
    assert shrink(model).parameters_after == result.chosen["params"] <= budget
    torch.testing.assert_close(_logits(model, batches[0]), masked, atol=1e-5, rtol=1e-5)


def test_shrink_taken_back_exactly() -> None:
    """Masks of every kind in turn, then shrink, inside a transaction that keeps values: the
    failure takes it all back."""
    model = FAMILY_MODELS["llama"].build()
    batches = _batches()
    check = unchanged(model)
    with pytest.raises(KeyError), changes.transaction(keep_values=True):
        for kind in ("layer", "hidden", "head", "channel"):
            prune_one_shot(model, batches, 0.25, structure=kind, make_permanent=False)
        counted = read_kept_grid(model).count
        assert shrink(model).parameters_after == counted
        raise KeyError("taken back")
    check()


def test_no_candidate_meets_the_budget() -> None:
    model = FAMILY_MODELS["llama"].build()
    check = unchanged(model)
    with pytest.raises(ValueError, match="meet every budget"):
        prune_one_shot(
            model, _batches(), target_params=0.05, structure=("head", "channel"), search=True,
            search_grid=2,
        )  # fmt: skip
    check()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        pytest.param({"structure": ("head", "channel")}, ValueError, "no budget",
                     id="no-budget"),
        pytest.param({"structure": ("channel",), "target_params": 0.8}, ValueError,
                     "at least two kinds", id="one-kind"),
        pytest.param({"structure": "channel", "target_params": 0.8}, ValueError,
                     "at least two kinds", id="a-string"),
        pytest.param({"structure": ("channel", "row"), "target_params": 0.8}, ValueError,
                     "distinct kinds", id="unknown-kind"),
        pytest.param({"structure": ("channel", "channel"), "target_params": 0.8}, ValueError,
                     "distinct kinds", id="repeated-kind"),
        pytest.param({"structure": ("head", "channel"), "target_params": 0.8, "search_grid": 0},
                     ValueError, "search_grid", id="grid-zero"),
        pytest.param({"structure": ("head", "channel"), "target_params": 0.8,
                      "search_grid": "fine"}, TypeError, "search_grid", id="grid-str"),
        pytest.param({"structure": ("head", "channel"), "target_params": 0.8,
                      "search_grid": [{"head": 0.5, "channel": 0.4}]}, ValueError,
                     "sum to 1", id="grid-sum"),
        pytest.param({"structure": ("head", "channel"), "target_params": 0.8,
                      "search_grid": [{"layer": 1.0}]}, ValueError, "'layer'",
                     id="grid-kind"),
        pytest.param({"structure": ("head", "channel"), "target_params": 0.8,
                      "search_grid": [{"head": 1.5, "channel": -0.5}]}, ValueError,
                     r"\[0, 1\]", id="grid-share"),
        pytest.param({"structure": ("head", "channel"), "target_params": 0.8,
                      "importance": 3}, TypeError, "importance", id="importance"),
        pytest.param({"structure": ("head", "channel"), "target_params": 0.8,
                      "reconstruct": True}, ValueError, "reconstruct", id="reconstruct"),
        pytest.param({"structure": "channel", "target_params": 0.8, "search": False,
                      "search_grid": 2}, ValueError, "search_grid", id="grid-without-search"),
        pytest.param({"structure": ("head", "channel"), "target_params": 0.8, "search": 1},
                     TypeError, "search", id="search-not-bool"),
        pytest.param({"structure": ("head", "channel"), "target_params": 0.8,
                      "search_score": "mse"}, ValueError, "search_score", id="score-unknown"),
        pytest.param({"structure": "channel", "target_params": 0.8, "search": False,
                      "search_score": "kl"}, ValueError, "search_score", id="kl-without-search"),
    ],
)  # fmt: skip
def test_bad_options_refused(kwargs: dict, error: type[Exception], match: str) -> None:
    model = FAMILY_MODELS["llama"].build()
    check = unchanged(model)
    options = {"search": True, **kwargs}
    with warnings.catch_warnings(), pytest.raises(error, match=match):
        prune_one_shot(model, _batches(), **options)
    check()


def test_batches_without_a_loss_refused() -> None:
    model = FAMILY_MODELS["llama"].build()
    check = unchanged(model)
    with pytest.raises(TypeError, match="forward="):
        prune_one_shot(
            model, [{"inputs_embeds": torch.randn(2, 16, 32)}], target_params=0.8,
            structure=("head", "channel"), search=True,
        )  # fmt: skip
    check()


def test_token_tensors_score_as_their_input_ids() -> None:
    batches = _batches(2)
    found = []
    for given in (batches, [batch["input_ids"] for batch in batches]):
        model = FAMILY_MODELS["llama"].build()
        result = prune_one_shot(
            model, given, target_params=0.8, structure=("head", "channel"), search=True,
            search_grid=2, importance="magnitude", make_permanent=False,
        )  # fmt: skip
        found.append([(row["params"], row["score"]) for row in result.search_report()])
    assert found[0] == found[1]


def test_forward_scores() -> None:
    """A given ``forward`` scores the candidates: here the negated loss, so the choice flips to
    the candidate of the highest loss."""
    model = FAMILY_MODELS["gpt2"].build()
    batches = _batches(4)

    def negated(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return -model(**batch, labels=batch["input_ids"]).loss

    result = prune_one_shot(
        model, batches, target_params=0.8, structure=("head", "channel"), search=True,
        search_grid=2, forward=negated, make_permanent=False,
    )  # fmt: skip
    feasible = [r for r in result.search_report() if r["meets"]]
    assert len(feasible) >= 2
    assert result.chosen["score"] == min(r["score"] for r in feasible) < 0


def test_a_tied_head_is_counted_once_so_a_kind_alone_lands_where_its_own_budget_does() -> None:
    model = FAMILY_MODELS["gpt2"].build()  # its LM head is the token embedding
    budget = int(0.8 * sum(p.numel() for p in model.parameters()))
    result = prune_one_shot(
        model, _batches(), target_params=budget, structure=("hidden", "channel"), search=True,
        search_grid=2, importance="magnitude", make_permanent=False,
    )  # fmt: skip
    alone = next(r for r in result.search_report() if r["allocation"]["channel"] == 1.0)
    reference = FAMILY_MODELS["gpt2"].build()
    prune_one_shot(
        reference, _batches(), target_params=budget, structure="channel", scope="layerwise",
        importance="magnitude",
    )  # fmt: skip
    shrink(reference)
    assert alone["params"] == sum(p.numel() for p in reference.parameters()) <= budget


def test_kl_scores_each_candidate_by_its_divergence_from_the_dense_model() -> None:
    """``search_score="kl"``: the chosen candidate, realized again on a deep copy, diverges
    from the dense model's next-token distributions by its row's score (KL by hand)."""
    model = FAMILY_MODELS["gpt2"].build()
    dense = copy.deepcopy(model)
    batches = _batches(3)
    with torch.no_grad():
        reference = [dense(**batch).logits.log_softmax(-1) for batch in batches]
    budget = int(0.8 * model_params(model))
    result = prune_one_shot(
        model, batches, target_params=budget, structure=("head", "channel"), search=True,
        search_grid=2, search_score="kl", make_permanent=False,
    )  # fmt: skip
    feasible = [row for row in result.search_report() if row["meets"]]
    assert result.chosen["score"] == min(row["score"] for row in feasible)
    assert all(row["score"] > 0 for row in feasible)  # every candidate prunes something
    units = result.chosen["units"]
    totals = {"head": 2 * 4, "channel": 2 * 128}
    for kind in ("head", "channel"):
        if units.get(kind):
            prune_one_shot(
                dense, batches, units[kind] / totals[kind], structure=kind, scope="layerwise",
                make_permanent=False,
            )  # fmt: skip
    with torch.no_grad():
        by_hand = [
            (p.exp() * (p - dense(**batch).logits.log_softmax(-1))).sum(-1).mean()
            for p, batch in zip(reference, batches, strict=True)
        ]
    assert float(sum(by_hand)) / len(by_hand) == pytest.approx(result.chosen["score"], abs=1e-6)


def test_hidden_units_are_planned_in_the_multiple_the_hidden_pruner_prunes_in() -> None:
    """Llama states ``head_dim`` apart from ``hidden_size``: its hidden width goes in multiples
    of the 4 query heads, and every candidate's hidden count is one (none is lost to a count
    the pruner cannot take)."""
    model = FAMILY_MODELS["llama"].build()
    mixes = [{"layer": 0.5, "hidden": 0.25, "channel": 0.25},
             {"layer": 0.5, "hidden": 0.5, "channel": 0.0},
             {"layer": 0.34, "hidden": 0.33, "channel": 0.33}]  # fmt: skip
    result = prune_one_shot(
        model, _batches(2), target_params=0.5, structure=("layer", "hidden", "channel"),
        search=True, search_grid=mixes, make_permanent=False,
    )  # fmt: skip
    rows = result.search_report()[: len(mixes)]  # then each kind alone
    assert [row["reason"] for row in rows] == [None, None, None]
    assert all(row["units"].get("hidden", 0) % 4 == 0 for row in rows)
    assert [row["units"].get("hidden", 0) for row in rows] == [4, 12, 4]


@pytest.mark.parametrize(("dtype", "step"), [(torch.float32, 4), (torch.bfloat16, 8)])
def test_channels_inside_experts_are_planned_in_the_kernels_16_byte_rows(
    dtype: torch.dtype, step: int
) -> None:
    """Shrinking keeps an expert's width a multiple of 16 bytes (4 channels in float32, 8 in
    bfloat16): the search plans each expert's channels in that multiple, so what the masks
    prune is what shrinking removes, and a channel candidate meets the budget it was sized
    for."""
    model = FAMILY_MODELS["qwen3_moe"].build().to(dtype)
    experts = 2 * model.config.num_experts  # channel groups: one per expert of each layer
    result = prune_one_shot(
        model, _batches(3), target_params=0.8, structure=("expert", "channel"), search=True,
        search_grid=[{"channel": 1.0}], make_permanent=False,
    )  # fmt: skip
    (row,) = [
        r for r in result.search_report() if r["allocation"] == {"channel": 1.0, "expert": 0.0}
    ]
    assert row["reason"] is None and row["meets"]
    assert row["units"]["channel"] % (step * experts) == 0
    assert shrink(model).parameters_after == result.chosen["params"]
