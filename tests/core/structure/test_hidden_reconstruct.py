"""``structure="hidden", reconstruct=True``: every layer that reads the residual stream through a
Linear or ``Conv1D`` is re-solved over its kept input columns, against the oracles: the same
masks as without reconstruction, a lower error to the dense model's logits, the re-solved
weights of a single reader equal to a ridge solution computed by hand (an ordinary least-squares
problem in float64, from the dense model's and the pruned model's inputs of that reader), and the
masked model equal to the shrunk one and to a saved and loaded copy (within 1e-5: float32 sums
reordered); what is not re-solved (writers, embeddings, a tied head, routers, fused experts) is
left bit for bit as the plain prune leaves it."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import DependencyGraph, load_shrunk, prune_one_shot, shrink
from tensorplay.ao.pruning.structured.reconstruction import DEFAULT_DAMPING
from tests.family_models import FAMILY_MODELS
from tests.model_state import unchanged

transformers = pytest.importorskip("transformers")

Batch = dict[str, Tensor]
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
MODES = ("reparametrize", "inplace")
FAMILIES = ("llama", "gpt2", "qwen3_moe", "qwen2_moe", "mixtral")
PER_LAYER = {"gpt2"}
"""GPT-2's attention width is ``n_embd``: its shrunk folder loads with ``load_shrunk``."""

# Per family, the layers re-solved in each block (the readers of the stream that are Linear or
# Conv1D layers), and whether the LM head is (an untied one).
READERS: dict[str, tuple[tuple[str, ...], bool]] = {
    "llama": (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
               "mlp.up_proj"), True),
    "gpt2": (("attn.c_attn", "mlp.c_fc"), False),  # the head is the embedding: not re-solved
    "qwen3_moe": (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), True),
    "mixtral": (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), True),
    "qwen2_moe": (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                   "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj",
                   "mlp.shared_expert_gate"), True),
}  # fmt: skip


def _batches(seed: int, count: int = 6) -> list[Batch]:
    """Random tokens; the last row of each batch left-padded by 3 tokens (padding never
    enters a solve, and never the error below)."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        ids = torch.randint(0, 97, (4, 16), generator=generator)
        mask = torch.ones_like(ids)
        mask[-1, :3] = 0
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


def _logits(model: nn.Module, batches: list[Batch]) -> list[Tensor]:
    with torch.no_grad():
        return [model(**batch).logits for batch in batches]


def _error(model: nn.Module, dense: list[Tensor], batches: list[Batch]) -> float:
    """The mean squared error of the logits to the dense model's, over the real tokens."""
    total = 0.0
    for out, ref, batch in zip(_logits(model, batches), dense, batches, strict=True):
        real = batch["attention_mask"].bool()
        total += float((out[real] - ref[real]).square().mean())
    return total


def _pruned(model: nn.Module, batches: list[Batch], reconstruct: bool, **options: Any) -> nn.Module:
    pruned = copy.deepcopy(model)
    options.setdefault("make_permanent", False)
    prune_one_shot(pruned, batches, 0.25, structure="hidden", reconstruct=reconstruct, **options)
    return pruned


def _masks(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if k.endswith("_mask")}


def _differing(first: nn.Module, second: nn.Module) -> set[str]:
    mine, theirs = first.state_dict(), second.state_dict()
    assert list(mine) == list(theirs)
    return {key for key in mine if not torch.equal(mine[key], theirs[key])}


def _expected_solved(model: nn.Module, name: str, masking: str) -> set[str]:
    blocks, head = READERS[name]
    layers = [
        module_name
        for module_name, _ in model.named_modules()
        if module_name.endswith(blocks) and module_name.count(".") >= 3
    ]
    suffix = ".weight_orig" if masking == "reparametrize" else ".weight"
    return {f"{layer}{suffix}" for layer in [*layers, *(["lm_head"] if head else [])]}


@pytest.mark.parametrize("masking", MODES)
@pytest.mark.parametrize("name", FAMILIES)
def test_reconstruction_matches_the_dense_model_better_and_shrinks_and_loads_exactly(
    name: str, masking: str, tmp_path: Path
) -> None:
    entry = FAMILY_MODELS[name]
    model = entry.build()
    batches = _batches(1)
    dense = _logits(model, batches)
    plain = _pruned(model, batches, reconstruct=False, masking=masking)
    solved = _pruned(model, batches, reconstruct=True, masking=masking)
    masks = _masks(solved)
    assert len(masks) > 0 and list(masks) == list(_masks(plain))
    for key, mask in _masks(plain).items():
        assert torch.equal(masks[key], mask), key  # the same hidden channels pruned
    # Only the readers changed, each on its kept entries (the masks' zeros, and under the
    # reparametrization the pruned values, are those of the plain prune).
    assert _differing(plain, solved) == _expected_solved(model, name, masking)
    # GPT-2's head is its embedding, not re-solved: the head's logits still miss the pruned
    # channels' part, most of what separates the pruned model from the dense one here.
    gain = 1.0 if name == "gpt2" else 0.95
    assert _error(solved, dense, batches) < gain * _error(plain, dense, batches)

    masked = _logits(solved, batches)
    report = shrink(solved)
    assert DependencyGraph(solved).hidden().group.size == 24
    for out, ref in zip(_logits(solved, batches), masked, strict=True):
        torch.testing.assert_close(out, ref, **TOLERANCE)
    solved.save_pretrained(tmp_path)
    auto = getattr(transformers, entry.auto)
    if name in PER_LAYER:
        assert report.config == "per_layer"
        loaded = load_shrunk(auto, tmp_path)
    else:
        assert report.config == "uniform"
        loaded = auto.from_pretrained(tmp_path)
    for out, ref in zip(_logits(loaded.eval(), batches), masked, strict=True):
        torch.testing.assert_close(out, ref, **TOLERANCE)


def _ridge_by_hand(kept: Tensor, dense: Tensor, weight: Tensor, damping: float) -> Tensor:
    """``argmin_W ||X_k W^T - X_d W_d^T||^2 + lam ||W||^2`` as an ordinary least-squares
    problem in float64: ``[X_k; sqrt(lam) I] W^T = [X_d W_d^T; 0]``, ``lam`` relative to the
    mean diagonal of ``X_k^T X_k``."""
    kept, dense, weight = kept.double(), dense.double(), weight.double()
    lam = damping * float(kept.square().sum(0).mean())
    k = kept.shape[1]
    a = torch.cat([kept, lam**0.5 * torch.eye(k, dtype=torch.float64)])
    b = torch.cat([dense @ weight.T, torch.zeros(k, weight.shape[0], dtype=torch.float64)])
    solution: Tensor = torch.linalg.lstsq(a, b).solution
    return solution.T


def _inputs(model: nn.Module, layer: str, batches: list[Batch]) -> Tensor:
    """The inputs of ``layer`` over the real tokens of ``batches``, ``(tokens, width)`` (a
    shared expert reads them flattened to ``(batch * tokens, width)``, row by row)."""
    seen: list[Tensor] = []
    handle = model.get_submodule(layer).register_forward_pre_hook(
        lambda module, args: seen.append(args[0].detach())
    )
    with torch.no_grad():
        for batch in batches:
            model(**batch)
    handle.remove()
    assert len(seen) == len(batches)
    rows = []
    for read, batch in zip(seen, batches, strict=True):
        real = batch["attention_mask"].bool()
        rows.append(read.reshape(*real.shape, read.shape[-1])[real])
    return torch.cat(rows)


@pytest.mark.parametrize("masking", MODES)
@pytest.mark.parametrize(
    ("name", "layer"),
    [("llama", "model.layers.0.self_attn.q_proj"), ("llama", "model.layers.0.self_attn.v_proj"),
     ("llama", "model.layers.1.mlp.up_proj"), ("llama", "lm_head"),
     ("qwen2_moe", "model.layers.1.mlp.shared_expert.up_proj")],
)  # fmt: skip
def test_a_reader_is_the_ridge_solution_computed_by_hand(
    name: str, layer: str, masking: str
) -> None:
    """The first reader the forward calls, one solved with it from the same input, one in a
    later block, the last (the LM head, after the final norm), and a shared expert's (whose
    inputs are flattened, the padding among them):
    ``X_d`` from the dense model, ``X_k`` the kept columns of the pruned model's inputs of that
    layer (the final model's: a reader's re-solve changes none of its own inputs, and every
    layer before it is solved by then), which the norms' hooks normalise over the kept
    channels."""
    model = FAMILY_MODELS[name].build()
    batches = _batches(3, count=4)
    damping = 0.01
    dense_weight = model.get_submodule(layer).weight.detach().clone()
    x_d = _inputs(model, layer, batches)
    solved = _pruned(model, batches, reconstruct=True, masking=masking,
                     reconstruct_damping=damping)  # fmt: skip
    keep = solved.get_submodule("model.norm").weight.detach() != 0  # the kept channels
    assert int(keep.sum()) == 24
    x_k = _inputs(solved, layer, batches)
    assert bool((x_k[:, ~keep] == 0).all())  # the hooks put zeros at the pruned channels
    by_hand = _ridge_by_hand(x_k[:, keep], x_d, dense_weight, damping)
    weight = solved.get_submodule(layer).weight.detach()
    torch.testing.assert_close(weight[:, keep].double(), by_hand, atol=1e-5, rtol=1e-4)
    assert bool((weight[:, ~keep] == 0).all())


def test_the_default_damping_is_the_one_of_channels_and_heads() -> None:
    model = FAMILY_MODELS["llama"].build()
    batches = _batches(4, count=2)
    default = _pruned(model, batches, reconstruct=True)
    named = _pruned(model, batches, reconstruct=True, reconstruct_damping=DEFAULT_DAMPING)
    assert _differing(default, named) == set()


@pytest.mark.parametrize("masking", MODES)
def test_sparsity_zero_changes_no_weight(masking: str) -> None:
    model = FAMILY_MODELS["llama"].build()
    dense = {key: value.clone() for key, value in model.state_dict().items()}
    pruned = copy.deepcopy(model)
    prune_one_shot(pruned, _batches(5, count=2), 0.0, structure="hidden", reconstruct=True,
                   masking=masking, make_permanent=False)  # fmt: skip
    state = pruned.state_dict()
    values = [key.removesuffix("_orig") for key in state if not key.endswith("_mask")]
    assert sorted(values) == sorted(dense)
    for key, value in state.items():
        if key.endswith("_mask"):
            assert bool(value.bool().all()), key
        else:
            assert torch.equal(value, dense[key.removesuffix("_orig")]), key


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        pytest.param("gemma", {}, r"sqrt\(hidden_size\)", id="gemma"),
        pytest.param("llama", {"structure": ("channel", "hidden")}, r"distinct kinds",
                     id="combined"),
        pytest.param("llama", {"reconstruct_damping": -1.0}, r"reconstruct_damping",
                     id="damping"),
        pytest.param("llama", {"importance": "wanda"}, r"'wanda'", id="wanda"),
    ],
)  # fmt: skip
def test_what_is_not_supported_is_refused_before_any_change(
    name: str, options: dict[str, Any], match: str
) -> None:
    model = FAMILY_MODELS[name].build()
    check = unchanged(model)
    arguments: dict[str, Any] = {"structure": "hidden", "reconstruct": True, **options}
    with pytest.raises(ValueError, match=match):
        prune_one_shot(model, _batches(6, count=1), 0.25, **arguments)
    check()


def test_a_refusal_during_the_solve_leaves_the_model_as_it_was() -> None:
    """The batch's ``attention_mask`` marks padding and is one token short of its inputs,
    which the forward ignores: calibration (by magnitude, reading no activation) and the step
    run, then the first re-solve cannot tell the padding apart and refuses; the masks, the
    norms' hooks and the weights written are taken back."""
    model = FAMILY_MODELS["llama"].build()
    ids = torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.q_proj' reads per token"):
        prune_one_shot(
            model, [batch], 0.25, structure="hidden", reconstruct=True, importance="magnitude",
            forward=lambda net, b: net(input_ids=b["input_ids"]),
        )  # fmt: skip
    check()


@pytest.mark.parametrize("masking", MODES)
def test_after_a_layer_pruning_the_readers_of_the_blocks_left_are_re_solved(masking: str) -> None:
    """A block masked whole is out of the hidden group: the readers of the other blocks and the
    head are re-solved (none is skipped for it), and the masked model shrinks exactly."""
    model = FAMILY_MODELS["llama"].build()
    batches = _batches(8, count=4)
    prune_one_shot(model, batches, 1 / 3, structure="layer", importance="magnitude",
                   masking=masking, make_permanent=False)  # fmt: skip
    dropped = [
        index
        for index, block in enumerate(model.model.layers)
        if not bool(block.mlp.up_proj.weight.detach().any())
    ]
    assert len(dropped) == 1
    with warnings.catch_warnings():  # the removed block's tensors are not named as dense
        warnings.filterwarnings("error", message=".*no hidden unit spans")
        plain = _pruned(model, batches, reconstruct=False, masking=masking)
        solved = _pruned(model, batches, reconstruct=True, masking=masking)
    expected = {
        key
        for key in _expected_solved(model, "llama", masking)
        if f"layers.{dropped[0]}." not in key
    }
    assert _differing(plain, solved) == expected
    dense = _logits(model, batches)  # the layer-pruned model: what the hidden prune starts from
    assert _error(solved, dense, batches) < 0.95 * _error(plain, dense, batches)
    masked = _logits(solved, batches)
    shrink(solved)
    assert (solved.config.num_hidden_layers, solved.config.hidden_size) == (2, 24)
    for out, ref in zip(_logits(solved, batches), masked, strict=True):
        torch.testing.assert_close(out, ref, **TOLERANCE)
