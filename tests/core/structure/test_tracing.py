"""Channels of plain PyTorch models found by tracing: the exact groups, and the oracle that
masking random units gives the same outputs as removing them (train and eval mode)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tensorplay.ao.pruning import l1_unstructured
from tensorplay.ao.pruning.structured.dependency.tracing import (
    trace_channels,
    traced_groups,
)
from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
from tensorplay.ao.pruning.structured.shrinking.shrink import shrink
from tests.core.structure.masking import MODES, mask_units
from tests.model_state import unchanged


def _out(parameter: str, width: int = 1, offset: int = 0) -> Slice:
    """A producer's weight rows."""
    return Slice(parameter, 0, offset, width)


def _entry(parameter: str, width: int = 1, offset: int = 0) -> Slice:
    """An unscored per-channel entry: a bias or a norm's weight or bias."""
    return Slice(parameter, 0, offset, width, scored=False)


def _in(parameter: str, width: int = 1, offset: int = 0) -> Slice:
    """A consumer's input columns."""
    return Slice(parameter, 1, offset, width)


def _norm(prefix: str) -> tuple[Slice, Slice]:
    return _entry(f"{prefix}.weight"), _entry(f"{prefix}.bias")


def _channel(name: str, size: int, *slices: Slice) -> UnitGroup:
    return UnitGroup(name, "channel", size, slices)


# -- the oracle --------------------------------------------------------------------------------


def _random_keep(groups: list[UnitGroup], seed: int) -> list[Tensor]:
    """Random keep flags per group, at least one unit kept and one removed where possible."""
    generator = torch.Generator().manual_seed(seed)
    keeps = []
    for group in groups:
        keep = torch.rand(group.size, generator=generator) < 0.5
        keep[0] = True
        if group.size > 1:
            keep[-1] = False
        keeps.append(keep)
    return keeps


def _outputs(model: nn.Module, x: Tensor, training: bool) -> Tensor:
    model.train(training)
    out: Tensor = model(x)
    return out


def _with_norm_statistics(model: nn.Module) -> nn.Module:
    """``model`` with the running statistics and affine parameters of its norms drawn at random,
    one value per channel: fresh ones (means 0, variances 1, weights 1, biases 0) are the same
    for every channel, and could not show a channel's statistics taken from another index."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, nn.modules.batchnorm._NormBase):
                continue
            size = (module.num_features,)
            if module.running_mean is not None and module.running_var is not None:
                module.running_mean.copy_(torch.randn(size, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(size, generator=generator))
            if module.affine:
                module.weight.copy_(1 + torch.randn(size, generator=generator))
                module.bias.copy_(torch.randn(size, generator=generator))
    return model


def _assert_masking_equals_removing(
    model: nn.Module, groups: list[UnitGroup], example: Tensor
) -> None:
    """The oracle: random units, masked in each way a pruner masks them (a draw per way), give
    the same outputs in the masked model and in the model shrunk by them: in eval mode on the
    BatchNorm running statistics (drawn per channel, so that a channel's statistics taken
    from another index change the outputs), in training mode (BatchNorm on batch statistics,
    which also moves its running statistics), and in eval mode again on the moved ones."""
    model = _with_norm_statistics(model.double())
    for seed, mode in enumerate(MODES):
        keeps = _random_keep(groups, seed)
        masked = copy.deepcopy(model)
        mask_units(masked, list(zip(groups, keeps, strict=True)), mode)
        shrunk = copy.deepcopy(masked)
        report = shrink(shrunk, groups=groups)
        assert report.parameters_after < report.parameters_before == _parameters(model)
        assert report.partial_units == 0
        assert [width.after for width in report.groups] == [int(k.sum()) for k in keeps]
        x = torch.randn(example.shape, generator=torch.Generator().manual_seed(seed)).double()
        for training in (False, True, False):
            expected = _outputs(masked, x, training)
            torch.testing.assert_close(_outputs(shrunk, x, training), expected)
            assert not torch.allclose(_outputs(copy.deepcopy(model), x, training), expected)


def _parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# -- models ------------------------------------------------------------------------------------


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 12), nn.GELU(), nn.Linear(12, 3)
    )


class _ConvNet(nn.Module):
    """Conv-BN-ReLU, pooled, conv-BN, flattened into a Linear classifier head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6)
        self.fc1, self.fc2 = nn.Linear(6 * 4 * 4, 10), nn.Linear(10, 4)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = self.bn2(self.conv2(x)).relu()
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class _Block(nn.Module):
    def __init__(self, channels_in: int, channels: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = (
            nn.Conv2d(channels_in, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
        )
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels)
        self.down = (
            None
            if channels_in == channels
            else nn.Sequential(nn.Conv2d(channels_in, channels, 1), nn.BatchNorm2d(channels))
        )

    def forward(self, x: Tensor) -> Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.down is None else self.down(x)))


class _ResNet(nn.Module):
    """A stem, a block adding its input back, a block with a projection shortcut, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.block1, self.block2 = _Block(8, 8), _Block(8, 12)
        self.head = nn.Linear(12, 5)

    def forward(self, x: Tensor) -> Tensor:
        x = self.block2(self.block1(self.stem(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _stem_group() -> UnitGroup:
    return _channel(
        "stem.0", 8,
        _out("stem.0.weight"), _entry("stem.0.bias"), *_norm("stem.1"),
        _in("block1.conv1.weight"), _out("block1.conv2.weight"), _entry("block1.conv2.bias"),
        *_norm("block1.bn2"), _in("block2.conv1.weight"), _in("block2.down.0.weight"),
    )  # fmt: skip


def _inner_group(block: str, size: int) -> UnitGroup:
    return _channel(
        f"{block}.conv1", size,
        _out(f"{block}.conv1.weight"), _entry(f"{block}.conv1.bias"), *_norm(f"{block}.bn1"),
        _in(f"{block}.conv2.weight"),
    )  # fmt: skip


class _Concat(nn.Module):
    """The input concatenated with one branch, then two branches concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 6, 1)
        self.mix = nn.Conv2d(3 + 4, 5, 1)
        self.c = nn.Conv2d(5, 2, 1)
        self.head = nn.Linear(2 + 6, 3)

    def forward(self, x: Tensor) -> Tensor:
        mixed = F.relu(self.mix(torch.cat([x, F.relu(self.a(x))], dim=1)))
        both = torch.cat([self.c(mixed), self.b(x)], dim=-3)
        return self.head(both.mean((2, 3)))


class _Separable(nn.Module):
    """A depthwise-separable block, and a grouped conv with two groups."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        self.bn_dw = nn.BatchNorm2d(8)
        self.pointwise = nn.Conv2d(8, 6, 1)
        self.grouped = nn.Conv2d(6, 4, 3, padding=1, groups=2)
        self.head = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn(self.conv(x)))
        x = F.relu6(self.bn_dw(self.depthwise(x)))
        x = self.grouped(F.relu(self.pointwise(x)))
        return self.head(F.adaptive_avg_pool2d(F.relu(x), 1).flatten(1))


class _Normed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm = nn.Linear(8, 16), nn.LayerNorm(16)
        self.fc2, self.fc3 = nn.Linear(16, 12), nn.Linear(12, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc3(F.relu(self.fc2(self.norm(self.fc1(x)))))


# -- the groups and the oracle per model -------------------------------------------------------


def test_an_mlp_has_one_group_per_hidden_layer_and_never_its_outputs() -> None:
    model = _mlp()
    expected = [
        _channel("0", 16, _out("0.weight"), _entry("0.bias"), _in("2.weight")),
        _channel("2", 12, _out("2.weight"), _entry("2.bias"), _in("4.weight")),
    ]
    assert traced_groups(model, None) == {"channel": expected}
    assert traced_groups(model, torch.randn(5, 8)) == {"channel": expected}
    assert trace_channels(model).unprunable == {"4": "they reach the model's output"}
    _assert_masking_equals_removing(model, expected, torch.randn(5, 8))


def test_a_cnn_flattened_into_a_linear_gives_each_channel_its_h_times_w_columns() -> None:
    model = _ConvNet()
    expected = [
        _channel(
            "conv1", 8, _out("conv1.weight"), _entry("conv1.bias"), *_norm("bn1"),
            _in("conv2.weight"),
        ),
        _channel("conv2", 6, _out("conv2.weight"), *_norm("bn2"), _in("fc1.weight", width=16)),
        _channel("fc1", 10, _out("fc1.weight"), _entry("fc1.bias"), _in("fc2.weight")),
    ]  # fmt: skip
    example = torch.randn(4, 3, 8, 8)
    assert traced_groups(model, example)["channel"] == expected
    _assert_masking_equals_removing(model, expected, example)


def test_without_example_inputs_a_flattened_feature_map_is_left_out_and_said_why() -> None:
    trace = trace_channels(_ConvNet())
    assert [group.name for group in trace.groups] == ["conv1", "fc1"]
    assert trace.unprunable["conv2"] == (
        "they reach torch.flatten, which reshapes them (needs the shapes that example_inputs give)"
    )


def test_residual_additions_join_the_channels_they_add() -> None:
    model = _ResNet()
    expected = [
        _stem_group(),
        _inner_group("block1", 8),
        _inner_group("block2", 12),
        _channel(
            "block2.conv2", 12,
            _out("block2.conv2.weight"), _entry("block2.conv2.bias"), *_norm("block2.bn2"),
            _out("block2.down.0.weight"), _entry("block2.down.0.bias"), *_norm("block2.down.1"),
            _in("head.weight"),
        ),
    ]  # fmt: skip
    example = torch.randn(2, 3, 6, 6)
    assert traced_groups(model, example)["channel"] == expected
    _assert_masking_equals_removing(model, expected, example)


def test_concatenation_places_each_branch_at_its_offset_in_the_consumer() -> None:
    model = _Concat()
    expected = [
        _channel("a", 4, _out("a.weight"), _entry("a.bias"), _in("mix.weight", offset=3)),
        _channel("b", 6, _out("b.weight"), _entry("b.bias"), _in("head.weight", offset=2)),
        _channel("mix", 5, _out("mix.weight"), _entry("mix.bias"), _in("c.weight")),
        _channel("c", 2, _out("c.weight"), _entry("c.bias"), _in("head.weight")),
    ]
    example = torch.randn(2, 3, 5, 5)
    assert traced_groups(model, example)["channel"] == expected
    _assert_masking_equals_removing(model, expected, example)


def test_a_channel_concatenated_twice_spans_both_places_in_the_consumer() -> None:
    class ConcatenatedReLU(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.head = nn.Linear(4, 3), nn.Linear(6, 2)

        def forward(self, x: Tensor) -> Tensor:
            y = self.fc(x)
            return self.head(torch.cat([F.relu(y), F.relu(-y)], dim=-1))

    model = ConcatenatedReLU()
    expected = [
        _channel(
            "fc", 3, _out("fc.weight"), _entry("fc.bias"), _in("head.weight"),
            _in("head.weight", offset=3),
        )
    ]  # fmt: skip
    assert traced_groups(model, None)["channel"] == expected
    _assert_masking_equals_removing(model, expected, torch.randn(5, 4))


def test_chunks_of_a_fused_projection_pair_their_positions() -> None:
    class FusedGate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(4, 2 * 5), nn.Linear(5, 3)

        def forward(self, x: Tensor) -> Tensor:
            gate, value = self.up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * value)

    model = FusedGate()
    expected = [
        _channel(
            "up", 5, _out("up.weight"), _out("up.weight", offset=5), _entry("up.bias"),
            _entry("up.bias", offset=5), _in("down.weight"),
        )
    ]  # fmt: skip
    assert traced_groups(model, None)["channel"] == expected
    _assert_masking_equals_removing(model, expected, torch.randn(5, 4))


def test_a_depthwise_conv_joins_each_input_channel_with_its_output_and_groups_go_whole() -> None:
    model = _Separable()
    expected = [
        _channel(
            "conv", 8,
            _out("conv.weight"), _entry("conv.bias"), *_norm("bn"), _out("depthwise.weight"),
            *_norm("bn_dw"), _in("pointwise.weight"),
        ),
        _channel(
            "pointwise", 2,
            _out("pointwise.weight", width=3), _entry("pointwise.bias", width=3),
            _out("grouped.weight", width=2), _entry("grouped.bias", width=2),
            _in("head.weight", width=2),
        ),
    ]  # fmt: skip
    example = torch.randn(2, 3, 5, 5)
    assert traced_groups(model, example)["channel"] == expected
    _assert_masking_equals_removing(model, expected, example)


def test_a_layernorm_over_the_channels_leaves_them_out() -> None:
    model = _Normed()
    trace = trace_channels(model, torch.randn(4, 8))
    assert trace.groups == [
        _channel("fc2", 12, _out("fc2.weight"), _entry("fc2.bias"), _in("fc3.weight"))
    ]
    assert trace.unprunable == {
        "fc1": "they reach module 'norm' (LayerNorm), which normalises across them",
        "fc3": "they reach the model's output",
    }
    _assert_masking_equals_removing(model, trace.groups, torch.randn(4, 8))


class _Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> Tensor:
        if x.sum() > 0:  # control flow on a tensor's values: torch.fx cannot trace it
            return self.fc(x)
        return x


def test_an_untraceable_forward_is_refused_naming_the_submodule_and_nothing_changes() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Sequential(_Gate()))
    check = unchanged(model)
    with pytest.raises(
        ValueError,
        match=r"^Expected the forward of submodule '2\.0' \(_Gate\) to be traceable by "
        r"torch\.fx .* but tracing failed \(TraceError: symbolically traced variables cannot "
        r"be used as inputs to control flow\)\. torch\.fx traces with symbolic values",
    ):
        traced_groups(model, torch.randn(3, 4))
    check()


def test_an_untraceable_forward_of_the_model_itself_is_named_too() -> None:
    with pytest.raises(
        ValueError, match=r"^Expected the forward of the model itself \(_Gate\) to be traceable"
    ):
        traced_groups(_Gate(), None)


def test_a_width_joined_with_the_models_input_is_never_a_group() -> None:
    class InputResidual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.head = nn.Linear(6, 10), nn.Linear(10, 6), nn.Linear(6, 2)

        def forward(self, x: Tensor) -> Tensor:
            return self.head(x + self.fc2(F.relu(self.fc1(x))))

    model = InputResidual()
    expected = [_channel("fc1", 10, _out("fc1.weight"), _entry("fc1.bias"), _in("fc2.weight"))]
    with_shapes, without = trace_channels(model, torch.randn(3, 6)), trace_channels(model)
    assert with_shapes.groups == without.groups == expected
    assert with_shapes.unprunable["fc2"] == (
        "they reach operator.add, which combines them with values that cannot be removed (the "
        "model's input, a parameter or buffer used directly, or a result the analysis does not "
        "follow)"
    )
    assert without.unprunable["fc2"] == (
        "they reach operator.add, which combines them with a tensor of unknown shape (needs the "
        "shapes that example_inputs give)"
    )
    _assert_masking_equals_removing(model, expected, torch.randn(3, 6))


class _SqueezeExcite(nn.Module):
    """Channel gates computed from the feature map itself, reshaped by sizes read from it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc1, self.fc2 = (
            nn.Conv2d(3, 8, 3, padding=1),
            nn.Linear(8, 4),
            nn.Linear(4, 8),
        )
        self.out, self.head = nn.Conv2d(8, 5, 1), nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.conv(x))
        b, c, _, _ = x.shape
        gate = torch.sigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1).view(b, c)))))
        x = x * gate.view(b, c, 1, 1)
        return self.head(self.out(x).mean((2, 3)))


def test_gates_multiplied_into_a_feature_map_join_its_channels() -> None:
    model = _SqueezeExcite()
    expected = [
        _channel(
            "conv", 8,
            _out("conv.weight"), _entry("conv.bias"), _in("fc1.weight"), _out("fc2.weight"),
            _entry("fc2.bias"), _in("out.weight"),
        ),
        _channel("fc1", 4, _out("fc1.weight"), _entry("fc1.bias"), _in("fc2.weight")),
        _channel("out", 5, _out("out.weight"), _entry("out.bias"), _in("head.weight")),
    ]  # fmt: skip
    example = torch.randn(2, 3, 4, 4)
    assert traced_groups(model, example)["channel"] == expected
    _assert_masking_equals_removing(model, expected, example)


class _ChannelsLast(nn.Module):
    """A Linear over the channels of a feature map moved last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc, self.head = (
            nn.Conv2d(3, 6, 3, padding=1),
            nn.Linear(6, 8),
            nn.Linear(8, 2),
        )

    def forward(self, x: Tensor) -> Tensor:
        y = F.gelu(self.fc(self.conv(x).permute(0, 2, 3, 1)))
        return self.head(y.mean((1, 2)))


class _Selected(nn.Module):
    """Two projections, one chosen per position by a comparison."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.a(x), self.b(x)
        return self.head(torch.where(a > 0, a, b))


class _Decoder(nn.Module):
    """Conv1d with BatchNorm1d over (N, C, L), a transposed conv, GroupNorm and InstanceNorm
    per channel, and one conv applied to two branches."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv1d(2, 6, 3, padding=1), nn.Conv1d(2, 6, 1)
        self.bn, self.shared = nn.BatchNorm1d(6), nn.Conv1d(6, 4, 1)
        self.up, self.gn = nn.ConvTranspose1d(4, 5, 2, stride=2), nn.GroupNorm(5, 5)
        self.conv, self.inorm = nn.Conv1d(5, 3, 3), nn.InstanceNorm1d(3, affine=True)
        self.head = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        y = self.shared(F.relu(self.bn(self.a(x)))) + self.shared(self.b(x))
        y = F.silu(self.gn(self.up(y)))
        return self.head(F.relu(self.inorm(self.conv(y))).amax(-1))


@pytest.mark.parametrize(
    ("factory", "shape", "expected"),
    [
        pytest.param(_ChannelsLast, (2, 3, 4, 4), [("conv", 6), ("fc", 8)], id="permuted"),
        pytest.param(
            _Decoder, (4, 2, 6), [("a", 6), ("shared", 4), ("up", 5), ("conv", 3)], id="conv1d"
        ),
        pytest.param(_Selected, (3, 4), [("a", 6)], id="where"),
        pytest.param(
            lambda: nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)),
            (2, 4, 5),
            [("0", 7)],
            id="linear-over-a-sequence",
        ),
    ],
)
def test_more_layers_and_layouts_mask_like_they_remove(
    factory: type[nn.Module], shape: tuple[int, ...], expected: list[tuple[str, int]]
) -> None:
    model, example = factory(), torch.randn(shape)
    groups = traced_groups(model, example)["channel"]
    assert [(group.name, group.size) for group in groups] == expected
    _assert_masking_equals_removing(model, groups, example)


def test_one_module_applied_to_two_branches_joins_what_reaches_it() -> None:
    [a_group, *_] = traced_groups(_Decoder(), torch.randn(4, 2, 6))["channel"]
    assert [s.parameter for s in a_group.slices] == [
        "a.weight", "a.bias", "b.weight", "b.bias", "bn.weight", "bn.bias", "shared.weight",
    ]  # fmt: skip


class _Then(nn.Module):
    """``Linear(4, 6)``, then ``step``, then ``Linear(6, 2)``."""

    def __init__(self, step: object) -> None:
        super().__init__()
        self.first, self.last = nn.Linear(4, 6), nn.Linear(6, 2)
        self.proj = nn.Parameter(torch.randn(6, 6))
        self.norm_free = nn.BatchNorm1d(6, affine=False)
        self.group_norm = nn.GroupNorm(2, 6)
        self.step = step

    def forward(self, x: Tensor) -> Tensor:
        return self.last(self.step(self, self.first(x)))  # type: ignore[operator]


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        pytest.param(
            lambda self, x: torch.cumsum(x, -1),
            "they reach torch.cumsum, which the channel analysis does not follow",
            id="unknown-function",
        ),
        pytest.param(
            lambda self, x: x @ self.proj,
            "they reach operator.matmul, which the channel analysis does not follow",
            id="matmul-with-a-parameter",
        ),
        pytest.param(
            lambda self, x: x - x.mean(-1, keepdim=True),
            "they reach Tensor.mean, which reduces over them",
            id="mean-over-channels",
        ),
        pytest.param(
            lambda self, x: 1 / (x.abs() + 1),
            "they reach operator.truediv, which divides by them (a removed channel divides by "
            "zero)",
            id="division-by-a-channel",
        ),
        pytest.param(
            lambda self, x: F.softmax(x, dim=-1),
            "they reach torch.nn.functional.softmax, which normalises across them",
            id="softmax-over-channels",
        ),
        pytest.param(
            lambda self, x: x * x.shape[-1],
            "they reach operator.mul, which uses their number as a value",
            id="channel-count-as-a-number",
        ),
        pytest.param(
            lambda self, x: x.view(-1, 6),
            "they reach Tensor.view, which fixes their number in the code (6)",
            id="size-written-in-a-view",
        ),
        pytest.param(
            lambda self, x: x.view(x.size(0), 2, 3).flatten(1),
            "they reach Tensor.view, which splits them or merges them with the dimensions "
            "before them",
            id="view-splitting-channels",
        ),
        pytest.param(
            lambda self, x: x * self.first.weight.norm(),
            "'first.weight' is used directly in the forward",
            id="weight-read-in-the-forward",
        ),
        pytest.param(
            lambda self, x: self.norm_free(x),
            "they reach module 'norm_free' (BatchNorm1d), which has no affine parameters, so "
            "the channels cannot be recorded for removal",
            id="batchnorm-without-affine",
        ),
        pytest.param(
            lambda self, x: self.group_norm(x),
            "they reach module 'group_norm' (GroupNorm), which normalises across groups of them",
            id="groupnorm-across-channels",
        ),
    ],
)
def test_what_the_analysis_cannot_follow_leaves_the_channels_out_with_the_reason(
    step: object, reason: str
) -> None:
    trace = trace_channels(_Then(step), torch.randn(3, 4))
    assert trace.groups == []
    assert trace.unprunable == {"first": reason, "last": "they reach the model's output"}


def test_a_linear_subclass_with_its_own_forward_is_traced_through_and_not_followed() -> None:
    class Scaled(nn.Linear):
        def forward(self, x: Tensor) -> Tensor:
            return F.linear(x, self.weight * 2, self.bias)

    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), Scaled(6, 5), nn.ReLU(), nn.Linear(5, 2))
    trace = trace_channels(model, torch.randn(3, 4))
    assert trace.groups == []
    assert trace.unprunable == {
        "0": "they reach torch._C._nn.linear, which the channel analysis does not follow",
        "4": "they reach the model's output",
    }


def test_a_model_under_pruning_has_the_same_groups() -> None:
    model, example = _ConvNet(), torch.randn(2, 3, 8, 8)
    before = traced_groups(model, example)
    l1_unstructured(model.conv1, "weight", amount=0.3)
    l1_unstructured(model.fc1, "bias", amount=0.5)
    assert traced_groups(model, example) == before


def test_the_analysis_changes_nothing_even_in_training_mode() -> None:
    model = _ResNet().train()
    before = copy.deepcopy(model.state_dict())
    traced_groups(model, torch.randn(1, 3, 6, 6))
    assert model.training
    after = model.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)


def test_example_inputs_are_a_tensor_or_a_tuple_and_must_fit_the_model() -> None:
    with pytest.raises(
        TypeError, match=r"^Expected `example_inputs` to be a tensor or a tuple .*got list\.$"
    ):
        traced_groups(_mlp(), [torch.randn(2, 8)])  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=r"^Expected `example_inputs` to run through the model's traced forward .* but "
        r"submodule '0' failed: RuntimeError: ",
    ):
        traced_groups(_mlp(), (torch.randn(2, 7),))


def test_shrink_finds_a_plain_models_channels_by_tracing_it() -> None:
    model, example = _ResNet().double(), torch.randn(2, 3, 6, 6).double()
    groups = traced_groups(model, example)["channel"]
    keeps = _random_keep(groups, seed=4)
    mask_units(model, list(zip(groups, keeps, strict=True)), "reparametrize")
    masked = copy.deepcopy(model)
    report = shrink(model, example_inputs=example)
    assert [(g.name, g.before, g.after) for g in report.groups] == [
        (group.name, group.size, int(keep.sum())) for group, keep in zip(groups, keeps, strict=True)
    ]
    assert model.block2.down[0].out_channels == model.head.in_features == int(keeps[-1].sum())
    for training in (True, False):
        torch.testing.assert_close(
            _outputs(model, example, training), _outputs(masked, example, training)
        )
