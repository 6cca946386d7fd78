"""``permanent_state_dict``: what a model under pruning would save once permanent, model untouched.

Includes the Hugging Face pattern ``save_pretrained(d, state_dict=permanent_state_dict(model))``
on a tiny GPT-2 built from a config, and the pitfall of a bare ``save_pretrained``.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import (
    L1Unstructured,
    global_unstructured,
    l1_unstructured,
    permanent_state_dict,
    random_unstructured,
    remove,
)
from tests.hf_models import tiny_gpt2
from tests.model_state import unchanged


def _conv_net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3),
        nn.BatchNorm2d(4),
        nn.Flatten(),
        nn.Linear(16, 8),
        nn.LayerNorm(8),
        nn.Linear(8, 3),
    )


def _pruned_conv_net() -> nn.Sequential:
    model = _conv_net()
    l1_unstructured(model[0], "weight", amount=20)
    l1_unstructured(model[3], "weight", amount=0.5)
    l1_unstructured(model[3], "weight", amount=10)  # a PruningContainer
    random_unstructured(model[5], "bias", amount=1)  # a bias pruned, its weight not
    random_unstructured(model[5], "weight", amount=5)  # pruned after the bias
    return model


def _unchanged(model: nn.Module) -> Callable[[], None]:
    """Everything permanent_state_dict must leave alone: the whole model
    (:func:`tests.model_state.unchanged`: its masked attributes too) and its gradients."""
    check = unchanged(model)
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]

    def check_all() -> None:
        check()
        now = [p.grad for p in model.parameters()]
        assert len(now) == len(grads)
        for a, b in zip(now, grads, strict=True):
            assert (a is None and b is None) or (a is not None and torch.equal(a, b))

    return check_all


def _pruned(model: nn.Module) -> list[str]:
    buffers = model.named_buffers(remove_duplicate=False)
    return [key[: -len("_mask")] for key, _ in buffers if key.endswith("_mask")]


def test_equals_the_state_dict_after_making_pruning_permanent() -> None:
    model = _pruned_conv_net()
    model(torch.randn(2, 2, 4, 4)).sum().backward()
    check = _unchanged(model)

    state = permanent_state_dict(model)

    check()
    dense_keys = list(_conv_net().state_dict())
    permanent = copy.deepcopy(model)
    for name in _pruned(permanent):
        module_name, _, tensor = name.rpartition(".")
        remove(permanent.get_submodule(module_name), tensor)
    expected = permanent.state_dict()
    assert list(state) == dense_keys  # the unpruned model's order, not remove()'s
    assert sorted(expected) == sorted(dense_keys)
    for key in dense_keys:
        assert state[key].dtype == expected[key].dtype, key
        assert torch.equal(state[key], expected[key]), key
        assert not state[key].requires_grad, key
    assert int((state["0.weight"] == 0).sum()) == 20
    for name in _pruned(model):  # mask * orig is -0.0 at pruned negative weights; not here
        assert int(torch.signbit(expected[name][expected[name] == 0]).sum()) > 0, name
        assert int(torch.signbit(state[name][state[name] == 0]).sum()) == 0, name
    fresh = _conv_net(seed=1)
    fresh.load_state_dict(state, strict=True)
    inputs = torch.randn(3, 2, 4, 4)
    assert torch.equal(fresh.eval()(inputs), model.eval()(inputs))


def test_unpruned_model_gives_its_state_dict() -> None:
    model = _conv_net()
    state, expected = permanent_state_dict(model), model.state_dict()
    assert list(state) == list(expected)
    assert all(state[k].data_ptr() == v.data_ptr() for k, v in expected.items())


def test_half_precision_parameter_keeps_its_dtype() -> None:
    model = nn.Linear(8, 4).to(torch.bfloat16)
    l1_unstructured(model, "weight", amount=16)
    state = permanent_state_dict(model)
    assert list(state) == ["weight", "bias"]
    assert state["weight"].dtype == torch.bfloat16
    assert torch.equal(state["weight"], model.weight_orig.detach() * model.weight_mask)


def test_rnn_keys_come_back_in_the_order_of_its_flat_weights() -> None:
    torch.manual_seed(0)
    model = nn.LSTM(3, 4, num_layers=2)
    dense = list(model.state_dict())
    l1_unstructured(model, "weight_ih_l0", amount=5)
    l1_unstructured(model, "bias_hh_l1", amount=3)
    assert list(model.state_dict()) != dense
    assert list(permanent_state_dict(model)) == dense


def test_tied_aliases_are_one_tensor_and_round_trip() -> None:
    torch.manual_seed(0)
    embedding, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight
    model = nn.ModuleDict({"wte": embedding, "lm_head": head})
    global_unstructured([(head, "weight"), (embedding, "weight")], L1Unstructured, amount=0.5)
    assert head.weight_mask is embedding.weight_mask

    state = permanent_state_dict(model)

    assert list(state) == ["wte.weight", "lm_head.weight"]
    assert state["wte.weight"] is state["lm_head.weight"]
    assert int((state["wte.weight"] == 0).sum()) == 20


def test_unpruned_tied_aliases_are_one_tensor_too() -> None:
    first, second = nn.Linear(3, 3), nn.Linear(3, 3)
    second.weight = first.weight
    model = nn.Sequential(first, second)
    assert model.state_dict()["0.weight"] is not model.state_dict()["1.weight"]
    state = permanent_state_dict(model)
    assert state["0.weight"] is state["1.weight"]
    assert state["0.bias"] is not state["1.bias"]


def test_tie_masked_in_one_holder_only_warns_and_keeps_both_values() -> None:
    torch.manual_seed(0)
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    second.weight = first.weight
    model = nn.Sequential(first, second)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the functional API may warn about the other holder
        l1_unstructured(first, "weight", amount=8)

    with pytest.warns(UserWarning, match=r"names \['0.weight', '1.weight'\] of one tied"):
        state = permanent_state_dict(model)

    assert torch.equal(state["0.weight"], first.weight_orig.detach() * first.weight_mask)
    assert torch.equal(state["1.weight"], second.weight.detach())
    assert int((state["0.weight"] == 0).sum()) == 8 and int((state["1.weight"] == 0).sum()) == 0


# --- Hugging Face GPT-2 -----------------------------------------------------------------------


def _tiny_gpt2() -> nn.Module:
    return tiny_gpt2()


def _prune_gpt2(model: Any) -> list[str]:
    pairs = [(m, "weight") for m in model.modules() if type(m).__name__ == "Conv1D"]
    pairs += [(model.lm_head, "weight"), (model.transformer.wte, "weight")]
    assert len(pairs) == 10  # 4 projections per block, and the tied head
    global_unstructured(pairs, L1Unstructured, amount=0.5)
    return _pruned(model)


def _logits(model: Any, tokens: Tensor) -> Tensor:
    with torch.no_grad():
        return model(tokens).logits


TOKENS = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(3))


@pytest.mark.slow
def test_hugging_face_save_pretrained_with_permanent_state_dict_round_trips(
    tmp_path: Path,
) -> None:
    model = _tiny_gpt2()
    dense_keys = list(model.state_dict())
    assert len(_prune_gpt2(model)) == 10
    expected = _logits(model, TOKENS)
    check = _unchanged(model)

    state = permanent_state_dict(model)
    check()
    assert list(state) == dense_keys
    assert state["lm_head.weight"] is state["transformer.wte.weight"]
    model.save_pretrained(tmp_path, state_dict=state)  # it empties `state`: pass a fresh one
    # save_pretrained writes `architectures` and `dtype` into the config; the weights it saved
    # are still the model's own
    assert torch.equal(_logits(model, TOKENS), expected)
    loaded, info = type(model).from_pretrained(tmp_path, output_loading_info=True)
    assert {k: sorted(v) for k, v in info.items()} == {
        "missing_keys": [],
        "unexpected_keys": [],
        "mismatched_keys": [],
        "error_msgs": [],
    }
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    assert torch.equal(_logits(loaded.eval(), TOKENS), expected)
    zeros = int((loaded.transformer.h[0].attn.c_attn.weight == 0).sum())
    assert zeros == int((model.transformer.h[0].attn.c_attn.weight_mask == 0).sum()) > 0


@pytest.mark.slow
def test_bare_save_pretrained_of_a_pruned_model_does_not_round_trip(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The pitfall the docs warn about: HF saves ``_orig``/``_mask`` and re-initialises."""
    model = _tiny_gpt2()
    _prune_gpt2(model)
    expected = _logits(model, TOKENS)

    model.save_pretrained(tmp_path)

    with caplog.at_level(logging.CRITICAL):
        loaded, info = type(model).from_pretrained(tmp_path, output_loading_info=True)
    assert "transformer.h.0.attn.c_attn.weight" in info["missing_keys"]
    assert "transformer.h.0.attn.c_attn.weight_orig" in info["unexpected_keys"]
    assert not torch.equal(_logits(loaded.eval(), TOKENS), expected)
