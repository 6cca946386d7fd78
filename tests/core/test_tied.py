"""Tied (shared) parameters: one unit set with one mask in every holder, counted once, the tie
restored by ``make_permanent``, state_dicts and ``restore_pruning`` with aliases and Hugging
Face's de-duplicated keys, and the functional API's warning about holders it leaves unmasked."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import aliases
from tensorplay.ao.pruning.masking.restore import restore_pruning
from tensorplay.ao.pruning.masking.stats import sparsity_report
from tensorplay.ao.pruning.parity.aliases import alias_map, parameter_groups
from tensorplay.ao.pruning.parity.global_unstructured import global_unstructured
from tensorplay.ao.pruning.parity.methods import (
    L1Unstructured,
    custom_from_mask,
    identity,
    l1_unstructured,
    random_unstructured,
)
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tests.hf_models import tiny_bert, tiny_gpt2
from tests.model_state import unchanged


@dataclass
class Case:
    """A model with one tied parameter, what to feed it, the names to prune (tied ones
    included) and every name of the tied parameter (first: its canonical name)."""

    model: nn.Module
    inputs: Tensor
    targets: list[str]
    tied: tuple[str, ...]

    def run(self) -> Tensor:
        out = self.model(self.inputs)
        return out.logits if hasattr(out, "logits") else out  # type: ignore[no-any-return]


class EmbeddingHead(nn.Module):
    """A language-model toy: the head shares the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(20, 8)
        self.mlp = nn.Linear(8, 8)
        self.lm_head = nn.Linear(8, 20, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: Tensor) -> Tensor:
        return self.lm_head(torch.relu(self.mlp(self.wte(ids))))  # type: ignore[no-any-return]


def shared_linears(seed: int = 0) -> Case:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)
    )
    model[2].weight = model[0].weight
    return Case(model, torch.randn(5, 16), ["2.weight", "4.weight"], ("0.weight", "2.weight"))


def registered_twice(seed: int = 0) -> Case:
    torch.manual_seed(seed)
    shared = nn.Linear(8, 8)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.ReLU(), nn.Linear(8, 3))
    return Case(
        model, torch.randn(5, 8), ["0.weight", "2.weight", "4.weight"], ("0.weight", "2.weight")
    )


def embedding_head(seed: int = 0) -> Case:
    torch.manual_seed(seed)
    ids = torch.tensor([[1, 5, 7, 19], [0, 2, 2, 3]])
    return Case(
        EmbeddingHead(), ids, ["lm_head.weight", "mlp.weight"], ("wte.weight", "lm_head.weight")
    )


def gpt2(seed: int = 0) -> Case:
    model = tiny_gpt2(seed)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    targets = [
        "lm_head.weight",
        "transformer.h.0.attn.c_attn.weight",
        "transformer.h.1.mlp.c_fc.weight",
    ]
    return Case(model, ids, targets, ("transformer.wte.weight", "lm_head.weight"))


def bert(seed: int = 0) -> Case:
    model = tiny_bert(seed)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    targets = ["cls.predictions.decoder.weight", "bert.encoder.layer.0.attention.self.query.weight"]
    return Case(
        model,
        ids,
        targets,
        ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"),
    )


CASES = [
    pytest.param(shared_linears, id="shared-linear"),
    pytest.param(registered_twice, id="registered-twice"),
    pytest.param(embedding_head, id="embedding-head"),
    pytest.param(gpt2, id="gpt2"),
    pytest.param(bert, id="bert"),
]
PLAIN_CASES = CASES[:3]


def pairs_of(model: nn.Module, tied: tuple[str, ...]) -> list[tuple[nn.Module, str]]:
    return list(alias_map(model)[tied[0]].pairs)


def zeros(t: Tensor) -> int:
    return int((t == 0).sum())


def model_state(model: nn.Module) -> dict[str, Tensor]:
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def hooks(model: nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) for m in model.modules())


def prune(case: Case, sparsity: float = 0.5, **kwargs: object) -> Pruner:
    pruner = Pruner(case.model, OneShotSchedule(sparsity), parameters=case.targets, **kwargs)  # type: ignore[arg-type]
    pruner.step()
    return pruner


# -- selection --------------------------------------------------------------------------------


@pytest.mark.parametrize("make", CASES)
def test_any_alias_selects_the_tensor_once_under_its_first_name(make: Callable[[], Case]) -> None:
    case = make()
    tied = case.tied
    others = [name for name in case.targets if name not in tied]
    for names in ([tied[1]], [tied[0]], [tied[1], tied[0]]):
        pruner = Pruner(case.model, OneShotSchedule(0.5), parameters=names + others)
        assert pruner.targets == [tied[0], *others]
        assert pruner.aliases[tied[0]] == tied
    param = case.model.get_parameter(tied[0])
    others_numel = sum(case.model.get_parameter(name).numel() for name in others)
    assert pruner.total_count() == param.numel() + others_numel


# -- masking every holder ---------------------------------------------------------------------


@pytest.mark.parametrize("make", CASES)
def test_every_holder_computes_with_one_shared_mask(make: Callable[[], Case]) -> None:
    case = make()
    pruner = prune(case)
    pairs = pairs_of(case.model, case.tied)
    assert len(pairs) == (1 if make is registered_twice else 2)
    first, name = pairs[0]
    mask = first.get_buffer(name + "_mask")
    orig = first.get_parameter(name + "_orig")
    assert 0 < zeros(mask) < mask.numel()
    for module, attribute in pairs:
        assert module.get_buffer(attribute + "_mask") is mask
        assert module.get_parameter(attribute + "_orig") is orig
        assert torch.equal(getattr(module, attribute), mask * orig)  # what it computes with
    assert pruner.pruned_count() == round(0.5 * pruner.total_count())
    assert sum(row.pruned for row in pruner.report().rows) == pruner.pruned_count()
    assert [row.name for row in pruner.report().rows] == pruner.targets


@pytest.mark.parametrize("make", CASES)
def test_make_permanent_restores_the_tie_and_keeps_outputs_and_counts(
    make: Callable[[], Case],
) -> None:
    case = make()
    pruner = prune(case)
    expected = case.run()
    counts = (pruner.pruned_count(), pruner.total_count(), pruner.sparsity(), str(pruner.report()))
    dense_keys = sorted(make().model.state_dict())
    assert sorted(case.model.state_dict()) != dense_keys  # reparametrized
    pruner.make_permanent()
    assert torch.equal(case.run(), expected)  # bit for bit
    modules = [pair[0] for pair in pairs_of(case.model, case.tied)]
    names = [pair[1] for pair in pairs_of(case.model, case.tied)]
    params = [module._parameters[name] for module, name in zip(modules, names, strict=True)]
    assert all(param is params[0] for param in params)  # one Parameter again
    for alias in case.tied:
        assert case.model.get_parameter(alias) is params[0]
    assert sorted(case.model.state_dict()) == dense_keys
    assert (
        pruner.pruned_count(),
        pruner.total_count(),
        pruner.sparsity(),
        str(pruner.report()),
    ) == counts
    assert hooks(case.model) == 0


def test_reparametrize_gives_all_holders_one_mask_of_ones() -> None:
    case = embedding_head()
    pruner = Pruner(case.model, OneShotSchedule(0.5, step=3), parameters=case.targets)
    pruner.reparametrize()
    model = case.model
    assert model.wte.weight_mask is model.lm_head.weight_mask
    assert model.wte.weight_orig is model.lm_head.weight_orig
    assert torch.equal(model.wte.weight_mask, torch.ones(20, 8))
    assert pruner.pruned_count() == 0
    for step in range(4):
        pruner.step(step)
    assert model.wte.weight_mask is model.lm_head.weight_mask  # pruned in place
    assert pruner.pruned_count() == round(0.5 * (160 + 64))


def test_layerwise_prunes_a_tied_target_once_to_the_target() -> None:
    case = shared_linears()
    pruner = prune(case, 0.75, scope="layerwise")
    mask = case.model[0].weight_mask
    assert mask is case.model[2].weight_mask
    assert zeros(mask) == round(0.75 * 256)
    assert zeros(case.model[4].weight_mask) == round(0.75 * 64)
    assert pruner.pruned_count() == round(0.75 * 256) + round(0.75 * 64)


def test_min_density_caps_a_tied_target_once() -> None:
    case = embedding_head()
    with torch.no_grad():
        case.model.wte.weight.mul_(1e-3)  # lowest scores: global selection would take it first
    pruner = prune(case, 0.6, min_density=0.3)
    mask = case.model.wte.weight_mask
    assert mask is case.model.lm_head.weight_mask
    assert zeros(mask) == 112  # capped: 48 of its 160 units kept
    assert zeros(case.model.mlp.weight_mask) == round(0.6 * 224) - 112
    assert pruner.pruned_count() == round(0.6 * 224)


def test_snapshot_and_rewind_by_parameter_refresh_every_holder() -> None:
    case = embedding_head()
    pruner = Pruner(case.model, LinearSchedule(0.5, end_step=2), parameters=case.targets)
    initial = pruner.snapshot()
    assert sorted(initial) == ["mlp.weight", "wte.weight"]
    pruner.reparametrize()
    for step in range(3):
        pruner.step(step)
        with torch.no_grad():
            case.model.wte.weight_orig.add_(1.0)
    model = case.model
    assert not torch.equal(model.wte.weight_orig, initial["wte.weight"])
    pruner.rewind({"lm_head.weight": initial["wte.weight"]})  # any alias names the target
    assert torch.equal(model.wte.weight_orig, initial["wte.weight"])
    for module in (model.wte, model.lm_head):
        assert torch.equal(module.weight, initial["wte.weight"] * module.weight_mask)
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"'wte.weight' and 'lm_head.weight' name the same tied"):
        pruner.rewind(
            {"wte.weight": initial["wte.weight"], "lm_head.weight": initial["wte.weight"]}
        )
    check()


def test_holders_pruned_differently_are_refused_before_any_change() -> None:
    case = embedding_head()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the functional API warns: that is the point here
        l1_unstructured(case.model.lm_head, "weight", amount=10)
    check = unchanged(case.model)
    with pytest.raises(
        ValueError,
        match=r"Expected the holders of the tied parameter 'wte.weight' \('wte.weight', "
        r"'lm_head.weight'\) to be pruned alike, but \(Linear, 'weight'\) is pruned and "
        r"\(Embedding, 'weight'\) is not: prune all its pairs in one global_unstructured call, "
        r"or remove\(\) the pruning first.",
    ):
        Pruner(case.model, OneShotSchedule(0.5), parameters=["wte.weight"])
    check()


def test_a_pruned_parameter_name_is_refused() -> None:
    model = nn.Sequential(nn.Linear(3, 3))
    identity(model[0], "weight")
    check = unchanged(model)
    with pytest.raises(
        ValueError, match=r"is the parameter of a pruned tensor: name the tensor, '0.weight'"
    ):
        Pruner(model, OneShotSchedule(0.5), parameters=["0.weight_orig"])
    check()


def test_sparsity_report_lists_a_tied_tensor_once() -> None:
    case = embedding_head()
    prune(case)
    rows = sparsity_report(case.model).rows
    assert [row.name for row in rows] == ["wte.weight", "mlp.weight"]
    assert sum(row.pruned for row in rows) == round(0.5 * 224)


# -- state_dicts and restore_pruning ---------------------------------------------------------


@pytest.mark.parametrize("make", CASES)
def test_a_torch_state_dict_with_every_alias_restores_one_shared_mask(
    make: Callable[[], Case],
) -> None:
    case = make()
    pruner = prune(case)
    state = model_state(case.model)
    tied = case.tied
    assert {tied[1] + "_orig", tied[1] + "_mask"} <= set(state)  # every alias is saved
    pruned = [g.names for g in parameter_groups(case.model) if g.name in pruner.targets]
    fresh = make(seed=1)
    fresh.inputs = case.inputs
    assert restore_pruning(fresh.model, state) == [name for names in pruned for name in names]
    fresh.model.load_state_dict(state, strict=True)
    pairs = pairs_of(fresh.model, tied)
    for module, name in pairs:
        assert module.get_buffer(name + "_mask") is pairs[0][0].get_buffer(pairs[0][1] + "_mask")
        assert module.get_parameter(name + "_orig") is pairs[0][0].get_parameter(
            pairs[0][1] + "_orig"
        )
    assert torch.equal(fresh.run(), case.run())
    resumed = Pruner(fresh.model, OneShotSchedule(0.5), parameters=case.targets)
    assert resumed.pruned_count() == round(0.5 * resumed.total_count())
    resumed.make_permanent()
    assert fresh.model.get_parameter(tied[0]) is fresh.model.get_parameter(tied[1])


def _deduplicated(state: dict[str, Tensor], alias: str) -> dict[str, Tensor]:
    """What Hugging Face's save_pretrained leaves of a tied alias pruned on its own: the
    ``_mask`` without its ``_orig``."""
    return {key: value for key, value in state.items() if key != alias + "_orig"}


@pytest.mark.parametrize("make", [PLAIN_CASES[0], PLAIN_CASES[2], CASES[3]])
def test_an_orphan_mask_of_a_tied_alias_is_recognised(make: Callable[[], Case]) -> None:
    case = make()
    prune(case)
    alias = case.tied[1]
    state = _deduplicated(model_state(case.model), alias)
    fresh = make(seed=1)
    fresh.inputs = case.inputs
    restore_pruning(fresh.model, state)
    result = fresh.model.load_state_dict(state, strict=False)
    assert result.missing_keys == [alias + "_orig"]  # the alias HF drops: the tie supplies it
    assert result.unexpected_keys == []
    pairs = pairs_of(fresh.model, case.tied)
    assert pairs[0][0].get_buffer("weight_mask") is pairs[1][0].get_buffer("weight_mask")
    assert torch.equal(fresh.run(), case.run())


def test_an_orphan_mask_that_differs_from_its_alias_is_an_error() -> None:
    case = embedding_head()
    prune(case)
    state = _deduplicated(model_state(case.model), "lm_head.weight")
    state["lm_head.weight_mask"] = torch.ones(20, 8)
    fresh = embedding_head(seed=1)
    check = unchanged(fresh.model)
    with pytest.raises(
        ValueError,
        match=r"Expected 'wte.weight_mask' and 'lm_head.weight_mask', names of one tied parameter "
        r"of the model, to be saved equal, but they differ: the pruning of 'lm_head.weight' "
        r"cannot be restored.",
    ):
        restore_pruning(fresh.model, state)
    check()


def test_an_orphan_mask_that_cannot_be_explained_is_an_error() -> None:
    case = embedding_head()
    prune(case)
    state = model_state(case.model)
    state = {k: v for k, v in state.items() if not k.startswith(("wte.", "lm_head.weight_orig"))}
    fresh = embedding_head(seed=1)
    check = unchanged(fresh.model)
    with pytest.raises(
        ValueError,
        match=r"Expected 'lm_head.weight_orig' next to 'lm_head.weight_mask' in the state_dict, "
        r"but it is missing, and 'lm_head.weight' is not tied to a tensor saved pruned \(its "
        r"names: \['wte.weight', 'lm_head.weight'\]\): the pruning of 'lm_head.weight' cannot be "
        r"restored.",
    ):
        restore_pruning(fresh.model, state)
    check()


def test_aliases_saved_one_pruned_one_dense_are_an_error() -> None:
    case = embedding_head()
    prune(case)
    state = model_state(case.model)
    dense = state.pop("lm_head.weight_orig") * state.pop("lm_head.weight_mask")
    state["lm_head.weight"] = dense  # what a run that masked one holder only would save
    fresh = embedding_head(seed=1)
    check = unchanged(fresh.model)
    with pytest.raises(
        ValueError, match=r"'wte.weight' is saved pruned and \['lm_head.weight'\] dense"
    ):
        restore_pruning(fresh.model, state)
    check()


def test_aliases_saved_with_different_values_are_an_error() -> None:
    case = shared_linears()
    prune(case)
    state = model_state(case.model)
    state["2.weight_orig"] = state["2.weight_orig"] + 1
    fresh = shared_linears(seed=1)
    check = unchanged(fresh.model)
    with pytest.raises(ValueError, match=r"Expected '0.weight_orig' and '2.weight_orig'"):
        restore_pruning(fresh.model, state)
    check()


@pytest.mark.slow
def test_gpt2_save_pretrained_folder_restores_and_loads(tmp_path: Path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    case = gpt2()
    prune(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case.model.save_pretrained(tmp_path)
    state = safetensors_torch.load_file(tmp_path / "model.safetensors")
    assert "transformer.wte.weight_mask" in state and "lm_head.weight_orig" not in state
    fresh = gpt2(seed=1)
    restore_pruning(fresh.model, state)
    result = fresh.model.load_state_dict(state, strict=False)
    dropped = sorted({"lm_head.weight_orig", "lm_head.weight_mask"} - set(state))
    assert sorted(result.missing_keys) == dropped
    assert result.unexpected_keys == []
    assert fresh.model.lm_head.weight_mask is fresh.model.transformer.wte.weight_mask
    assert torch.equal(fresh.run(), case.run())


# -- the functional API ----------------------------------------------------------------------


@pytest.fixture
def scans() -> Iterator[list[int]]:
    """The number of parameters each holder scan looked for."""
    calls: list[int] = []
    original = aliases._module_holders

    def counted(parameters):  # type: ignore[no-untyped-def]
        calls.append(len(parameters))
        return original(parameters)

    with mock.patch.object(aliases, "_module_holders", counted):
        yield calls


@pytest.mark.parametrize(
    "prune_head",
    [
        pytest.param(lambda m: l1_unstructured(m.lm_head, "weight", amount=10), id="l1"),
        pytest.param(lambda m: random_unstructured(m.lm_head, "weight", amount=0.3), id="random"),
        pytest.param(lambda m: identity(m.lm_head, "weight"), id="identity"),
        pytest.param(lambda m: custom_from_mask(m.lm_head, "weight", torch.ones(20, 8)), id="mask"),
        pytest.param(
            lambda m: global_unstructured(
                [(m.lm_head, "weight"), (m.mlp, "weight")], L1Unstructured, amount=9
            ),
            id="global",
        ),
    ],
)
def test_the_functional_api_warns_about_a_holder_it_leaves_unmasked(
    prune_head: Callable[[nn.Module], object], scans: list[int]
) -> None:
    model = embedding_head().model
    with pytest.warns(UserWarning) as record:
        prune_head(model)
    assert len(record) == 1
    message = str(record[0].message)
    assert message.startswith(
        "Pruned (Linear, 'weight'), but its parameter is also held by (Embedding, 'weight'), which "
        "still computes with the unpruned values (tied weights)."
    )
    assert "global_unstructured in one call, or prune with Pruner" in message
    assert record[0].filename == __file__  # points at the caller
    assert hasattr(model.wte, "weight") and not hasattr(
        model.wte, "weight_mask"
    )  # torch's behaviour
    assert len(scans) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        l1_unstructured(model.lm_head, "weight", amount=1)  # not a first pruning: no warning
    assert len(scans) == 1


def test_pruning_every_holder_in_one_call_does_not_warn() -> None:
    model = embedding_head().model
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        global_unstructured(
            [(model.lm_head, "weight"), (model.wte, "weight")], L1Unstructured, amount=30
        )
    assert model.lm_head.weight_mask is model.wte.weight_mask


def test_untied_pruning_neither_warns_nor_scans(scans: list[int]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        l1_unstructured(model[0], "weight", amount=3)
        random_unstructured(model[0], "bias", amount=1)
        global_unstructured(
            [(model[1], "weight"), (model[2], "weight")], L1Unstructured, amount=0.5
        )
        Pruner(model, OneShotSchedule(0.5), parameters=["2.bias"]).step()
    assert scans == []  # no other reference: the reference count says so without a scan
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # other references, not holders
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        l1_unstructured(model[1], "bias", amount=1)
    assert scans == [1]
    assert any(param is model[1].bias_orig for param in optimizer.param_groups[0]["params"])


def test_a_pruner_state_naming_a_tied_target_by_another_name_loads() -> None:
    case = embedding_head()
    pruner = prune(case)
    state = pruner.state_dict()
    assert state["targets"] == ["wte.weight", "mlp.weight"]
    state["targets"] = ["lm_head.weight", "mlp.weight"]  # an alias, as an older state may hold
    resumed = Pruner(case.model, OneShotSchedule(0.5), parameters=case.targets)
    resumed.load_state_dict(state)
    assert (resumed.last_step, resumed.targets) == (0, ["wte.weight", "mlp.weight"])
    state["targets"] = ["mlp.weight", "lm_head.weight"]
    check = unchanged(case.model)
    with pytest.raises(ValueError, match=r"Expected the state's targets to be the pruner's"):
        resumed.load_state_dict(state)
    check()
