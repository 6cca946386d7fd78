"""Nothing left out silently: a selected tensor that no unit of the chosen kind spans is named
once when the pruner is built (a ``UserWarning``: which tensors, their share of the selected
parameters, why) and under the report's table; the pruner still builds and prunes."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tests.hf_models import tiny_gpt2, tiny_llama, tiny_vit


class Spare(nn.Module):
    """An MLP whose norm stops tracing at '2' and whose 'spare' layer the forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(
            nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2)
        )  # fmt: skip
        self.spare = nn.Linear(8, 8)

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)


def built(model: nn.Module, **options: object) -> tuple[Pruner, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pruner = Pruner(model, OneShotSchedule(0.25), **options)  # type: ignore[arg-type]
    return pruner, [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def test_a_traced_model_names_each_tensor_left_dense_with_why_and_its_share() -> None:
    model = Spare()
    pruner, messages = built(model, structure="channel", example_inputs=torch.randn(2, 4))
    assert len(messages) == 1, messages
    [message] = messages
    share = (16 + 64) / (32 + 64 + 16 + 64)  # body.4 and spare of all four selected weights
    assert message.startswith(
        f"structure='channel' leaves 2 selected tensors of 4 dense ({100 * share:.2f}% of "
        "the selected parameters)"
    )
    assert "'body.4.weight': its output channels cannot go: they reach the model's output" in (
        message
    )
    assert "'spare.weight': not in the traced forward" in message
    assert "'body.2.weight'" not in message  # the input columns of body.0's channels
    assert pruner.step() == 2  # it builds and prunes the channels it has
    note = str(pruner.report()).splitlines()[-1]
    assert note == (
        f"dense: 2 selected tensors ({100 * share:.2f}% of the selected parameters) in no "
        "channel unit: 'body.4.weight', 'spare.weight'"
    )


def test_a_group_the_selection_does_not_hold_whole_names_its_tensors() -> None:
    model = tiny_llama()
    pruner, messages = built(model, structure="channel", exclude=[r"layers\.1\.mlp\.down_proj"])
    assert len(messages) == 1, messages
    needs = "its channel group 'model.layers.1.mlp' also needs "
    assert re.search(
        r"leaves 2 selected tensors of \d+ dense .*'model\.layers\.1\.mlp\.gate_proj\.weight', "
        r"'model\.layers\.1\.mlp\.up_proj\.weight': " + re.escape(needs),
        messages[0],
    )
    assert "model.layers.1.mlp.down_proj.weight" in messages[0]
    assert "in no channel unit: 'model.layers.1.mlp.gate_proj.weight'" in str(pruner.report())


@pytest.mark.parametrize(
    ("build", "structure"),
    [
        (tiny_llama, "channel"), (tiny_llama, "head"), (tiny_llama, "layer"),
        (tiny_gpt2, "channel"), (tiny_vit, "head"),
    ],
)  # fmt: skip
def test_what_a_family_leaves_whole_by_design_is_not_named(build: object, structure: str) -> None:
    model = build()  # type: ignore[operator]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        pruner = Pruner(model, OneShotSchedule(0.25), structure=structure)  # type: ignore[arg-type]
    assert pruner.structure.notes == ()
    assert not str(pruner.report()).splitlines()[-1].startswith("dense")


def test_an_output_layer_spanned_as_a_consumer_is_not_named() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        pruner = Pruner(
            model, OneShotSchedule(0.25), structure="channel", example_inputs=torch.randn(2, 4)
        )
    assert pruner.structure.notes == ()


def test_the_tensors_of_a_layer_pruned_before_are_not_named() -> None:
    """A block masked whole is removed with its tensors by ``shrink``: the hidden structure
    built after a layer pruning, which leaves that block out, names none of them; the blocks
    kept stay spanned."""
    from tensorplay.ao.pruning import prune_one_shot
    from tensorplay.ao.pruning.structured.units.kept_grid import masked_blocks

    model = tiny_llama()
    batches = [
        torch.randint(3, 90, (2, 16), generator=torch.Generator().manual_seed(i)) for i in (0, 1)
    ]
    prune_one_shot(model, batches, 0.34, structure="layer", scope="layerwise", make_permanent=False)
    pruner, messages = built(model, structure="hidden", importance="magnitude")
    assert not [m for m in messages if "dense" in m]
    assert pruner.report().notes == ()
    (removed,) = masked_blocks(model)
    (group,) = pruner.structure.groups
    inside = {piece.parameter.startswith(f"{removed}.") for piece in group.slices}
    assert inside == {False}
    assert {
        piece.parameter.split(".")[2] for piece in group.slices if ".layers." in piece.parameter
    } == {str(i) for i in range(3) if f"model.layers.{i}" != removed}
