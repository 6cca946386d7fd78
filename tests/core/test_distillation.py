"""Distillation: the KD term against its formula, gradients against autograd by hand, the teacher.

The oracle of the term is the formula written out with ``exp`` and sums in float64 on hand-made
logits; the oracle of a distilled training step is the same loop with the KD term computed by
hand against a deep copy of the student taken at the same moment.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

from tensorplay.ao.pruning import (
    Distillation,
    OneShotSchedule,
    Pruner,
    dense_copy,
    kd_loss,
    l1_unstructured,
    permanent_state_dict,
)
from tests.hf_models import VOCAB, tiny_gpt2
from tests.model_state import unchanged

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def by_hand(student: Tensor, teacher: Tensor, temperature: float, weight: float) -> Tensor:
    """``w T^2 mean_n sum_c p_t (log p_t - log p_s)`` written out, in float64."""
    s, t = student.double() / temperature, teacher.double() / temperature
    log_p_s = s - s.exp().sum(-1, keepdim=True).log()
    log_p_t = t - t.exp().sum(-1, keepdim=True).log()
    per_position = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)
    return weight * temperature**2 * per_position.mean()


def gpt2(seed: int = 0) -> nn.Module:
    """The tiny GPT-2 without dropout: a training forward is then a function of its inputs."""
    model = tiny_gpt2(seed)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 5))


@dataclass
class Output:
    """A Hugging Face-like output: ``loss`` and ``logits`` as attributes."""

    logits: Tensor
    loss: Tensor | None = None


class Fixed(nn.Module):
    """Returns given logits (times a trainable scale of 1, so they have a gradient)."""

    def __init__(self, logits: Tensor, wrap: bool) -> None:
        super().__init__()
        self.logits = logits
        self.wrap = wrap
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: Tensor) -> Any:
        logits = self.logits * self.scale
        return Output(logits) if self.wrap else logits


# -- the term against its formula ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7, 5), (3, 4, 11)], ids=["2d", "3d"])
@pytest.mark.parametrize(("temperature", "weight"), [(1.0, 1.0), (2.0, 0.3), (4.5, 2.0)])
def test_kd_loss_is_the_formula(shape, temperature, weight):
    generator = torch.Generator().manual_seed(1)
    student = 3 * torch.randn(shape, generator=generator)
    teacher = 3 * torch.randn(shape, generator=generator)
    got = kd_loss(student, teacher, temperature=temperature, weight=weight)
    expected = by_hand(student, teacher, temperature, weight)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-7)
    assert float(kd_loss(teacher, teacher, temperature=temperature)) == pytest.approx(0, abs=1e-6)


def test_kd_loss_of_half_precision_logits_is_computed_in_float32():
    student, teacher = torch.randn(4, 9), torch.randn(4, 9)
    got = kd_loss(student.bfloat16(), teacher.bfloat16())
    assert got.dtype == torch.float32
    expected = by_hand(student.bfloat16().float(), teacher.bfloat16().float(), 2.0, 1.0)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("wrap", [False, True], ids=["tensor", "hf-output"])
@pytest.mark.parametrize("shape", [(7, 5), (3, 4, 11)], ids=["2d", "3d"])
def test_loss_of_a_training_forward_is_the_formula(wrap, shape):
    generator = torch.Generator().manual_seed(2)
    student_logits = torch.randn(shape, generator=generator)
    teacher_logits = torch.randn(shape, generator=generator)
    student = Fixed(student_logits, wrap)
    teacher = Fixed(teacher_logits, wrap)
    distill = Distillation(teacher, temperature=3.0, weight=0.7).attach(student.train())
    student(torch.zeros(1))
    loss = distill.loss()
    torch.testing.assert_close(
        loss.double(), by_hand(student_logits, teacher_logits, 3.0, 0.7), rtol=1e-5, atol=1e-7
    )
    loss.backward()  # differentiable in the student's logits, not in the teacher's
    assert student.scale.grad is not None and teacher.scale.grad is None
    assert float(distill.last_loss) == pytest.approx(float(loss.detach()))


def test_loss_of_a_hugging_face_model_is_the_formula_on_every_position():
    student, teacher = tiny_gpt2(seed=0).train(), tiny_gpt2(seed=1)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    distill = Distillation(teacher, temperature=2.0).attach(student)
    logits = student(input_ids=ids, labels=ids).logits  # keyword arguments, as a Trainer calls
    loss = distill.loss()
    with torch.no_grad():
        expected = by_hand(logits, teacher(input_ids=ids).logits, 2.0, 1.0)
    assert logits.shape == (2, 9, VOCAB)  # all B x T positions, none shifted away
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-7)


def test_padding_mask_leaves_padded_positions_out_of_the_mean():
    student, teacher = tiny_gpt2(seed=0).train(), tiny_gpt2(seed=1)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    attention = torch.ones(2, 9, dtype=torch.long)
    attention[1, 5:] = 0  # the second sequence is 5 tokens long
    distill = Distillation(teacher, padding_mask="attention_mask").attach(student)
    logits = student(input_ids=ids, attention_mask=attention).logits
    loss = distill.loss()
    with torch.no_grad():
        teacher_logits = teacher(input_ids=ids, attention_mask=attention).logits
    kept = attention.bool()
    logits = logits.detach()
    expected = by_hand(logits[kept], teacher_logits[kept], 2.0, 1.0)  # the 14 real positions
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-7)
    everything = by_hand(logits, teacher_logits, 2.0, 1.0)
    assert abs(float(everything - expected)) > 1e-3 * float(expected)  # the mask mattered


def test_padding_mask_must_be_passed_and_shaped_like_the_positions():
    student = tiny_gpt2().train()
    Distillation(padding_mask="attention_mask").attach(student)
    ids = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"keyword argument 'attention_mask'.*got NoneType"):
        student(input_ids=ids)
    with pytest.raises(ValueError, match=r"shape \(2, 4\).*but got \(2, 3\)"):
        student(input_ids=ids, attention_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"shape \(2, 4\).*but got \(3,\)"):
        kd_loss(torch.zeros(2, 4, 5), torch.zeros(2, 4, 5), mask=torch.ones(3))


# -- a distilled step against autograd by hand ----------------------------------------------------


def _mlp_batches() -> list[tuple[tuple[Tensor], dict[str, Any], Tensor]]:
    generator = torch.Generator().manual_seed(3)
    batches = []
    for _ in range(4):
        x = torch.randn(8, 6, generator=generator)
        batches.append(((x,), {}, torch.randint(0, 5, (8,), generator=generator)))
    return batches


def _gpt_batches() -> list[tuple[tuple[()], dict[str, Any], Tensor]]:
    generator = torch.Generator().manual_seed(3)
    batches = []
    for _ in range(4):
        ids = torch.randint(0, VOCAB, (2, 8), generator=generator)
        batches.append(((), {"input_ids": ids}, ids))
    return batches


def _task(output: Any, target: Tensor) -> Tensor:
    logits = output if isinstance(output, Tensor) else output.logits
    if logits.dim() == 3:  # next-token prediction
        logits, target = logits[:, :-1].flatten(0, 1), target[:, 1:].flatten()
    return nn.functional.cross_entropy(logits, target)


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], list[Any]]]] = {
    "mlp": (mlp, _mlp_batches),
    "gpt2": (gpt2, _gpt_batches),
}


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_distilled_steps_with_accumulation_equal_autograd_of_task_plus_kd(model, masking):
    """Two optimizer steps of two micro-batches each, pruned after attaching (the teacher is the
    dense model): gradients and weights equal the loop that writes the KD term by hand."""
    make, batches = MODELS[model]
    temperature, weight, accumulate = 2.0, 0.5, 2
    ours, reference = make().train(), make().train()
    distill = Distillation(temperature=temperature, weight=weight).attach(ours)
    hand_teacher = copy.deepcopy(reference).eval().requires_grad_(False)
    models = (ours, reference)
    pruners = [Pruner(m, OneShotSchedule(0.5), masking=masking) for m in models]
    # SGD: linear in the gradients (Adam would blow up the rounding of a zero gradient)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    for pruner, optimizer in zip(pruners, optimizers, strict=True):
        if pruner.mode.hooks_optimizers:
            pruner.attach(optimizer)
        pruner.step(0)
    data = batches()
    for step in range(2):
        for args, kwargs, target in data[step * accumulate : (step + 1) * accumulate]:
            output = ours(*args, **kwargs)
            ((_task(output, target) + distill.loss()) / accumulate).backward()
            output = reference(*args, **kwargs)
            with torch.no_grad():
                teacher_output = hand_teacher(*args, **kwargs)
            student_logits = output if isinstance(output, Tensor) else output.logits
            teacher_logits = teacher_output if model == "mlp" else teacher_output.logits
            kd = by_hand(student_logits, teacher_logits, temperature, weight).float()
            ((_task(output, target) + kd) / accumulate).backward()
        grads = [{n: p.grad for n, p in m.named_parameters()} for m in models]
        assert list(grads[0]) == list(grads[1])
        for name in grads[0]:
            torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    for (name, ours_param), (_, reference_param) in zip(
        ours.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(ours_param, reference_param, rtol=1e-4, atol=1e-6, msg=name)
    assert float(distill.last_loss) > 0  # the student moved away from its teacher


# -- the teacher -----------------------------------------------------------------------------------


def _storages(module: nn.Module) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in module.parameters()}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_teacher_is_frozen_unchanged_by_training_and_shares_no_memory(model):
    make, batches = MODELS[model]
    student = make().train()
    distill = Distillation().attach(student)
    teacher = distill.teacher
    assert teacher is not None and not teacher.training
    before = {name: p.clone() for name, p in teacher.state_dict().items()}
    assert not any(p.requires_grad for p in teacher.parameters())
    assert not _storages(teacher) & _storages(student)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.5)
    for args, kwargs, target in batches():
        (_task(student(*args, **kwargs), target) + distill.loss()).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert distill.teacher is teacher and not teacher.training
    after = teacher.state_dict()
    assert list(after) == list(before)
    for name, value in before.items():
        assert torch.equal(after[name], value), name
    assert all(p.grad is None for p in teacher.parameters())
    assert any(
        not torch.equal(s, t)
        for s, t in zip(student.parameters(), teacher.parameters(), strict=True)
    )  # the student did train


def test_evaluation_forwards_run_no_teacher_and_leave_no_term():
    student = mlp().train()
    distill = Distillation().attach(student)
    calls: list[int] = []
    assert distill.teacher is not None
    distill.teacher.register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(3, 6)
    with torch.no_grad():
        student(x)
    student.eval()
    student(x)
    assert calls == []
    with pytest.raises(RuntimeError, match=r"training forward .* none was seen"):
        distill.loss()
    student.train()
    student(x)
    assert calls == [1] and not distill.consumed
    distill.loss()
    assert distill.consumed


def test_forwards_while_active_is_false_run_no_teacher_and_are_not_counted():
    """An adapter's forward outside its framework's training steps (``active`` false) is left
    out as an evaluation forward is: no teacher runs, the count and the pending term stay."""
    student, inside = mlp().train(), [False]
    distill = Distillation(active=lambda: inside[0]).attach(student)
    calls: list[int] = []
    assert distill.teacher is not None
    distill.teacher.register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(3, 6)
    student(x)
    assert calls == [] and distill.forwards == 0
    inside[0] = True
    student(x)
    assert calls == [1] and distill.forwards == 1
    inside[0] = False
    student(2 * x)  # outside: the term of the forward inside is still the one given
    assert calls == [1] and distill.forwards == 1
    expected = kd_loss(student(x).detach(), distill.teacher(x))
    torch.testing.assert_close(distill.loss().detach(), expected, rtol=0, atol=0)
    distill.detach()


def test_a_call_that_wraps_the_forward_counts_as_the_inner_forward_only():
    """Lightning under DDP calls the module with training_step's inputs (its forward patched to
    run training_step); the forward is the `self(x)` inside it."""
    student = mlp().train()
    distill = Distillation().attach(student)
    x = torch.randn(3, 6)
    inner = student.forward

    def training_step(batch: Tensor, batch_idx: int) -> Tensor:
        student.forward = inner  # type: ignore[method-assign]  # unpatched, as Lightning does
        return student(batch).logsumexp(-1).mean()

    student.forward = training_step  # type: ignore[method-assign, assignment]
    loss = student(x, 0)  # the outer call: its output is a scalar loss, not logits
    assert distill.forwards == 1
    expected = kd_loss(student(x).detach(), distill.teacher(x))  # type: ignore[misc]
    assert distill.forwards == 2
    assert loss.shape == () and torch.allclose(distill.loss().detach(), expected)


def test_detach_leaves_no_hook():
    for student in (mlp(), tiny_gpt2()):
        before = {
            name: [list(getattr(module, hooks)) for hooks in HOOK_DICTS]
            for name, module in student.named_modules()
        }
        distill = Distillation().attach(student)
        assert len(student._forward_hooks) == len(student._forward_pre_hooks) == 1
        distill.detach()
        after = {
            name: [list(getattr(module, hooks)) for hooks in HOOK_DICTS]
            for name, module in student.named_modules()
        }
        assert after == before
        assert all(not hooks for lists in after.values() for hooks in lists)
        assert not student._forward_hooks_with_kwargs
        plain = isinstance(student, nn.Sequential)
        student.train()(torch.zeros(1, 6) if plain else torch.zeros(1, 4, dtype=torch.long))
        assert not distill.attached and distill.student is None


def test_teacher_dtype_bfloat16_halves_the_teacher_and_stays_close():
    student = gpt2().train()
    twin = copy.deepcopy(student)  # one Distillation per student
    full = Distillation().attach(student)
    half = Distillation(teacher_dtype=torch.bfloat16).attach(twin)
    assert half.teacher is not None and full.teacher is not None
    assert {p.dtype for p in half.teacher.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in student.parameters()} == {torch.float32}

    def size(module: nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())

    assert 2 * size(half.teacher) == size(full.teacher)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    student(input_ids=ids), twin(input_ids=ids)
    kd_full, kd_half = full.loss().detach(), half.loss().detach()
    assert float(kd_full) == pytest.approx(0, abs=1e-6)  # the student is its full teacher
    assert 0 < float(kd_half) < 1e-3  # bfloat16 rounding only


def test_teacher_dtype_casts_floating_inputs_of_a_plain_model():
    student = mlp().train()
    distill = Distillation(teacher_dtype=torch.bfloat16).attach(student)
    assert distill.teacher is not None
    assert {p.dtype for p in distill.teacher.parameters()} == {torch.bfloat16}
    seen: list[torch.dtype] = []
    distill.teacher.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    x = 50 * torch.randn(4, 6, generator=torch.Generator().manual_seed(0))  # large logits
    logits = student(x)
    loss = distill.loss().detach()
    assert seen == [torch.bfloat16]  # the student's float32 inputs, cast to the teacher's dtype
    with torch.no_grad():  # the teacher: the student's own weights, computing in bfloat16
        teacher_logits = mlp().to(torch.bfloat16)(x.to(torch.bfloat16))
    expected = by_hand(logits.detach(), teacher_logits, 2.0, 1.0)
    assert float(expected) > 1e-5  # bfloat16 rounding: the teacher is not the student
    # float32 log-softmaxes of near-equal logits: a relative error of about 1e-3
    torch.testing.assert_close(loss.double(), expected, rtol=1e-2, atol=1e-8)


@pytest.mark.parametrize("masking", ["reparametrize", "inplace"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_pruned_student_gives_a_dense_plain_teacher(model, masking):
    make, _ = MODELS[model]
    student = make()
    dense_keys = list(student.state_dict())
    dense_parameters = [name for name, _ in student.named_parameters()]
    Pruner(student, OneShotSchedule(0.6), masking=masking).step(0)
    other = Distillation().attach(student)  # a Distillation's hook is on the student
    teacher = dense_copy(student)  # the teacher a second one would take (one is allowed)
    assert other.teacher is not None
    assert list(teacher.state_dict()) == dense_keys
    assert [name for name, _ in teacher.named_parameters()] == dense_parameters
    for module in teacher.modules():
        assert all(not getattr(module, hooks) for hooks in HOOK_DICTS)
        assert not module._forward_hooks_with_kwargs and "__deepcopy__" not in vars(module)
    if model == "gpt2":
        assert teacher.lm_head.weight is teacher.transformer.wte.weight  # still tied
    x = (torch.randn(3, 6),) if model == "mlp" else (torch.randint(0, VOCAB, (2, 8)),)
    student.eval()
    with torch.no_grad():
        expected, got = student(*x), teacher(*x)
    if model == "gpt2":
        expected, got = expected.logits, got.logits
    assert torch.equal(got, expected)  # the masked weights, as the student computes with them
    permanent = permanent_state_dict(student)
    for name, value in teacher.state_dict().items():
        assert torch.equal(value, permanent[name]), name


def test_a_student_pruned_by_torch_gives_a_plain_teacher():
    student = mlp()
    torch_prune.l1_unstructured(student[0], "weight", amount=0.5)
    teacher = dense_copy(student)
    assert sorted(teacher.state_dict()) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert not teacher[0]._forward_pre_hooks
    assert torch.equal(teacher[0].weight, student[0].weight.detach())


def test_a_given_teacher_is_frozen_and_put_in_eval_mode():
    student, teacher = mlp(0), mlp(1).train()
    distill = Distillation(teacher, teacher_dtype=torch.float64).attach(student)
    assert distill.teacher is teacher and not teacher.training
    assert {(p.requires_grad, p.dtype) for p in teacher.parameters()} == {(False, torch.float64)}


def test_the_teacher_follows_the_student_to_its_device():
    student, teacher = mlp(0), mlp(1)
    Distillation(teacher).attach(student.to("meta"))
    assert {p.device.type for p in teacher.parameters()} == {"meta"}  # moved at attach
    student = mlp(0).train()
    distill = Distillation().attach(student)
    assert distill.teacher is not None
    student.to("meta")
    student(torch.randn(2, 6, device="meta"))  # moved again at the next training forward
    assert {p.device.type for p in distill.teacher.parameters()} == {"meta"}
    assert distill.loss().device.type == "meta"


# -- bad arguments -------------------------------------------------------------------------------


NEGATIVE = "to be a non-negative number, but got"
POSITIVE = "to be a positive number, but got"
BAD_ARGUMENTS = [
    ("negative-weight", {"weight": -1}, ValueError, f"`weight` {NEGATIVE} -1."),
    ("nan-weight", {"weight": float("nan")}, ValueError, "`weight`.*nan"),
    ("str-weight", {"weight": "1"}, TypeError, "`weight`.*'1'"),
    ("bool-weight", {"weight": True}, TypeError, "`weight`.*True"),
    ("zero-temperature", {"temperature": 0}, ValueError, f"`temperature` {POSITIVE} 0."),
    ("negative-temperature", {"temperature": -2.0}, ValueError, "`temperature`.*-2.0"),
    ("inf-temperature", {"temperature": float("inf")}, ValueError, "`temperature`.*inf"),
    ("none-temperature", {"temperature": None}, TypeError, "`temperature`.*None"),
    ("teacher", {"teacher": "gpt2"}, TypeError, "`teacher` to be a torch.nn.Module.*'gpt2'"),
    ("int-dtype", {"teacher_dtype": torch.int8}, TypeError, "`teacher_dtype`.*torch.int8"),
    ("str-dtype", {"teacher_dtype": "bfloat16"}, TypeError, "`teacher_dtype`.*'bfloat16'"),
    ("empty-padding-mask", {"padding_mask": ""}, TypeError, "`padding_mask`.*''"),
    ("active", {"active": True}, TypeError, "`active` to be callable or None, but got True"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_ARGUMENTS],
)
def test_bad_arguments_are_refused_when_constructed(kwargs, error, match):
    teacher = kwargs.pop("teacher", None)
    with pytest.raises(error, match=match):
        Distillation(teacher, **kwargs)


def test_attach_refuses_a_non_module_twice_the_student_itself_or_a_sharing_teacher():
    with pytest.raises(TypeError, match=r"`student` to be a torch.nn.Module, but got 3"):
        Distillation().attach(3)  # type: ignore[arg-type]
    student = mlp().train()
    distill = Distillation().attach(student)
    check = unchanged(student)  # attached once: its two hooks on the student
    with pytest.raises(RuntimeError, match="already attached to a Sequential"):
        distill.attach(student)
    check()
    assert len(student._forward_hooks) == 1
    distill.detach()
    check = unchanged(student)
    with pytest.raises(ValueError, match="other than the student"):
        Distillation(student).attach(student)
    check()  # its training mode and requires_grad too: the student is the teacher given
    assert student.training and all(p.requires_grad for p in student.parameters())
    sharing = mlp()
    sharing[2].weight = student[2].weight
    check_teacher = unchanged(sharing)
    with pytest.raises(ValueError, match=r"its 2.weight is the student's 2.weight"):
        Distillation(sharing).attach(student)
    check()
    check_teacher()
    viewing = mlp()
    viewing.load_state_dict(student.state_dict(), assign=True)  # other Parameters, same memory
    check_teacher = unchanged(viewing)
    with pytest.raises(ValueError, match="share no memory"):
        Distillation(viewing).attach(student)
    check()
    check_teacher()


def test_a_teacher_of_another_shape_is_refused_at_the_first_forward_naming_both():
    student, teacher = nn.Linear(4, 3).train(), nn.Linear(4, 5)
    distill = Distillation(teacher).attach(student)
    expected = r"got \(2, 5\) for the teacher and \(2, 3\) for the student"
    with pytest.raises(ValueError, match=expected):
        student(torch.randn(2, 4))
    with pytest.raises(RuntimeError, match="none was seen"):
        distill.loss()


def test_loss_is_taken_once_per_forward_and_only_when_attached():
    with pytest.raises(RuntimeError, match="not attached"):
        Distillation().loss()
    student = mlp().train()
    distill = Distillation().attach(student)
    student(torch.randn(2, 6))
    distill.loss()
    with pytest.raises(RuntimeError, match="already taken for the student's last forward"):
        distill.loss()


def test_an_output_without_logits_is_refused_naming_its_type():
    class Pair(nn.Module):
        def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
            return x, x

    student = Pair().train()
    Distillation(Pair()).attach(student)
    with pytest.raises(TypeError, match=r"tensor of logits or to have `logits`.*got tuple"):
        student(torch.ones(2, requires_grad=True))


def test_dense_copy_refuses_arguments_by_name():
    with pytest.raises(TypeError, match=r"`model` to be a torch.nn.Module, but got 'x'"):
        dense_copy("x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`dtype`.*torch.int32"):
        dense_copy(nn.Linear(2, 2), torch.int32)


def _sharded_worker(rank: int, out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    fully_shard(model[0], mesh=init_device_mesh("cpu", (1,)))  # the root left unsharded
    with pytest.raises(ValueError, match=r"but Sequential is not one: apply `fully_shard` to its"):
        dense_copy(model)
    hybrid = mlp()  # HSDP: a 2-D mesh, replicated by its first dimension
    fully_shard(hybrid, mesh=init_device_mesh("cpu", (1, 1), mesh_dim_names=("r", "s")))
    with pytest.raises(ValueError, match=r"0.weight is sharded on a mesh of 2 dimensions"):
        dense_copy(hybrid)
    (out / f"rank{rank}").write_text("ok")


@pytest.mark.slow
@pytest.mark.distributed
def test_dense_copy_refuses_a_model_sharded_without_its_root_or_on_two_dimensions(tmp_path):
    from tests.core.gloo import spawn_gloo

    spawn_gloo(_sharded_worker, 1, tmp_path)
    assert (tmp_path / "rank0").read_text() == "ok"


def test_l1_unstructured_student_copy_keeps_the_dense_key_order():
    layer = l1_unstructured(nn.Linear(3, 2), "weight", amount=2)
    assert list(dense_copy(layer).state_dict()) == ["weight", "bias"]


def test_a_refused_teacher_detaches_itself_and_calls_on_error():
    student = mlp().train()
    errors: list[bool] = []
    other_classes = nn.Linear(6, 4)  # the student gives 5 logits
    distill = Distillation(other_classes, on_error=lambda: errors.append(distill.attached))
    check = unchanged(student)
    distill.attach(student)
    with pytest.raises(ValueError, match="teacher's logits to have the student's shape"):
        student(torch.randn(3, 6))
    assert errors == [False]  # called once, detached by then
    check()  # no hook, no attribute: the student as it was before attach
    student(torch.randn(3, 6))  # a later forward runs no teacher
    with pytest.raises(TypeError, match="`on_error` to be callable or None, but got 3"):
        Distillation(on_error=3)  # type: ignore[arg-type]
