"""Reconstruction: the ridge solve against ``torch.linalg.lstsq``, and ``prune_one_shot(...,
reconstruct=True)`` against the same call without it on every family ``shrink`` supports: the
outputs on held-out batches are closer to the dense model's, the shrunk model computes what the
masked one did, sparsity 0 changes nothing, padding never enters the solve."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import (
    DependencyGraph,
    custom_from_mask,
    dense_copy,
    prune_one_shot,
    shrink,
)
from tensorplay.ao.pruning.structured.dependency.unit_groups import expand_keep, shapes_of
from tensorplay.ao.pruning.structured.reconstruction import (
    consumers_for,
    find_consumers,
    reconstruct,
    ridge_solve,
)
from tests.core.gloo import spawn_gloo
from tests.family_models import FAMILY_MODELS
from tests.hf_models import (
    VOCAB,
    tiny_bert,
    tiny_gpt2,
    tiny_llama,
    tiny_mistral,
    tiny_qwen2,
    tiny_qwen3,
    tiny_roberta,
    tiny_vit,
)
from tests.model_state import unchanged

Batch = dict[str, Tensor]
MODES = ("reparametrize", "inplace")


# --- the solve -----------------------------------------------------------------------------


def _lstsq(kept: Tensor, dense: Tensor, weight: Tensor, lam: float) -> Tensor:
    """The ridge problem as an ordinary least-squares one: ``[X_k; sqrt(lam) I] W^T =
    [X_d W_d^T; 0]``."""
    k = kept.shape[1]
    a = torch.cat([kept, lam**0.5 * torch.eye(k, dtype=kept.dtype)])
    b = torch.cat([dense @ weight.T, torch.zeros(k, weight.shape[0], dtype=kept.dtype)])
    solution: Tensor = torch.linalg.lstsq(a, b).solution
    return solution.T


@pytest.mark.parametrize("damping", [0.0, 1e-3, 0.1, 10.0])
def test_the_solve_is_the_least_squares_solution_of_the_ridge_problem(damping: float) -> None:
    generator = torch.Generator().manual_seed(0)
    dense = torch.randn(200, 12, generator=generator, dtype=torch.float64)
    dense[:, 3] = dense[:, 0] + 0.5 * dense[:, 1]  # correlated inputs: a pruned one is predictable
    weight = torch.randn(5, 12, generator=generator, dtype=torch.float64)
    keep = torch.tensor([1, 1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 1], dtype=torch.bool)
    kept = dense[:, keep]
    gram = kept.T @ kept
    solved = ridge_solve(gram, kept.T @ dense, weight, damping)
    lam = damping * float(gram.diagonal().mean())
    assert solved.shape == (5, 9)
    torch.testing.assert_close(solved, _lstsq(kept, dense, weight, lam), rtol=1e-9, atol=1e-9)


def test_the_solve_keeps_the_dense_weight_when_nothing_is_pruned() -> None:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(100, 6, generator=generator, dtype=torch.float64)
    weight = torch.randn(3, 6, generator=generator, dtype=torch.float64)
    solved = ridge_solve(x.T @ x, x.T @ x, weight, 0.0)
    torch.testing.assert_close(solved, weight, rtol=1e-9, atol=1e-9)


def test_the_solve_of_a_singular_gram_without_damping_is_the_minimum_norm_one() -> None:
    x = torch.zeros(10, 3, dtype=torch.float64)
    x[:, 0] = torch.arange(10.0)  # inputs 1 and 2 never active: G is singular
    weight = torch.ones(2, 4, dtype=torch.float64)
    dense = torch.cat([x, x[:, :1]], dim=1)
    solved = ridge_solve(x.T @ x, x.T @ dense, weight, 0.0)
    torch.testing.assert_close(solved, torch.tensor([[2.0, 0.0, 0.0]] * 2, dtype=torch.float64))


def test_the_solve_returns_the_weight_dtype_and_computes_in_float64() -> None:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(50, 4, generator=generator)
    weight = torch.randn(2, 4, generator=generator).to(torch.bfloat16)
    assert ridge_solve(x[:, :2].T @ x[:, :2], x[:, :2].T @ x, weight, 0.01).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        pytest.param(((2, 3), (2, 4), (1, 4)), "`gram` to be square", id="gram"),
        pytest.param(((2, 2), (3, 4), (1, 4)), "`cross` to have 2 rows", id="cross"),
        pytest.param(((2, 2), (2, 4), (1, 5)), "`weight` to have 4 columns", id="weight"),
    ],
)
def test_the_solve_refuses_shapes_that_do_not_fit(
    shapes: tuple[tuple[int, int], ...], match: str
) -> None:
    gram, cross, weight = (torch.zeros(shape) for shape in shapes)
    with pytest.raises(ValueError, match=match):
        ridge_solve(gram, cross, weight, 0.0)


@pytest.mark.parametrize("damping", [-1.0, float("nan"), float("inf")])
def test_the_solve_refuses_a_damping_that_is_not_a_finite_float_of_at_least_zero(
    damping: float,
) -> None:
    with pytest.raises(ValueError, match="`damping` to be a finite float >= 0"):
        ridge_solve(torch.eye(2), torch.eye(2), torch.eye(2), damping)


# --- models and data ---------------------------------------------------------------------


def _gpt2() -> nn.Module:
    return tiny_gpt2(n_head=4, dropout=0.0)


def _bert() -> nn.Module:
    return tiny_bert(dropout=0.0)


FAMILIES: dict[str, Callable[[], nn.Module]] = {
    "llama": tiny_llama, "mistral": tiny_mistral, "qwen2": tiny_qwen2, "qwen3": tiny_qwen3,
    "gpt2": _gpt2, "bert": _bert, "roberta": tiny_roberta, "vit": tiny_vit,
    **{name: FAMILY_MODELS[name].build for name in ("gemma2", "gemma3", "phi3", "olmo2",
                                                     "gpt_neox", "qwen2_moe", "mixtral")},
}  # fmt: skip
NO_UNITS = {("olmo2", "head"), ("mixtral", "channel")}
"""Kinds a family refuses (a norm over all heads), or whose channels are all a routed expert's
(reconstruction refuses those: tests/core/structure/test_experts_channels.py)."""
OPTIONS = {("qwen2_moe", "channel"): {"include": [r"shared_expert\."]}}
"""The shared expert's channels alone: its routed experts' channels are refused, as above."""


def _batches(model: nn.Module, seed: int, count: int = 8) -> list[Batch]:
    """``count`` batches of random tokens (images for ViT), with labels (a loss for Taylor)."""
    generator = torch.Generator().manual_seed(seed)
    if type(model).__name__.startswith("ViT"):
        return [
            {
                "pixel_values": torch.randn(16, 3, 8, 8, generator=generator),
                "labels": torch.randint(0, 3, (16,), generator=generator),
            }
            for _ in range(count)
        ]
    batches = []
    for _ in range(count):
        ids = torch.randint(1, VOCAB, (4, 16), generator=generator)
        batches.append({"input_ids": ids, "labels": ids})
    return batches


def _outputs(model: nn.Module, batches: list[Batch]) -> list[Tensor]:
    with torch.no_grad():
        return [model(**batch).logits for batch in batches]


def _error(model: nn.Module, dense: list[Tensor], batches: list[Batch]) -> float:
    """The mean squared error of the logits to the dense model's, over ``batches``."""
    outputs = _outputs(model, batches)
    return sum(float((out - ref).square().mean()) for out, ref in zip(outputs, dense, strict=True))


def _pruned(
    model: nn.Module, batches: list[Batch], kind: Any, reconstruct: bool, **options: Any
) -> nn.Module:
    pruned = copy.deepcopy(model)
    options.setdefault("importance", "wanda")
    options.setdefault("make_permanent", False)
    prune_one_shot(pruned, batches, 0.5, structure=kind, reconstruct=reconstruct, **options)
    return pruned


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _bitwise_equal(first: dict[str, Tensor], second: dict[str, Tensor]) -> bool:
    if list(first) != list(second):
        return False
    return all(
        a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))
        for a, b in zip(first.values(), second.values(), strict=True)
    )


def _bits(tensor: Tensor) -> Tensor:
    if tensor.is_floating_point():
        return tensor.view(torch.int32 if tensor.element_size() == 4 else torch.int16)
    return tensor


# --- prune_one_shot(reconstruct=True) ----------------------------------------------------


@pytest.mark.parametrize(
    ("family", "kind"),
    [(f, k) for f in FAMILIES for k in ("channel", "head") if (f, k) not in NO_UNITS],
)
def test_reconstruction_brings_held_out_outputs_closer_and_shrinks_exactly(
    family: str, kind: str
) -> None:
    model = FAMILIES[family]()
    calibration, held_out = _batches(model, 1), _batches(model, 2, count=4)
    dense = _outputs(model, held_out)
    options = OPTIONS.get((family, kind), {})
    plain = _pruned(model, calibration, kind, reconstruct=False, **options)
    solved = _pruned(model, calibration, kind, reconstruct=True, **options)
    # OLMo 2 normalises each FFN's output before the residual: that norm already undoes most of
    # the scale plain pruning loses, so reconstruction has less to win back there.
    gain = 1.0 if family == "olmo2" else 0.9
    assert _error(solved, dense, held_out) < gain * _error(plain, dense, held_out)
    masked = _outputs(solved, held_out)
    shrink(solved)
    for out, ref in zip(_outputs(solved, held_out), masked, strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


# Per family and kind: block 0's consumer, whether it is a Conv1D (stored (in, out)), its width.
CONSUMERS = {
    ("llama", "channel"): ("model.layers.0.mlp.down_proj", False, 48),
    ("llama", "head"): ("model.layers.0.self_attn.o_proj", False, 32),
    ("gpt2", "channel"): ("transformer.h.0.mlp.c_proj", True, 128),
    ("gpt2", "head"): ("transformer.h.0.attn.c_proj", True, 32),
    ("bert", "channel"): ("bert.encoder.layer.0.output.dense", False, 64),
    ("bert", "head"): ("bert.encoder.layer.0.attention.output.dense", False, 32),
    ("vit", "channel"): ("vit.layers.0.mlp.fc2", False, 48),
    ("vit", "head"): ("vit.layers.0.attention.o_proj", False, 32),
}


@pytest.mark.parametrize(
    ("family", "kind"), list(CONSUMERS), ids=[f"{f}-{k}" for f, k in CONSUMERS]
)
def test_the_consumers_are_the_layers_reading_the_units(family: str, kind: str) -> None:
    model = FAMILIES[family]()
    names = [name for name, _ in model.named_parameters()]
    consumers = consumers_for(model, kind, names)
    module, transposed, width = CONSUMERS[family, kind]
    blocks = 3 if family == "llama" else 2
    assert [c.module for c in consumers] == [module.replace(".0.", f".{i}.") for i in range(blocks)]
    assert [(c.parameter, c.transposed, c.width) for c in consumers[:1]] == [
        (f"{module}.weight", transposed, width)
    ]


def test_the_calibration_state_of_the_pruner_is_left_as_its_step_left_it() -> None:
    """Reconstruction's forwards are no observation: Wanda's sums restart as after the step."""
    model = tiny_llama()
    pruner = prune_one_shot(
        model, _batches(model, 1, count=2), 0.5, structure="channel", reconstruct=True,
        make_permanent=False,
    )  # fmt: skip
    assert set(pruner.importance.batches().values()) == {0}  # type: ignore[attr-defined]


@pytest.mark.parametrize("importance", ["magnitude", "wanda", "taylor"])
@pytest.mark.parametrize("mode", MODES)
def test_every_importance_and_masking_mode_prunes_the_same_units_and_reconstructs(
    importance: str, mode: str
) -> None:
    model = tiny_llama()
    calibration, held_out = _batches(model, 1), _batches(model, 2, count=4)
    dense = _outputs(model, held_out)
    options = {"importance": importance, "masking": mode}
    plain = _pruned(model, calibration, "channel", reconstruct=False, **options)
    solved = _pruned(model, calibration, "channel", reconstruct=True, **options)
    for name, buffer in plain.named_buffers():
        if name.endswith("_mask"):
            assert torch.equal(solved.get_buffer(name), buffer), name  # the same units pruned
    assert _error(solved, dense, held_out) < 0.9 * _error(plain, dense, held_out)


def test_the_reparametrization_keeps_the_pruned_values_and_lean_masks_their_zeros() -> None:
    model = tiny_llama()
    calibration = _batches(model, 1)
    name = "model.layers.0.mlp.down_proj.weight"
    dense = model.get_parameter(name).detach().clone()
    reparametrized = _pruned(model, calibration, "channel", True)
    lean = _pruned(model, calibration, "channel", True, masking="inplace")
    kept = reparametrized.get_buffer(f"{name}_mask").bool()
    orig = reparametrized.get_parameter(f"{name}_orig").detach()
    values = lean.get_parameter(name).detach()
    assert torch.equal(lean.get_buffer(f"{name}_mask"), kept)
    assert torch.equal(orig[~kept], dense[~kept])  # the pruned values stay recoverable
    assert not torch.equal(orig[kept], dense[kept])  # the kept ones are re-solved
    assert bool((values[~kept] == 0).all())
    assert torch.equal(values, orig * kept)  # the same solution in both modes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["channel", "head"])
def test_sparsity_zero_changes_nothing_bit_for_bit(kind: Any, mode: str) -> None:
    model = tiny_llama()
    calibration = _batches(model, 1, count=2)
    plain, solved = copy.deepcopy(model), copy.deepcopy(model)
    prune_one_shot(plain, calibration, 0.0, structure=kind, masking=mode)
    prune_one_shot(solved, calibration, 0.0, structure=kind, masking=mode, reconstruct=True)
    assert _bitwise_equal(_state(solved), _state(plain))
    assert _bitwise_equal(_state(solved), _state(model))


def test_padding_tokens_never_enter_the_solve() -> None:
    """Two calibration sets equal but for the tokens under a zero attention mask: the same
    weights (magnitude importance, so the same units go whatever the activations)."""
    model = tiny_llama()
    generator = torch.Generator().manual_seed(3)
    batches, garbage = [], []
    for _ in range(6):
        ids = torch.randint(1, VOCAB, (4, 16), generator=generator)
        mask = torch.ones(4, 16, dtype=torch.long)
        mask[:, 10:] = 0  # right padding: the real tokens never see it
        other = ids.clone()
        other[:, 10:] = torch.randint(1, VOCAB, (4, 6), generator=generator)
        batches.append({"input_ids": ids, "attention_mask": mask})
        garbage.append({"input_ids": other, "attention_mask": mask})
    first = _pruned(model, batches, "channel", True, importance="magnitude")
    second = _pruned(model, garbage, "channel", True, importance="magnitude")
    unpadded = [{"input_ids": b["input_ids"]} for b in garbage]
    third = _pruned(model, unpadded, "channel", True, importance="magnitude")
    name = "model.layers.1.mlp.down_proj.weight_orig"
    changed = first.get_parameter(name)
    torch.testing.assert_close(second.get_parameter(name), changed, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(third.get_parameter(name), changed, rtol=1e-3, atol=1e-4)


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
    )


def _mlp_batches(seed: int, count: int) -> list[Tensor]:
    generator = torch.Generator().manual_seed(seed)
    mix = torch.randn(8, 8, generator=generator)  # correlated features
    return [torch.randn(64, 8, generator=generator) @ mix for _ in range(count)]


def _mlp_error(model: nn.Module, dense: nn.Module, batches: list[Tensor]) -> float:
    with torch.no_grad():
        return sum(float((model(x) - dense(x)).square().mean()) for x in batches)


def _mlp_iterator(batches: list[Tensor]) -> Iterator[Tensor]:
    yield from batches


@pytest.mark.parametrize("mode", MODES)
def test_a_plain_model_is_reconstructed_layer_by_layer_and_shrinks_exactly(mode: str) -> None:
    model = _mlp()
    calibration, held_out = _mlp_batches(1, 8), _mlp_batches(2, 4)
    options: dict[str, Any] = {
        "structure": "channel", "example_inputs": calibration[0], "masking": mode,
        "make_permanent": False, "scope": "layerwise",
    }  # fmt: skip
    plain, solved = copy.deepcopy(model), copy.deepcopy(model)
    prune_one_shot(plain, calibration, 0.5, **options)
    prune_one_shot(solved, _mlp_iterator(calibration), 0.5, reconstruct=True, **options)
    assert _mlp_error(solved, model, held_out) < 0.9 * _mlp_error(plain, model, held_out)
    with torch.no_grad():
        masked = [solved(x) for x in held_out]
    shrink(solved, example_inputs=calibration[0])
    widths = [layer.in_features for layer in solved if isinstance(layer, nn.Linear)]
    assert widths == [8, 16, 16]  # half of each layer's channels
    with torch.no_grad():
        for x, ref in zip(held_out, masked, strict=True):
            torch.testing.assert_close(solved(x), ref, rtol=1e-5, atol=1e-6)


def test_consumers_are_solved_in_the_order_the_forward_calls_them() -> None:
    """Each sees the layers before it re-solved: given in reverse, the same result, and not the
    result of solving the last one first."""
    model = _mlp()
    batches = _mlp_batches(1, 4)
    reference = dense_copy(model)
    groups = DependencyGraph(model, example_inputs=batches[0]).groups("channel")
    keeps = [torch.arange(group.size) % 2 == 0 for group in groups]
    results = []
    for order in ("forward", "reversed", "last first"):
        pruned = copy.deepcopy(model)
        for group, keep in zip(groups, keeps, strict=True):
            for name, mask in expand_keep(group, keep, shapes_of(pruned)).items():
                module, attr = name.rsplit(".", 1)
                custom_from_mask(pruned.get_submodule(module), attr, mask)
        consumers = find_consumers(pruned, groups)
        if order == "last first":  # one call each: the last one sees the first unsolved
            reconstruct(pruned, reference, consumers[1:], batches)
            reconstruct(pruned, reference, consumers[:1], batches)
        else:
            given = consumers if order == "forward" else consumers[::-1]
            solved = reconstruct(pruned, reference, given, batches)
            assert [item.parameter for item in solved] == [c.parameter for c in consumers]
        results.append(pruned.get_parameter("4.weight_orig").detach().clone())
    assert torch.equal(results[1], results[0])
    assert not torch.allclose(results[2], results[0], rtol=1e-3, atol=1e-4)


class _TwoReaders(nn.Module):
    """Two layers reading one tensor, which the forward changes in place between them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc0, self.lin1, self.lin2 = nn.Linear(8, 16), nn.Linear(16, 4), nn.Linear(16, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.relu(self.fc0(x))
        first = self.lin1(h)
        h.mul_(h)  # the same tensor object, other values: lin2 reads its squares
        second: Tensor = self.lin2(h)
        return first + second


def _inputs_of(model: nn.Module, layer: str, batches: list[Tensor]) -> Tensor:
    seen: list[Tensor] = []
    handle = model.get_submodule(layer).register_forward_pre_hook(
        lambda module, args: seen.append(args[0].detach().clone())
    )
    with torch.no_grad():
        for batch in batches:
            model(batch)
    handle.remove()
    return torch.cat(seen)


def test_readers_of_one_input_are_each_the_ridge_solution_of_their_own_inputs() -> None:
    """The readers of one tensor are summed once; a tensor changed in place between them is
    not one input: each layer's weights are the ridge solution of what it reads, by hand."""
    torch.manual_seed(0)
    model = _TwoReaders()
    batches = [torch.randn(32, 8) for _ in range(4)]
    inputs = {layer: _inputs_of(model, layer, batches) for layer in ("lin1", "lin2")}
    weights = {layer: model.get_submodule(layer).weight.detach().clone() for layer in inputs}
    prune_one_shot(
        model, batches, 0.5, structure="channel", example_inputs=batches[0], reconstruct=True,
        reconstruct_damping=0.01, make_permanent=False,
    )  # fmt: skip
    keep = model.fc0.weight_mask[:, 0].bool()
    assert int(keep.sum()) == 8
    for layer, dense in inputs.items():
        kept = _inputs_of(model, layer, batches)[:, keep].double()
        lam = 0.01 * float(kept.square().sum(0).mean())
        by_hand = _lstsq(kept, dense.double(), weights[layer].double(), lam)
        solved = model.get_submodule(layer).weight.detach()[:, keep].double()
        torch.testing.assert_close(solved, by_hand, atol=1e-5, rtol=1e-4)


def _ddp_worker(rank: int, out: Path) -> None:
    model = _mlp()
    batches = _mlp_batches(10 + rank, 3)  # each rank its own data
    prune_one_shot(
        model, batches, 0.5, structure="channel", example_inputs=batches[0], reconstruct=True,
        scope="layerwise",
    )  # fmt: skip
    torch.save(_state(model), out / f"rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.distributed
def test_ranks_with_different_data_solve_the_weights_one_process_gets_on_all_of_it(
    tmp_path: Path,
) -> None:
    spawn_gloo(_ddp_worker, 2, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in (0, 1)]
    model = _mlp()
    everything = _mlp_batches(10, 3) + _mlp_batches(11, 3)
    options: dict[str, Any] = {
        "structure": "channel", "example_inputs": everything[0], "scope": "layerwise",
        "reconstruct": True,
    }  # fmt: skip
    prune_one_shot(model, everything, 0.5, **options)
    alone = _mlp()  # one rank's data alone: other weights
    prune_one_shot(alone, everything[:3], 0.5, **options)
    assert list(ranks[0]) == list(ranks[1]) == list(_state(model))
    for name, oracle in _state(model).items():
        assert torch.equal(ranks[0][name], ranks[1][name]), name
        torch.testing.assert_close(ranks[0][name], oracle, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(ranks[0]["4.weight"], _state(alone)["4.weight"], atol=1e-4)


# --- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        pytest.param({"structure": "element"}, ValueError,
                     "structure='channel', 'head' or 'hidden'", id="element"),
        pytest.param({"structure": "layer"}, ValueError, "got 'layer'", id="layer"),
        pytest.param({"structure": "channel", "reconstruct": 1}, TypeError,
                     "`reconstruct` to be a bool", id="not-bool"),
        pytest.param({"structure": "channel", "reconstruct_damping": -0.1}, ValueError,
                     "`reconstruct_damping` to be a finite float >= 0", id="negative"),
        pytest.param({"structure": "channel", "reconstruct_damping": "0.1"}, TypeError,
                     "`reconstruct_damping` to be a finite float >= 0", id="string"),
    ],
)  # fmt: skip
def test_wrong_options_are_refused_before_any_change(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    model = tiny_llama()
    check = unchanged(model)
    options.setdefault("reconstruct", True)
    with pytest.raises(error, match=match):
        prune_one_shot(model, _batches(model, 1, count=1), 0.5, **options)
    check()


def test_a_convolution_reading_pruned_channels_is_refused_before_any_change() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    images = [torch.randn(2, 3, 8, 8)]
    check = unchanged(model)
    with pytest.raises(ValueError, match="but '2' is a Conv2d: reconstruction re-solves"):
        prune_one_shot(
            model, images, 0.5, structure="channel", example_inputs=images[0], reconstruct=True
        )
    check()


def test_inputs_that_do_not_match_the_attention_mask_are_named() -> None:
    model = tiny_llama()
    padded = torch.ones(2, 8)
    padded[1, 6:] = 0  # the second sequence is two tokens shorter
    batches = [{"input_ids": torch.randint(1, VOCAB, (2, 8)), "attention_mask": padded}]

    def flat(model: nn.Module, batch: Batch) -> Any:  # a forward that folds the batch away
        return model(input_ids=batch["input_ids"].reshape(1, -1))

    where = r"'model\.layers\.0\.mlp\.down_proj' reads per token to be laid out"
    check = unchanged(model)
    with pytest.raises(ValueError, match=where):
        prune_one_shot(
            model, batches, 0.5, structure="channel", reconstruct=True, forward=flat,
            importance="magnitude",
        )  # fmt: skip
    check()


def test_a_parameter_budget_over_channels_and_heads_reconstructed_loads_with_from_pretrained(
    tmp_path: Path,
) -> None:
    """The one-shot recipe: a budget of 80% of the parameters over FFN channels and heads,
    equal widths per layer, reconstructed: at the budget, closer to the dense model than the
    same pruning without reconstruction, and loaded back by plain ``from_pretrained``."""
    transformers = pytest.importorskip("transformers")
    model = tiny_llama()
    calibration, held_out = _batches(model, 1), _batches(model, 2, count=4)
    dense = _outputs(model, held_out)
    before = sum(p.numel() for p in model.parameters())
    options = {"target_params": 0.8, "structure": ("channel", "head"), "scope": "layerwise"}
    plain, solved = copy.deepcopy(model), copy.deepcopy(model)
    prune_one_shot(plain, calibration, importance="wanda", **options)
    prune_one_shot(solved, calibration, importance="wanda", reconstruct=True, **options)
    assert _error(solved, dense, held_out) < 0.9 * _error(plain, dense, held_out)
    masked = _outputs(solved, held_out)
    report = shrink(solved)
    assert report.config == "uniform"
    assert sum(p.numel() for p in solved.parameters()) <= int(0.8 * before)
    solved.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for out, ref in zip(_outputs(loaded, held_out), masked, strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
