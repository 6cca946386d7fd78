"""The one owner of changes to a model: what a transaction records, and what its undo restores.

The oracle is the model as it was, compared whole (``tests/model_state.py``): state_dict bit for
bit and in order, the same parameter, buffer and module objects, every hook, every attribute.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking.lean_masks import install_mask
from tensorplay.ao.pruning.parity.methods import l1_unstructured
from tests.model_state import unchanged


class Refused(Exception):
    pass


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))


def test_a_failed_transaction_takes_back_the_reparametrization_in_order() -> None:
    model = mlp()
    check = unchanged(model)
    with pytest.raises(Refused), changes.transaction():
        l1_unstructured(model[0], "weight", amount=3)
        l1_unstructured(model[0], "bias", amount=1)
        l1_unstructured(model[0], "weight", amount=2)  # a container now
        raise Refused
    check()
    assert list(model[0]._parameters) == ["weight", "bias"]  # the order too


def test_a_failed_transaction_takes_back_buffers_hooks_and_attributes() -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    check = unchanged(model, optimizer)
    with pytest.raises(Refused), changes.transaction():
        install_mask([(model[2], "weight")], torch.ones(2, 6, dtype=torch.bool))
        changes.hook(model[0].register_forward_hook, lambda module, args, output: None)
        changes.hook(model[2].weight.register_post_accumulate_grad_hook, lambda p: None)
        changes.hook(optimizer.register_step_pre_hook, lambda opt, args, kwargs: None)
        changes.set_attribute(model, "tensorplay_unit_groups", ())
        changes.touch(model[2])
        del model[2]._parameters["bias"]
        raise Refused
    check()


def test_a_successful_transaction_keeps_every_change() -> None:
    model = mlp()
    with changes.transaction() as record:
        l1_unstructured(model[0], "weight", amount=3)
    assert len(record) == 1  # one module touched
    assert int((model[0].weight_mask == 0).sum()) == 3


def test_an_inner_failure_caught_inside_undoes_the_inner_changes_only() -> None:
    model = mlp()
    with changes.transaction():
        changes.set_attribute(model[0], "kept", 1)
        check = unchanged(model)
        with pytest.raises(Refused), changes.transaction():
            changes.set_attribute(model[2], "dropped", 2)
            raise Refused
        check()
    assert model[0].kept == 1 and not hasattr(model[2], "dropped")


def test_an_outer_failure_undoes_what_inner_transactions_kept() -> None:
    model = mlp()
    check = unchanged(model)
    with pytest.raises(Refused), changes.transaction():
        with changes.transaction():
            l1_unstructured(model[0], "weight", amount=3)
        raise Refused
    check()


@pytest.mark.parametrize("keep", [True, False], ids=["values-kept", "values-not-kept"])
def test_values_written_in_place_come_back_only_where_the_transaction_keeps_them(
    keep: bool,
) -> None:
    model = mlp()
    before = model[0].weight.detach().clone()
    with pytest.raises(Refused), changes.transaction(keep_values=keep):
        changes.keep_values(model[0].weight)
        with torch.no_grad():
            model[0].weight.zero_()
        raise Refused
    assert torch.equal(model[0].weight.detach(), before) is keep


def test_a_keyboard_interrupt_is_undone_too() -> None:
    model = mlp()
    check = unchanged(model)
    with pytest.raises(KeyboardInterrupt), changes.transaction():
        l1_unstructured(model[2], "weight", amount=1)
        raise KeyboardInterrupt
    check()


def test_a_hook_removed_by_a_failed_transaction_is_no_longer_registered() -> None:
    layer = nn.Linear(2, 2)
    with pytest.raises(Refused), changes.transaction():
        handle = changes.hook(layer.register_forward_hook, lambda module, args, output: None)
        assert changes.is_registered(handle)
        raise Refused
    assert not changes.is_registered(handle)


def test_outside_a_transaction_changes_are_made_and_nothing_is_recorded() -> None:
    layer = nn.Linear(2, 2)
    changes.set_attribute(layer, "note", 1)
    changes.keep_values(layer.weight)  # nothing to keep values for
    assert layer.note == 1
