"""The lean mode: ``Pruner(..., masking="inplace")`` against the reparametrization, exactly."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.masking import optimizer_hooks
from tensorplay.ao.pruning.masking.permanent import permanent_state_dict
from tensorplay.ao.pruning.masking.restore import restore_pruning
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule, LinearSchedule, OneShotSchedule
from tensorplay.ao.pruning.saving.sparse_export import load_sparse, save_sparse
from tensorplay.report import state_dict_report
from tests.core.gloo import spawn_gloo
from tests.model_state import unchanged

TARGETS = ["0.weight", "2.weight", "4.weight"]
SCHEDULE = CubicSchedule(0.8, end_step=12, frequency=3)


def make_mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


def batch(step: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randn(16, 6, generator=generator), torch.randn(16, 3, generator=generator)


def loss_of(model: nn.Module, step: int) -> Tensor:
    inputs, target = batch(step)
    return nn.functional.mse_loss(model(inputs), target)


def masks_of(model: nn.Module, targets: Iterable[str] = TARGETS) -> list[Tensor]:
    """Every target's mask as bool (lean or reparametrized)."""
    return [model.get_buffer(name + "_mask").bool() for name in targets]


def effective(model: nn.Module, targets: Iterable[str] = TARGETS) -> list[Tensor]:
    """What each target computes with: the lean weight, or mask * orig."""
    out = []
    for name in targets:
        module, _, local = name.rpartition(".")
        holder = model.get_submodule(module)
        if hasattr(holder, local + "_orig"):  # mask * orig: `local` is stale after a step
            orig, mask = getattr(holder, local + "_orig"), getattr(holder, local + "_mask")
            out.append((orig * mask).detach())
        else:
            out.append(getattr(holder, local).detach().clone())
    return out


def pruned_are_zero(model: nn.Module, targets: Iterable[str] = TARGETS) -> bool:
    return all(
        bool((model.get_parameter(n)[~model.get_buffer(n + "_mask")] == 0).all()) for n in targets
    )


class NoisySGD(torch.optim.Optimizer):
    """An optimizer outside the proven list: it moves every weight, pruned ones too."""

    def __init__(self, params: Iterable[Tensor], lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"]).add_(torch.randn_like(p), alpha=1e-3)


# -- the same masks as the reparametrization -------------------------------------------------


def _tied_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3))
    model[2].weight = model[0].weight
    return model


def _tied_equal_model() -> nn.Module:
    model = make_mlp()
    with torch.no_grad():
        for layer in (model[0], model[2], model[4]):
            layer.weight.copy_(torch.randint(-2, 3, layer.weight.shape).float() / 4)
    return model


@pytest.mark.parametrize(
    ("make", "kwargs"),
    [
        pytest.param(make_mlp, {}, id="l1-global"),
        pytest.param(make_mlp, {"scope": "layerwise"}, id="l1-layerwise"),
        pytest.param(make_mlp, {"min_density": 0.3}, id="l1-min-density"),
        pytest.param(_tied_equal_model, {}, id="l1-ties"),
        pytest.param(_tied_equal_model, {"min_density": 0.25}, id="ties-min-density"),
        pytest.param(make_mlp, {"method": "random_unstructured", "seed": 4}, id="random-seeded"),
        pytest.param(
            make_mlp,
            {"method": "random_unstructured", "scope": "layerwise", "seed": 1},
            id="random-layerwise",
        ),
    ],
)
def test_masks_equal_the_reparametrization(
    make: Callable[[], nn.Module], kwargs: dict[str, Any]
) -> None:
    lean_model, reparam_model = make(), make()
    lean = Pruner(lean_model, SCHEDULE, masking="inplace", **kwargs)
    reparam = Pruner(reparam_model, SCHEDULE, **kwargs)
    lean.reparametrize()
    reparam.reparametrize()
    for step in range(14):
        for model in (lean_model, reparam_model):
            loss_of(model, step).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.05 * p.grad)
                    p.grad = None
        assert lean.step() == reparam.step()
        lean.apply_masks()  # the loop above is a hand-made optimizer: keep the invariant
        for got, expected in zip(masks_of(lean_model), masks_of(reparam_model), strict=True):
            assert got.dtype == torch.bool and torch.equal(got, expected)
        assert pruned_are_zero(lean_model)
    assert lean.pruned_count() == reparam.pruned_count() > 0
    assert str(lean.report()) == str(reparam.report())
    assert lean.sparsity() == reparam.sparsity()


def test_tied_weights_share_one_mask() -> None:
    lean_model, reparam_model = _tied_model(), _tied_model()
    lean = Pruner(lean_model, OneShotSchedule(0.5), masking="inplace")
    reparam = Pruner(reparam_model, OneShotSchedule(0.5))
    assert lean.step() == reparam.step() > 0
    assert lean_model[0].weight_mask is lean_model[2].weight_mask
    assert lean_model[0].weight is lean_model[2].weight
    targets = ["0.weight", "4.weight"]
    lean_masks, reparam_masks = masks_of(lean_model, targets), masks_of(reparam_model, targets)
    for got, expected in zip(lean_masks, reparam_masks, strict=True):
        assert torch.equal(got, expected)
    lean.make_permanent()
    assert lean_model[0].weight is lean_model[2].weight
    assert "0.weight_mask" not in lean_model.state_dict()


def test_own_count_method_and_custom_method_match() -> None:
    class KeepEven(BasePruningMethod):
        PRUNING_TYPE = "unstructured"

        def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
            mask = default_mask.clone()
            mask.view(-1)[1::2] = 0
            return mask

    class Lowest(BasePruningMethod):  # a custom unstructured method with an amount
        PRUNING_TYPE = "unstructured"

        def __init__(self, amount: int) -> None:
            self.amount = amount

        def compute_mask(self, t: Tensor, default_mask: Tensor) -> Tensor:
            mask = default_mask.clone()
            mask.view(-1)[torch.argsort(t.abs().view(-1))[: self.amount]] = 0
            return mask

    for method in (KeepEven, Lowest):
        lean_model, reparam_model = make_mlp(), make_mlp()
        lean = Pruner(lean_model, OneShotSchedule(0.5), method=method, masking="inplace")
        reparam = Pruner(reparam_model, OneShotSchedule(0.5), method=method)
        assert lean.step() == reparam.step() > 0
        for got, expected in zip(masks_of(lean_model), masks_of(reparam_model), strict=True):
            assert torch.equal(got, expected)
        assert pruned_are_zero(lean_model)


# -- exact zeros through optimizers ----------------------------------------------------------


OPTIMIZERS: list[Any] = [
    pytest.param(
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
        True,
        id="sgd-nesterov-wd",
    ),
    pytest.param(
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.1),
        True,
        id="sgd-dampening",
    ),
    pytest.param(lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01), True, id="adam-l2"),
    pytest.param(
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, amsgrad=True),
        True,
        id="adamw-wd-amsgrad",
    ),
    pytest.param(lambda ps: NoisySGD(ps, lr=0.05), False, id="noisy-custom"),
    pytest.param(lambda ps: torch.optim.Adagrad(ps, lr=0.05), False, id="adagrad-not-proven"),
]


@pytest.mark.parametrize(("make_optimizer", "proven"), OPTIMIZERS)
def test_pruned_weights_stay_exactly_zero(
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    proven: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = make_mlp()
    pruner = Pruner(model, LinearSchedule(0.7, end_step=20, frequency=5), masking="inplace")
    pruner.reparametrize()
    optimizer = make_optimizer(model.parameters())
    pruner.attach(optimizer)
    passes = []
    original = optimizer_hooks.apply_masks
    monkeypatch.setattr(
        optimizer_hooks, "apply_masks", lambda *a: (passes.append(1), original(*a))[1]
    )
    for step in range(40):
        optimizer.zero_grad()
        loss_of(model, step).backward()
        optimizer.step()
        pruner.step()
        assert pruned_are_zero(model), step
    assert pruner.sparsity() == pytest.approx(0.7, abs=0.01)
    assert optimizer_hooks.keeps_zeros(optimizer) is proven
    # Proven optimizers need no weight pass after their steps; the others one per step.
    assert len(passes) == (0 if proven else 40)


def test_gradient_accumulation_and_mask_gradients_before_clipping() -> None:
    model = make_mlp()
    pruner = Pruner(model, LinearSchedule(0.6, end_step=12, frequency=4), masking="inplace")
    pruner.reparametrize()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    pruner.attach(optimizer, mask_gradients=False)
    for step in range(24):
        for micro in range(3):
            loss_of(model, 3 * step + micro).backward()
        pruner.mask_gradients()
        for name in TARGETS:
            grad = model.get_parameter(name).grad
            mask = model.get_buffer(name + "_mask")
            assert grad is not None and bool((grad[~mask] == 0).all())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad()
        pruner.step()
        assert pruned_are_zero(model)
    assert pruner.pruned_count() > 0


def test_a_step_on_unmasked_gradients_is_repaired() -> None:
    model = make_mlp()
    pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pruner.attach(optimizer, mask_gradients=False)
    pruner.step()
    for step in range(5):  # the loop forgets mask_gradients(): the post-step hook repairs it
        optimizer.zero_grad()
        loss_of(model, step).backward()
        optimizer.step()
        assert pruned_are_zero(model)
        for name in TARGETS:
            buf = optimizer.state[model.get_parameter(name)]["momentum_buffer"]
            assert bool((buf[~model.get_buffer(name + "_mask")] == 0).all())


@pytest.mark.parametrize(
    "make_optimizer",
    [
        pytest.param(
            lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
            id="sgd-nesterov-wd",
        ),
        pytest.param(
            lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1, amsgrad=True),
            id="adamw",
        ),
    ],
)
def test_training_equals_the_reparametrization_bit_for_bit(
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
) -> None:
    """Same data, same steps: the weights computed with are equal bit for bit (``-0.0`` and
    ``+0.0`` aside, which ``torch.equal`` treats as equal)."""
    lean_model, reparam_model = make_mlp(), make_mlp()
    lean = Pruner(lean_model, SCHEDULE, masking="inplace", rewind="init")
    reparam = Pruner(reparam_model, SCHEDULE, rewind="init")
    lean_opt, reparam_opt = (
        make_optimizer(lean_model.parameters()),
        make_optimizer(reparam_model.parameters()),
    )
    lean.attach(lean_opt)
    lean.reparametrize()
    for step in range(20):
        for model, optimizer in ((lean_model, lean_opt), (reparam_model, reparam_opt)):
            optimizer.zero_grad()
            loss_of(model, step).backward()
            optimizer.step()
        assert lean.step() == reparam.step()
        for got, expected in zip(effective(lean_model), effective(reparam_model), strict=True):
            assert torch.equal(got, expected)
        for name in ("0.bias", "2.bias", "4.bias"):
            assert torch.equal(lean_model.get_parameter(name), reparam_model.get_parameter(name))
    assert lean.pruned_count() == reparam.pruned_count() > 0


# -- resume, checkpoints, export --------------------------------------------------------------


def _train(
    model: nn.Module, pruner: Pruner, optimizer: torch.optim.Optimizer, steps: range
) -> None:
    for step in steps:
        optimizer.zero_grad()
        loss_of(model, step).backward()
        optimizer.step()
        pruner.step()


def _round_trip(obj: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("stop_after", [6, 8], ids=["after-pruning-step", "between"])
def test_resume_mid_schedule_is_bit_for_bit(stop_after: int) -> None:
    def sgd(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)

    model = make_mlp()
    pruner = Pruner(model, SCHEDULE, masking="inplace", rewind="step", rewind_step=2)
    optimizer = sgd(model)
    pruner.attach(optimizer)
    _train(model, pruner, optimizer, range(16))

    first = make_mlp()
    first_pruner = Pruner(first, SCHEDULE, masking="inplace", rewind="step", rewind_step=2)
    first_opt = sgd(first)
    first_pruner.attach(first_opt)
    _train(first, first_pruner, first_opt, range(stop_after + 1))
    saved = _round_trip(
        {
            "model": first.state_dict(),
            "pruner": first_pruner.state_dict(),
            "optimizer": first_opt.state_dict(),
        }
    )

    resumed = make_mlp(seed=7)
    assert restore_pruning(resumed, saved["model"]) == TARGETS
    resumed.load_state_dict(saved["model"], strict=True)
    resumed_pruner = Pruner(resumed, SCHEDULE, masking="inplace", rewind="step", rewind_step=2)
    assert resumed_pruner.state_dict() != saved["pruner"]
    resumed_pruner.load_state_dict(saved["pruner"])
    resumed_opt = sgd(resumed)
    resumed_opt.load_state_dict(saved["optimizer"])
    resumed_pruner.attach(resumed_opt)
    _train(resumed, resumed_pruner, resumed_opt, range(stop_after + 1, 16))

    assert list(resumed.state_dict()) == list(model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key
    assert resumed_pruner.state_dict().keys() == pruner.state_dict().keys()
    assert resumed_pruner.history == pruner.history
    for param, other in zip(model.parameters(), resumed.parameters(), strict=True):
        state, other_state = optimizer.state[param], resumed_opt.state[other]
        assert torch.equal(state["momentum_buffer"], other_state["momentum_buffer"])


def test_reparametrize_installs_all_true_masks_and_keys_stay() -> None:
    model = make_mlp()
    pruner = Pruner(model, OneShotSchedule(0.5, step=3), masking="inplace")
    pruner.reparametrize()
    keys = list(model.state_dict())
    assert [k for k in keys if k.endswith("_mask")] == [n + "_mask" for n in TARGETS]
    assert all(bool(m.all()) and m.dtype == torch.bool for m in masks_of(model))
    masks = masks_of(model)
    for _ in range(5):
        pruner.step()
    assert list(model.state_dict()) == keys
    assert pruner.pruned_count() == 68  # half of 48 + 64 + 24
    assert masks_of(model)[0].data_ptr() == masks[0].data_ptr()  # cleared in place


def test_make_permanent_drops_masks_and_hooks() -> None:
    model = make_mlp()
    pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = pruner.attach(optimizer)
    pruner.step()
    counts = (pruner.pruned_count(), str(pruner.report()))
    pruner.make_permanent()
    assert list(model.state_dict()) == list(make_mlp().state_dict())
    assert not any(h.active for h in handle.hooks)
    assert (pruner.pruned_count(), str(pruner.report())) == counts
    for name in TARGETS:
        weight = model.get_parameter(name)
        assert not bool(torch.signbit(weight[weight == 0]).any())  # +0.0 only
    check = unchanged(model, optimizer)
    with pytest.raises(RuntimeError, match=r"make_permanent\(\) was called"):
        pruner.attach(optimizer)
    check()


def test_permanent_state_dict_save_sparse_and_report(tmp_path: Path) -> None:
    model = make_mlp()
    pruner = Pruner(model, OneShotSchedule(0.6), masking="inplace")
    pruner.step()
    state = permanent_state_dict(model)
    assert list(state) == list(make_mlp().state_dict())
    fresh = make_mlp(seed=3)
    fresh.load_state_dict(state, strict=True)
    inputs = torch.randn(4, 6)
    assert torch.equal(fresh(inputs), model(inputs))
    assert "0.weight_mask" in model.state_dict()  # the model is untouched
    path = save_sparse(model, tmp_path / "lean.safetensors")
    loaded = load_sparse(path)
    assert list(loaded) == list(state)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
    # The state_dict mapping too, and the report reads the bool masks.
    assert list(load_sparse(save_sparse(model.state_dict(), tmp_path / "b.safetensors"))) == list(
        state
    )
    report = state_dict_report(model.state_dict())
    assert [row.name for row in report.rows] == TARGETS
    assert (report.pruned, report.total) == (pruner.pruned_count(), pruner.total_count())


# -- bad input leaves the model unchanged -----------------------------------------------------


def test_bad_masking_value_leaves_the_model_unchanged() -> None:
    model = make_mlp()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"Expected `masking` to be one of .*'lean'"):
        Pruner(model, SCHEDULE, masking="lean")  # type: ignore[arg-type]
    check()


def test_bad_attach_calls() -> None:
    model = make_mlp()
    pruner = Pruner(model, OneShotSchedule(0.5), masking="inplace")
    pruner.step()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    check = unchanged(model, optimizer, other)
    with pytest.raises(TypeError, match=r"torch\.optim\.Optimizer, but got Linear at position 1"):
        pruner.attach(optimizer, nn.Linear(2, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"SGD at position 1 holds none of \['0.weight'"):
        pruner.attach(optimizer, other)
    with pytest.raises(ValueError, match="at least one optimizer"):
        pruner.attach()
    with pytest.raises(TypeError, match="`mask_gradients` to be a bool, but got 1"):
        pruner.attach(optimizer, mask_gradients=1)  # type: ignore[arg-type]
    check()
    assert not optimizer._optimizer_step_pre_hooks and not other._optimizer_step_pre_hooks
    pruner.attach(optimizer)
    check = unchanged(model, optimizer)
    with pytest.raises(ValueError, match="SGD at position 0 is attached already"):
        pruner.attach(optimizer)
    assert len(optimizer._optimizer_step_pre_hooks) == 1
    reparam = Pruner(make_mlp(), OneShotSchedule(0.5))
    check_reparam = unchanged(reparam.model)
    with pytest.raises(ValueError, match="masking='inplace' to attach optimizers to"):
        reparam.attach(optimizer)
    check()
    check_reparam()


def test_mixing_the_two_modes_names_the_tensor() -> None:
    model = make_mlp()
    Pruner(model, OneShotSchedule(0.5)).step()
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"\(Linear, 'weight'\) \('0.weight'\) not to be pruned"):
        Pruner(model, OneShotSchedule(0.5), masking="inplace")
    check()
    lean_model = make_mlp()
    Pruner(lean_model, OneShotSchedule(0.5), masking="inplace").step()
    check = unchanged(lean_model)
    with pytest.raises(ValueError, match=r"\('0.weight'\) not to carry a lean bool mask"):
        Pruner(lean_model, OneShotSchedule(0.5))
    check()


def test_nan_scores_leave_the_lean_model_unchanged() -> None:
    model = make_mlp()
    pruner = Pruner(model, LinearSchedule(0.6, end_step=2, frequency=1), masking="inplace")
    pruner.step()
    pruner.step()
    with torch.no_grad():
        model[2].weight.view(-1)[model[2].weight_mask.view(-1).nonzero()[0]] = float("nan")
    check = unchanged(model)
    with pytest.raises(ValueError, match=r"\(Linear, 'weight'\).*nan"):
        pruner.step()
    check()


def test_nan_scores_refuse_a_lean_step_that_prunes_every_unit_left() -> None:
    """4 units: 2 pruned at step 1 (0.45 of 4, rounded), then 0.9 of 4 rounds to all 4: the
    step clears every unit left, with no cut to find. A NaN among them refuses it, the bool
    mask and the weights as they were."""
    torch.manual_seed(0)
    layer = nn.Linear(4, 1, bias=False)
    pruner = Pruner(layer, LinearSchedule(0.9, end_step=2, frequency=1), masking="inplace")
    pruner.step(0)
    assert pruner.step(1) == 2
    kept = layer.weight_mask.view(-1).nonzero().view(-1)
    with torch.no_grad():
        layer.weight.view(-1)[kept[1]] = float("nan")
    check = unchanged(layer)
    with pytest.raises(ValueError, match=rf"\(Linear, 'weight'\) has nan at flat index {kept[1]}"):
        pruner.step(2)
    check()
    assert pruner.history == [(1, 0.45, 2)]


def test_restore_pruning_lean_checks_before_changing() -> None:
    model = make_mlp()
    Pruner(model, OneShotSchedule(0.5), masking="inplace").step()
    state = model.state_dict()
    bad = dict(state)
    bad["2.weight_mask"] = torch.ones(3, 3, dtype=torch.bool)
    fresh = make_mlp()
    check = unchanged(fresh)
    with pytest.raises(ValueError, match=r"Expected '2.weight_mask' to have the shape"):
        restore_pruning(fresh, bad)
    check()
    reparam = make_mlp()
    Pruner(reparam, OneShotSchedule(0.5)).step()
    check = unchanged(reparam)
    with pytest.raises(ValueError, match=r"saved with a lean bool mask, not to be pruned"):
        restore_pruning(reparam, state)
    check()


# -- DDP: replicated lean masks ---------------------------------------------------------------


def _ddp_worker(rank: int, out: Path) -> None:
    model = make_mlp()
    pruner = Pruner(model, SCHEDULE, masking="inplace", method="random_unstructured", seed=3)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    pruner.attach(optimizer)
    for step in range(14):
        optimizer.zero_grad()
        inputs, target = batch(2 * step + rank)  # each rank its own data
        nn.functional.mse_loss(ddp(inputs), target).backward()
        optimizer.step()
        pruner.step()
    torch.save(
        {"state": model.state_dict(), "zero": pruned_are_zero(model)}, out / f"rank{rank}.pt"
    )


@pytest.mark.distributed
def test_ddp_two_processes_identical_lean_masks(tmp_path: Path) -> None:
    spawn_gloo(_ddp_worker, 2, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert ranks[0]["zero"] and ranks[1]["zero"]
    first, second = ranks[0]["state"], ranks[1]["state"]
    assert list(first) == list(second)
    for key in first:
        assert torch.equal(first[key], second[key]), key
    masks = [first[name + "_mask"] for name in TARGETS]
    pruned = sum(int((~m).sum()) for m in masks)
    assert pruned == round(0.8 * sum(m.numel() for m in masks))
