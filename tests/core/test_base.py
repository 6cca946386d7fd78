"""``base.py``: the hook chain and the refusal of a tensor pruned by ``torch.nn.utils.prune``
(the parity of the methods themselves is in ``test_parity_methods``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch.nn.utils.prune as torch_prune
from torch import nn

from tensorplay.ao.pruning import (
    Identity,
    L1Unstructured,
    PruningContainer,
    global_unstructured,
    l1_unstructured,
    ln_structured,
    random_unstructured,
)
from tensorplay.ao.pruning.parity.base import chain_hooks
from tests.model_state import unchanged

TORCH_PRUNED = (
    r"Expected \(Linear, 'weight'\) to be unpruned or pruned by tensorplay, but it was pruned by "
    r"torch.nn.utils.prune \(its hook is L1Unstructured\).*"
    r"torch.nn.utils.prune.remove\(module, 'weight'\).*restore_pruning"
)


@pytest.mark.parametrize(
    "prune",
    [
        pytest.param(lambda m: l1_unstructured(m, "weight", amount=1), id="l1_unstructured"),
        pytest.param(lambda m: random_unstructured(m, "weight", amount=1), id="random"),
        pytest.param(lambda m: ln_structured(m, "weight", amount=1, n=1, dim=0), id="ln"),
        pytest.param(
            lambda m: global_unstructured([(m, "weight")], L1Unstructured, amount=1),
            id="global_unstructured",
        ),
    ],
)
def test_a_tensor_pruned_by_torch_is_refused_with_the_way_out(
    prune: Callable[[nn.Module], object],
) -> None:
    layer = torch_prune.l1_unstructured(nn.Linear(3, 2), "weight", amount=2)
    check = unchanged(layer)
    with pytest.raises(TypeError, match=TORCH_PRUNED):
        prune(layer)
    check()


def test_chain_hooks_makes_then_extends_a_container() -> None:
    first, second, third = Identity(), Identity(), Identity()
    for method in (first, second, third):
        method._tensor_name = "weight"
    assert chain_hooks(None, first) is first
    container = chain_hooks(first, second)
    assert isinstance(container, PruningContainer) and list(container) == [first, second]
    assert chain_hooks(container, third) is container and list(container)[-1] is third
