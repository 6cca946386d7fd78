"""The Pruner with ``structure="channel"``, ``"head"`` or ``"layer"``: exact counts of units per
schedule step, masks over every slice in both masking modes, and the shrunk model computing what
the masked one did (the oracle)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import DependencyGraph, shrink
from tensorplay.ao.pruning.masking import mask_of
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import LinearSchedule, OneShotSchedule
from tensorplay.ao.pruning.structured.dependency.unit_groups import pruned_units
from tests.hf_models import tiny_bert, tiny_gpt2, tiny_llama

transformers = pytest.importorskip("transformers")

SCHEDULE = LinearSchedule(0.5, end_step=4, frequency=2)  # 0, 0.25, 0.5 at steps 0, 2, 4
TOKENS = torch.tensor([[5, 3, 9, 1, 7, 2]])


def gpt2() -> nn.Module:
    return tiny_gpt2(n_head=4, dropout=0.0)


def bert() -> nn.Module:
    return tiny_bert(dropout=0.0)


MODELS: dict[str, Callable[[], nn.Module]] = {"llama": tiny_llama, "gpt2": gpt2, "bert": bert}
CASES = [
    pytest.param(family, kind, id=f"{family}-{kind}")
    for family, kinds in (
        ("llama", ("channel", "head", "layer")),
        ("gpt2", ("channel", "head", "layer")),
        ("bert", ("channel", "head")),
    )
    for kind in kinds
]


def logits(model: nn.Module) -> Tensor:
    with torch.no_grad():
        return model(TOKENS).logits


def masks_by_name(model: nn.Module) -> dict[str, Tensor]:
    """Every tensor's keep mask (all kept where it has none), by qualified name."""
    found = {}
    for module_name, module in model.named_modules():
        for name, param in list(module.named_parameters(recurse=False)):
            local = name.removesuffix("_orig")
            mask = mask_of(module, local)
            full = f"{module_name}.{local}" if module_name else local
            found[full] = torch.ones_like(param, dtype=torch.bool) if mask is None else mask != 0
    return found


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
@pytest.mark.parametrize(("family", "kind"), CASES)
def test_each_step_prunes_the_exact_count_and_shrink_removes_those_units(
    family: str, kind: str, masking: str
) -> None:
    model = MODELS[family]()
    groups = DependencyGraph(model).groups(kind)
    total = sum(group.size for group in groups)
    pruner = Pruner(model, SCHEDULE, structure=kind, masking=masking)  # type: ignore[arg-type]
    assert pruner.total_count() == total
    for step in range(5):
        pruner.step()
        assert pruner.pruned_count() == round(SCHEDULE(step) * total), step
        masks = masks_by_name(model)
        pruned = [pruned_units(group, masks) for group in groups]  # never partial: no error
        if kind != "layer":
            assert all(not units.all() for units in pruned)  # every group keeps a unit
        assert sum(int(units.sum()) for units in pruned) == pruner.pruned_count()
    due = [(2, round(0.25 * total)), (4, round(0.5 * total) - round(0.25 * total))]
    assert [(step, count) for step, _, count in pruner.history] == [d for d in due if d[1]]
    masked = logits(model)
    widths = [group.size - int(units.sum()) for group, units in zip(groups, pruned, strict=True)]
    report = shrink(model)
    shrunk = {(width.name, width.kind): width.after for width in report.groups}
    if kind == "layer":  # one row, the layer group: the blocks' container, its units the layers
        container = groups[0].name.rpartition(".")[0]
        assert shrunk[(container, "layer")] == sum(widths)
        gone = tuple(group.name for group, width in zip(groups, widths, strict=True) if not width)
        assert report.removed_layers == gone
    else:
        assert [shrunk[(group.name, kind)] for group in groups] == widths
    torch.testing.assert_close(logits(model), masked, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
def test_every_slice_of_a_pruned_channel_is_zero_and_stays_zero_in_training(masking: str) -> None:
    model = tiny_llama().train()
    pruner = Pruner(model, OneShotSchedule(0.5), structure="channel", masking=masking)  # type: ignore[arg-type]
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    if masking == "inplace":
        pruner.attach(optimizer)
    pruner.step()
    for _ in range(3):
        labels = TOKENS.clone()
        model(TOKENS, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    mlp = model.model.layers[0].mlp
    dropped = ~(mask_of(mlp.up_proj, "weight") != 0).any(dim=1)
    assert int(dropped.sum()) > 0
    assert (mlp.gate_proj.weight[dropped] == 0).all()
    assert (mlp.up_proj.weight[dropped] == 0).all()
    assert (mlp.down_proj.weight[:, dropped] == 0).all()


def test_heads_under_grouped_query_attention_are_key_value_groups() -> None:
    model = tiny_llama()
    pruner = Pruner(model, OneShotSchedule(0.5), structure="head")
    assert pruner.total_count() == 3 * 2  # 3 blocks, 2 key/value heads (of 2 query heads each)
    pruner.step()
    for layer in model.model.layers:
        attention = layer.self_attn
        kept_kv = (mask_of(attention.k_proj, "weight") != 0).any(dim=1).view(2, 8).any(dim=1)
        kept_q = (mask_of(attention.q_proj, "weight") != 0).any(dim=1).view(2, 2, 8).any(dim=(1, 2))
        assert kept_kv.tolist() == kept_q.tolist() and int(kept_kv.sum()) == 1


@pytest.mark.parametrize(
    ("kind", "label", "rows"),
    [
        pytest.param("channel", "channel group", 3, id="channel"),
        pytest.param("head", "head group", 3, id="head"),
        pytest.param("layer", "layer group", 1, id="layer"),
        pytest.param("element", "tensor", None, id="element"),  # a row per target
    ],
)
def test_the_report_says_what_its_rows_are(kind: str, label: str, rows: int | None) -> None:
    pruner = Pruner(tiny_llama(), OneShotSchedule(0.25), structure=kind)  # type: ignore[arg-type]
    pruner.step()
    rows = len(pruner.targets) if rows is None else rows
    report = pruner.report()
    assert (report.row_label, len(report.rows)) == (label, rows)
    lines = str(report).splitlines()
    assert len(lines) == rows + 2
    assert lines[0].split("  ")[0] == label
    assert lines[0].split()[-4:] == ["shape", "numel", "pruned", "sparsity"]
    assert lines[1].startswith(report.rows[0].name)
