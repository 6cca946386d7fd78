"""Calibration data is checked as it is read: a non-finite input or activation is refused,
naming the batch and the first module where the value appears, and nothing changes (the model is
compared whole: ``tests/model_state.py``). A re-solve that is not finite is refused too, naming
the layer and the damping, and the layers solved before it get their weights back.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning import OneShotSchedule, Pruner, prune_one_shot
from tensorplay.ao.pruning.pruner.one_shot import calibrate
from tests.model_state import unchanged


class Sqrt(nn.Module):
    """NaN for a negative input: an activation that goes non-finite inside the model."""

    def forward(self, x: Tensor) -> Tensor:
        return x.sqrt()


def mlp(sqrt: bool = False) -> nn.Sequential:
    torch.manual_seed(0)
    middle: nn.Module = Sqrt() if sqrt else nn.ReLU()
    return nn.Sequential(nn.Linear(4, 16), middle, nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))


def batches(nan_at: int | None = None, count: int = 4) -> list[Tensor]:
    generator = torch.Generator().manual_seed(1)
    found = [torch.randn(8, 4, generator=generator) for _ in range(count)]
    if nan_at is not None:
        found[nan_at][3, 1] = float("nan")
    return found


ONE_SHOT = {"structure": "channel", "scope": "layerwise", "importance": "magnitude"}


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
@pytest.mark.parametrize("reconstruct", [True, False], ids=["reconstruct", "no-reconstruct"])
def test_a_nan_in_a_calibration_batch_is_refused_naming_the_batch(
    masking: str, reconstruct: bool
) -> None:
    model = mlp()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"batch 2 holds a non-finite value \(nan\) in its input"):
        prune_one_shot(
            model,
            batches(nan_at=2),
            0.5,
            example_inputs=torch.randn(2, 4),
            reconstruct=reconstruct,
            masking=masking,
            **ONE_SHOT,
        )
    check()


def test_an_activation_that_goes_nan_is_refused_naming_the_first_module_where_it_appears() -> None:
    model = mlp(sqrt=True)
    data = [x.abs() for x in batches()]  # the first Linear makes some negative: sqrt gives NaN
    check = unchanged(model)
    with pytest.raises(
        ValueError, match=r"batch 0 first gives a non-finite value \(nan\) in the output of '1' "
    ):
        prune_one_shot(model, data, 0.5, importance="wanda")
    check()


def test_a_wanda_calibration_pass_refuses_a_nan_before_it_reaches_a_score() -> None:
    model = mlp()
    pruner = Pruner(model, OneShotSchedule(0.5), importance="wanda", scope="row")
    calibrate(pruner, batches())
    before = {name: total.clone() for name, total in pruner.importance._sums.items()}
    with pytest.raises(ValueError, match=r"batch 1 holds a non-finite value \(nan\)"):
        calibrate(pruner, batches(nan_at=1))
    # the good batch 0 of the second pass counted, the bad one did not reach any sum
    after = pruner.importance._sums
    assert set(after) == set(before)
    assert all(torch.isfinite(total).all() for total in after.values())


def test_a_nan_read_by_a_layer_in_a_users_own_loop_is_refused_naming_that_layer() -> None:
    model = mlp()
    pruner = Pruner(model, OneShotSchedule(0.5), importance="wanda", scope="row")
    with torch.no_grad():
        model(batches()[0])
        with pytest.raises(ValueError, match=r"batch 1 gives a non-finite value \(nan\) in the "
                           r"input of '0'"):  # fmt: skip
            model(batches(nan_at=0)[0])
    pruner.step()  # the refused forward added nothing: scores stay finite
    assert pruner.pruned_count() == pruner.total_count() // 2


def test_a_re_solve_that_is_not_finite_is_refused_naming_the_layer_and_the_damping() -> None:
    model = mlp()
    with torch.no_grad():
        model[0].weight.mul_(1e20)  # the next layer's inputs ~1e20: their Gram overflows float32
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"re-solved weights of '2.weight' to be finite, but the "
                       r"ridge solve with damping 0.01"):  # fmt: skip
        prune_one_shot(
            model,
            batches(),
            0.5,
            example_inputs=torch.randn(2, 4),
            reconstruct=True,
            reconstruct_damping=0.01,
            **ONE_SHOT,
        )
    check()


def test_a_re_solve_refused_at_a_later_layer_gives_the_earlier_layers_their_weights_back() -> None:
    model = mlp()
    with torch.no_grad():
        model[2].weight.mul_(1e20)  # the last layer's inputs overflow; the middle one's do not
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"re-solved weights of '4.weight'"):
        prune_one_shot(
            model,
            batches(),
            0.5,
            example_inputs=torch.randn(2, 4),
            reconstruct=True,
            masking="inplace",
            **ONE_SHOT,
        )
    check()  # 2.weight was re-solved first, then given back with everything else
