"""Every family (:data:`tests.family_models.FAMILY_MODELS`), every kind of unit, both masking
modes, against the oracle: a Pruner masks half of the units; the masked model, the shrunk one and
a copy saved and loaded again compute the same logits (within 1e-5: float32 sums reordered) and
generate the same 10 tokens greedily with the KV cache. Equal widths per layer
(``scope="layerwise"``) load with plain ``from_pretrained`` wherever the family's config can
state them; other widths with ``load_shrunk``. The kinds a family refuses are refused before
anything changes, and the docs' table of families is what these models give."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning import DependencyGraph, Pruner, load_shrunk, shrink
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.ao.pruning.structured.dependency.families.layer_config import shared_config
from tensorplay.ao.pruning.structured.dependency.graph import KINDS
from tests.core.structure.masking import mask_units
from tests.core.structure.test_hidden import REFUSED as HIDDEN_REFUSED
from tests.core.structure.test_shrink import inputs_for, uniform_keeps
from tests.family_models import FAMILY_MODELS
from tests.model_state import unchanged
from tests.moe_models import MOE_MODELS

transformers = pytest.importorskip("transformers")

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
REFUSED = {
    ("olmo2", "head"): r"'model.layers.0.self_attn.q_norm' normalises the queries of all heads",
    ("bert", "layer"): r"post-norm",
    ("roberta", "layer"): r"post-norm",
    ("olmoe", "head"): r"'model.layers.0.self_attn.q_norm' normalises the queries of all heads",
    **{(name, "expert"): r"have none" for name in FAMILY_MODELS if name not in MOE_MODELS},
}
"""The kinds a family refuses, and what the refusal says (a dense model has no experts)."""
HEADS_PER_LAYER = {"gpt2", "bert", "roberta", "gpt_neox", "gpt_neox-sequential"}
"""Families whose config derives the head width from ``hidden_size // num_attention_heads``:
fewer heads, even as many in every layer, load with ``load_shrunk``."""
TABLE = Path(__file__).parents[3] / "docs" / "_generated" / "families.md"
COLUMNS = (*KINDS, "hidden")
"""The table's kinds: the graph's, and the residual stream's width (tests/core/structure/
test_hidden.py checks it family by family)."""

COVERED_ELSEWHERE = {"mistral", "qwen2", "qwen3", "bert", "roberta", "vit"}
"""Architectures whose shrinking tests/core/structure/test_shrink.py runs in the quick tier: in
the slow one here."""
CASES = [
    pytest.param(
        name, kind, masking, id=f"{name}-{kind}-{masking}",
        marks=[pytest.mark.slow] if name in COVERED_ELSEWHERE else [],
    )
    for name in FAMILY_MODELS
    for kind in KINDS
    if (name, kind) not in REFUSED
    for masking in ("reparametrize", "inplace")
]  # fmt: skip


def _outputs(model: nn.Module, generates: bool) -> dict[str, Any]:
    """The logits on the test inputs, and for a decoder 10 greedy tokens with the KV cache."""
    inputs = inputs_for(model)
    with torch.no_grad():
        outputs: dict[str, Any] = {"logits": model(**inputs).logits}
    if generates:
        tokens = inputs["input_ids"][:1]
        run = model.generate(  # type: ignore[operator]
            tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=10, min_new_tokens=10,
            do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
        outputs["tokens"] = run.sequences.tolist()
        outputs["steps"] = torch.stack(run.logits)
    return outputs


def _assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert list(got) == list(expected)
    torch.testing.assert_close(got["logits"], expected["logits"], **TOLERANCE)
    if "tokens" in expected:
        assert got["tokens"] == expected["tokens"]
        torch.testing.assert_close(got["steps"], expected["steps"], **TOLERANCE)


@pytest.mark.parametrize(("name", "kind", "masking"), CASES)
def test_masked_shrunk_and_reloaded_compute_alike(
    name: str, kind: str, masking: str, tmp_path: Path
) -> None:
    entry = FAMILY_MODELS[name]
    model = entry.build()
    # Equal widths where a scope per group can give them; layers are one group of blocks.
    scope = "layerwise" if masking == "reparametrize" and kind != "layer" else "global"
    pruner = Pruner(model, OneShotSchedule(0.5), structure=kind, scope=scope, masking=masking)  # type: ignore[arg-type]
    pruner.step()
    assert pruner.pruned_count() == round(0.5 * pruner.total_count()) > 0
    masked = _outputs(model, entry.generates)
    report = shrink(model)
    assert report.parameters_after < report.parameters_before
    _assert_same(_outputs(model, entry.generates), masked)
    if scope == "layerwise":
        per_layer = kind == "head" and name in HEADS_PER_LAYER
        assert report.config == ("per_layer" if per_layer else "uniform")
    model.save_pretrained(tmp_path)
    auto = getattr(transformers, entry.auto)
    if report.config == "uniform":
        loaded = auto.from_pretrained(tmp_path)
    else:
        loaded = load_shrunk(auto, tmp_path)
    _assert_same(_outputs(loaded.eval(), entry.generates), masked)


UNEVEN = ["gemma2", "gemma3", "phi3", "olmo2", "gpt_neox"]


@pytest.mark.parametrize("name", UNEVEN)
def test_widths_that_differ_per_layer_reload_with_load_shrunk(name: str, tmp_path: Path) -> None:
    """Block 0 keeps every other channel and drops its first head (where heads go), block 1
    keeps all but its first channel: the config cannot state it, load_shrunk rebuilds it."""
    entry = FAMILY_MODELS[name]
    model = entry.build()
    graph = DependencyGraph(model)
    channels = graph.groups("channel")
    keeps = [(channels[0], torch.arange(48) % 2 == 1), (channels[1], torch.arange(48) != 0)]
    if "head" in graph.kinds:
        heads = graph.groups("head")[0]
        keeps.append((heads, torch.arange(heads.size) != 0))
    mask_units(model, keeps, "inplace")
    masked = _outputs(model, entry.generates)
    assert shrink(model).config == "per_layer"
    _assert_same(_outputs(model, entry.generates), masked)
    model.save_pretrained(tmp_path)
    loaded = load_shrunk(getattr(transformers, entry.auto), tmp_path).eval()
    assert [entry["intermediate_size"] for entry in loaded.config.tensorplay_layer_widths] == [
        24, 47]  # fmt: skip
    _assert_same(_outputs(loaded, entry.generates), masked)


def test_phi3_layers_with_fewer_heads_than_the_config_read_their_own() -> None:
    """Phi-3 splits qkv_proj at config.num_attention_heads * head_dim: a layer with other
    heads reads its own count, every other key (the attention implementation) stays shared."""
    model = FAMILY_MODELS["phi3"].build()
    heads = DependencyGraph(model).groups("head")[0]
    mask_units(model, [(heads, torch.tensor([True, False]))], "zeros")
    shrink(model)
    first, second = (layer.self_attn for layer in model.model.layers)
    assert (first.config.num_attention_heads, model.config.num_attention_heads) == (2, 4)
    assert first.config is not model.config and second.config is model.config
    assert (first.num_key_value_heads, first.num_key_value_groups) == (1, 2)
    model.config._attn_implementation = "sdpa"
    assert first.config._attn_implementation == "sdpa"
    expected = _outputs(model, False)["logits"]
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        view = copied.model.layers[0].self_attn.config
        assert view.num_attention_heads == 2 and shared_config(view) is copied.config
        torch.testing.assert_close(_outputs(copied, False)["logits"], expected, **TOLERANCE)


def test_gemma3_without_its_sliding_layer_keeps_the_global_one() -> None:
    model = FAMILY_MODELS["gemma3"].build()
    layers = DependencyGraph(model).groups("layer")
    mask_units(model, [(layers[0], torch.tensor([False]))], "zeros")
    masked = _outputs(model, True)
    shrink(model)
    assert model.config.layer_types == ["full_attention"]
    assert model.model.layers[0].self_attn.sliding_window is None
    assert model.model.layers[0].self_attn.layer_idx == 0
    _assert_same(_outputs(model, True), masked)


def test_olmo2_layers_are_scored_by_their_attention_too() -> None:
    """OLMo 2's heads are refused, yet a layer is ranked by all of its projections."""
    layer = DependencyGraph(FAMILY_MODELS["olmo2"].build()).groups("layer")[0]
    assert [name.removeprefix("model.layers.0.") for name in layer.scored_parameters()] == [
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]  # fmt: skip


def test_every_list_of_one_entry_per_layer_follows_removed_layers() -> None:
    """SmolLM3 (a Llama-style block) reads whether a layer rotates from no_rope_layers."""
    config = transformers.SmolLM3Config(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, no_rope_layers=[1, 0, 1],
        layer_types=["full_attention", "sliding_attention", "full_attention"], sliding_window=4,
        use_sliding_window=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    model = transformers.SmolLM3ForCausalLM(config).eval()
    layers = DependencyGraph(model).groups("layer")
    mask_units(model, [(layers[0], torch.tensor([False]))], "zeros")
    masked = _outputs(model, True)
    shrink(model)
    assert (model.config.no_rope_layers, model.config.layer_types) == (
        [0, 1], ["sliding_attention", "full_attention"])  # fmt: skip
    _assert_same(_outputs(model, True), masked)


@pytest.mark.parametrize(("name", "kind"), list(REFUSED))
def test_a_refused_kind_is_refused_before_any_change(name: str, kind: str) -> None:
    model = FAMILY_MODELS[name].build()
    check = unchanged(model)
    with pytest.raises(ValueError, match=REFUSED[(name, kind)]):
        Pruner(model, OneShotSchedule(0.5), structure=kind)  # type: ignore[arg-type]
    check()


def _cell(graph: DependencyGraph, model: nn.Module, kind: str) -> str:
    """``exact`` (and how a saved copy of equal widths loads), or ``refused: why``."""
    why = graph.refusal(kind)
    if why is not None and why.endswith("have none"):
        return "none"  # a dense model's experts
    if why is not None:
        return f"refused: {why}"
    shrunk = copy.deepcopy(model)
    if kind == "hidden":  # every other channel of the stream
        keeps = [(g, torch.arange(g.size) % 2 == 1) for g in DependencyGraph(shrunk).groups(kind)]
    else:
        keeps = uniform_keeps(DependencyGraph(shrunk), (kind,))
    mask_units(shrunk, keeps, "zeros")
    groups = [group for group, _ in keeps] if kind == "hidden" else None  # not shrunk by default
    loads = "plain" if shrink(shrunk, groups=groups).config == "uniform" else "`load_shrunk`"
    return f"exact ({loads})"


def family_cells() -> dict[str, list[str]]:
    """Per architecture, its family and one cell per kind."""
    cells = {}
    for name, entry in FAMILY_MODELS.items():
        model = entry.build()
        graph = DependencyGraph(model)
        cells[name] = [f"`{graph.family}`", *(_cell(graph, model, kind) for kind in COLUMNS)]
    return cells


def family_table(cells: dict[str, list[str]] | None = None) -> str:
    """The docs' table: one row per architecture, one column per kind."""
    rows = [
        f"| {FAMILY_MODELS[name].title} | {' | '.join(row)} |"
        for name, row in (cells or family_cells()).items()
    ]
    caption = (
        "Checked on one tiny model of each architecture, every time the tests run. None: the "
        "architecture has no such units. Exact: the masked, shrunk and reloaded models compute "
        "the same logits and generate the same tokens; plain: a saved copy with as many units "
        "in every layer loads with plain `from_pretrained`, where it says `load_shrunk` it "
        "needs `load_shrunk`, as any copy whose widths differ per layer does."
    )
    header = [
        f"| architecture | family | {' | '.join(COLUMNS)} |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    return "\n".join([*header, *rows, "", caption, ""])


def test_the_docs_table_of_families_is_what_the_models_give() -> None:
    cells = family_cells()
    refused = {
        (name, kind)
        for name, row in cells.items()
        for kind, cell in zip(COLUMNS, row[1:], strict=True)
        if cell.startswith("refused") or cell == "none"
    }
    assert refused == set(REFUSED) | {(name, "hidden") for name in HIDDEN_REFUSED}
    committed = TABLE.read_text() if TABLE.exists() else ""
    assert committed == family_table(cells), (
        f"{TABLE} differs from what the family models give; regenerate it with "
        '`python -c "from tests.core.structure.test_families import family_table; '
        "open('docs/_generated/families.md', 'w').write(family_table())\"`"
    )


def test_every_family_is_a_row_of_the_oracle() -> None:
    from tensorplay.ao.pruning.structured.dependency.families import FAMILIES

    covered = {DependencyGraph(entry.build()).family for entry in FAMILY_MODELS.values()}
    assert covered == {family.name for family in FAMILIES}
