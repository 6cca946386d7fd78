"""The calibration driver of reconstruction: each consumer re-solved in the order it computes.

After a one-shot step has chosen and masked the units, :func:`reconstruct` re-fits every
consumer of pruned units (:mod:`~tensorplay.ao.pruning.structured.reconstruction.consumers`) by
:func:`~tensorplay.ao.pruning.structured.reconstruction.ridge.ridge_solve`, one consumer at a time,
in the order the forward first calls them (block by block in a transformer). For each consumer and
calibration batch:

* the **dense reference** (a frozen copy of the model taken before pruning,
  :func:`~tensorplay.ao.pruning.distillation.dense_copy.dense_copy`) runs up to the consumer, whose
  input is ``X_d``; the forward stops there;
* the **pruned model** runs up to the consumer, whose kept inputs are ``X_k``: everything before
  it is already pruned *and reconstructed*, so each layer also corrects the error of the layers
  before it;
* ``G += X_k^T X_k`` and ``C += X_k^T X_d`` over the batch's tokens, in float32 on the
  consumer's device; a token the batch's ``attention_mask`` marks as padding (a batch that is a
  mapping holding one, as a Hugging Face tokenizer gives) never enters them. In a process
  group (DDP), the sums are all-reduced, so every rank solves the same weights from all the
  ranks' batches.

The solution is written over the kept entries only: into ``<name>_orig`` under the
reparametrization (the pruned values stay recoverable), into the parameter itself under lean
masks (pruned entries stay zero). A consumer with no pruned input is not touched, so sparsity 0
changes nothing. Nothing new is added to the model: no parameter, no module, no hook remains.

Memory: one consumer's ``G`` and ``C`` at a time, at most ``2 * width**2`` float32 numbers for
a consumer of ``width`` inputs, and one batch's inputs of that consumer in both models; the
reference copy holds the model's dense weights.

Consumers that read one tensor (q, k and v reading one norm's output; the forward hands each
the same tensor object, not modified in place between them) are solved together: re-solving
one changes none of the others' inputs, so their ``G`` and ``C`` are the same and read once.

Cost: per input read, every calibration batch runs through both models up to its consumers:
``L (L + 1)`` block forwards per batch for ``L`` blocks with one such input each.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.distillation.dense_copy import dense_copy
    >>> from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
    >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import expand_keep, shapes_of
    >>> from tensorplay.ao.pruning.parity.methods import custom_from_mask
    >>> from tensorplay.ao.pruning.structured.reconstruction.consumers import find_consumers
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    >>> batches = [torch.randn(64, 8) for _ in range(4)]
    >>> group = DependencyGraph(model, example_inputs=batches[0]).groups("channel")[0]
    >>> reference = dense_copy(model)
    >>> for name, keep in expand_keep(group, torch.arange(16) < 8, shapes_of(model)).items():
    ...     module, attr = name.rsplit(".", 1)
    ...     _ = custom_from_mask(model.get_submodule(module), attr, keep)
    >>> @torch.no_grad()
    ... def error() -> float:
    ...     return sum(float((model(x) - reference(x)).square().mean()) for x in batches)
    >>> before = error()
    >>> solved = reconstruct(model, reference, find_consumers(model, [group]), batches)
    >>> [(item.parameter, item.kept, item.width, item.tokens) for item in solved]
    [('2.weight', 8, 16, 256)]
    >>> error() < before
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.calibration.batches import Forward, run_batch
from tensorplay.ao.pruning.calibration.finite import check_inputs, check_read, nonfinite_kind
from tensorplay.ao.pruning.calibration.padding import padding_of, real_rows
from tensorplay.ao.pruning.calibration.rank_sums import summed_over_ranks
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking.readers import masked_values
from tensorplay.ao.pruning.parity.reparametrization import pruned_parts
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup
from tensorplay.ao.pruning.structured.reconstruction.consumers import (
    Consumer,
    kept_inputs,
    masks_of,
    split_name,
)
from tensorplay.ao.pruning.structured.reconstruction.ridge import check_damping, ridge_solve

__all__ = ["DEFAULT_DAMPING", "Solved", "reconstruct"]

#: ``lambda`` relative to the mean diagonal of the Gram matrix (see ``docs/one_shot.rst``,
#: "Whole units, re-fitted", for the measurement that chose it).
DEFAULT_DAMPING = 1e-3


class Solved(NamedTuple):
    """One consumer re-solved: its weight's name, its kept and total input features, and the
    calibration tokens its Gram matrices summed."""

    parameter: str
    kept: int
    width: int
    tokens: int


class _Reached(Exception):
    """Raised by a capture hook: the forward has reached the consumer, nothing after it runs."""


def reconstruct(
    model: nn.Module,
    reference: nn.Module,
    consumers: Sequence[Consumer],
    batches: Iterable[Any],
    *,
    forward: Forward | None = None,
    damping: float = DEFAULT_DAMPING,
) -> list[Solved]:
    """Re-solve each consumer of pruned units of ``model`` against ``reference`` (the module).

    Args:
        model: The model, its units masked (either masking mode).
        reference: The dense model to match: a copy of ``model`` before pruning, whose modules
            have the same names.
        consumers: The layers to re-solve
            (:func:`~tensorplay.ao.pruning.structured.reconstruction.consumers.find_consumers`);
            those with no pruned input are left as they are.
        batches: The calibration batches; iterated once per consumer (an iterator is read
            into a list first).
        forward: ``(model, batch) -> output``; default
            :func:`~tensorplay.ao.pruning.calibration.batches.run_batch`.
        damping: ``lambda`` relative to the mean diagonal of each Gram matrix.

    Returns:
        The consumers re-solved, in the order they were.

    Raises:
        ValueError: A negative damping; a consumer's inputs whose leading dimensions are not
            those of the batch's ``attention_mask`` (padding cannot be told), naming it; a
            batch with a non-finite input, or a consumer whose input holds one, naming the
            batch's index and the consumer; a re-solve that is not finite (too little damping
            for its Gram matrix), naming the consumer and the damping. The weights of the
            consumers re-solved before are then given back.
        TypeError: A damping that is not a number.
    """
    check_damping("damping", damping)
    run = forward or run_batch
    data: Iterable[Any] = list(batches) if isinstance(batches, Iterator) else batches
    training = model.training
    model.eval()
    reference.eval()
    solved: list[Solved] = []
    keeps = _kept_inputs(model, consumers)
    try:
        # A refusal at a later consumer gives the earlier ones their weights back.
        with changes.transaction(keep_values=True), torch.no_grad():
            ordered, shared = _in_call_order(reference, consumers, data, run)
            for together in _readers_of_one_input(model, ordered, shared, keeps):
                keep = keeps[together[0].parameter]
                solved += _solve_together(model, reference, together, keep, data, run, damping)
    finally:
        model.train(training)
    return solved


def _kept_inputs(model: nn.Module, consumers: Sequence[Consumer]) -> dict[str, Tensor]:
    """Each consumer's kept inputs, by its parameter; read before any is re-solved (a re-solve
    writes kept entries only: the masks stay), each group's masks reduced once."""
    groups = dict.fromkeys(group for consumer in consumers for group, _ in consumer.pieces)
    masks = masks_of(model, groups)
    pruned: dict[UnitGroup, Tensor] = {}
    return {consumer.parameter: kept_inputs(consumer, masks, pruned) for consumer in consumers}


def _readers_of_one_input(
    model: nn.Module,
    ordered: Sequence[Consumer],
    shared: set[str],
    keeps: Mapping[str, Tensor],
) -> list[list[Consumer]]:
    """``ordered`` cut into runs of consumers that read one input: each after the first read
    the very tensor the one before it read, unchanged (``shared``: q, k and v reading one
    norm's output), with the same kept inputs, on the same device. Re-solving one of them
    changes none of the others' inputs, so their sums are one and read once."""
    runs: list[list[Consumer]] = []
    for consumer in ordered:
        if runs and consumer.module in shared:
            before = runs[-1][-1]
            same = torch.equal(keeps[before.parameter], keeps[consumer.parameter])
            device = _linear_weight(model, before).device
            if same and device == _linear_weight(model, consumer).device:
                runs[-1].append(consumer)
                continue
        runs.append([consumer])
    return runs


def _solve_together(
    model: nn.Module,
    reference: nn.Module,
    consumers: Sequence[Consumer],
    keep: Tensor,
    batches: Iterable[Any],
    run: Forward,
    damping: float,
) -> list[Solved]:
    """Re-solve ``consumers`` (readers of one input, :func:`_readers_of_one_input`) over their
    kept inputs ``keep`` if they have pruned inputs and the forward calls them."""
    if bool(keep.all()):
        return []  # nothing pruned: not touched
    first = consumers[0]
    found = _grams(model, reference, first, keep, batches, run)
    if found is None:
        return []  # never called by the forward: nothing to fit
    gram, cross, tokens = found
    if not (bool(torch.isfinite(gram).all()) and bool(torch.isfinite(cross).all())):
        _refuse_nonfinite_batch(model, reference, first, batches, run)  # which batch
    solved = []
    for consumer in consumers:
        dense = _linear_weight(reference, consumer)
        _write(model, consumer, keep, _solved(consumer, gram, cross, dense, damping, tokens))
        solved.append(Solved(consumer.parameter, int(keep.sum()), consumer.width, tokens))
    return solved


def _refuse_nonfinite_batch(
    model: nn.Module, reference: nn.Module, consumer: Consumer, batches: Iterable[Any], run: Forward
) -> None:
    """Find the first batch whose input, or whose input of ``consumer`` in either model, holds
    a non-finite value, and refuse it by index (read again only once the sums are not finite).

    Raises:
        ValueError: Naming the batch and the consumer; nothing if every value is finite (the
            sums overflowed: :func:`_solved` says so).
    """
    for index, batch in enumerate(batches):
        check_inputs(batch, index)
        for source in (reference, model):
            read = _input_of(source, consumer.module, batch, run)
            if read is not None:
                check_read(read, consumer.module, index)


def _solved(
    consumer: Consumer, gram: Tensor, cross: Tensor, dense: Tensor, damping: float, tokens: int
) -> Tensor:
    """The ridge solve of ``consumer``, refused unless its sums and its solution are finite."""
    where = (
        f"the re-solved weights of {consumer.parameter!r} to be finite, but the ridge solve "
        f"with damping {damping} over its {gram.shape[0]} kept inputs ({tokens} tokens)"
    )
    fix = (
        "Raise reconstruct_damping (10 times, say), calibrate on more tokens, or run the "
        "model in a wider dtype. Nothing was changed."
    )
    if not (bool(torch.isfinite(gram).all()) and bool(torch.isfinite(cross).all())):
        raise ValueError(
            f"Expected {where} sums inputs whose squares overflow float32 (its Gram matrix "
            f"holds {nonfinite_kind(gram)}): the layer's inputs are too large. {fix}"
        )
    try:
        weight = ridge_solve(gram, cross, dense, damping)
    except torch.linalg.LinAlgError as error:  # type: ignore[attr-defined]  # it is exported
        raise ValueError(
            f"Expected {where} fails ({error}): its Gram matrix is too ill-conditioned for "
            f"that damping. {fix}"
        ) from None
    if not bool(torch.isfinite(weight).all()):
        raise ValueError(
            f"Expected {where} gives {nonfinite_kind(weight)}: its Gram matrix is too "
            f"ill-conditioned for that damping. {fix}"
        )
    return weight


def _in_call_order(
    reference: nn.Module, consumers: Sequence[Consumer], batches: Iterable[Any], run: Forward
) -> tuple[list[Consumer], set[str]]:
    """``consumers`` in the order one forward of the first batch calls them (those it never
    calls last, in their given order), and the modules whose input is the very tensor, not
    modified in place since, that the consumer called just before was given."""
    first = next(iter(batches), None) if consumers else None
    if first is None:
        return list(consumers), set()
    order: dict[str, int] = {}
    shared: set[str] = set()
    last: list[tuple[Any, int]] = []  # the input the consumer called last was given
    handles = []
    for consumer in consumers:
        module = reference.get_submodule(consumer.module)

        def note(module: nn.Module, args: Any, name: str = consumer.module) -> None:
            if name in order:
                return
            order[name] = len(order)
            given = args[0] if args else None
            version = _version(given)
            if version is None:
                last.clear()
                return
            if last and last[0][0] is given and last[0][1] == version:
                shared.add(name)
            last[:] = [(given, version)]

        handles.append(module.register_forward_pre_hook(note))
    try:
        run(reference, first)
    finally:
        for handle in handles:
            handle.remove()
        last.clear()
    end = len(order)
    ordered = sorted(consumers, key=lambda consumer: order.get(consumer.module, end))
    return ordered, shared


def _version(given: Any) -> int | None:
    """How often the tensor ``given`` was modified in place (``None``: not a tensor, or an
    inference tensor, which keeps no count)."""
    if not isinstance(given, Tensor):
        return None
    try:
        return int(given._version)
    except RuntimeError:
        return None


def _input_of(model: nn.Module, module_name: str, batch: Any, run: Forward) -> Tensor | None:
    """The first input of ``module_name`` when ``batch`` runs through ``model``, stopping the
    forward there; ``None`` if the forward never calls it."""
    captured: list[Tensor] = []

    def capture(module: nn.Module, args: tuple[Any, ...]) -> None:
        captured.append(args[0])
        raise _Reached

    handle = changes.hook(model.get_submodule(module_name).register_forward_pre_hook, capture)
    try:
        run(model, batch)
    except _Reached:
        pass
    finally:
        handle.remove()
    return captured[0] if captured else None


def _grams(
    model: nn.Module,
    reference: nn.Module,
    consumer: Consumer,
    keep: Tensor,
    batches: Iterable[Any],
    run: Forward,
) -> tuple[Tensor, Tensor, int] | None:
    """``G``, ``C`` and the number of tokens summed, over every batch and every rank of the
    default process group (``None``: no token)."""
    device = _linear_weight(model, consumer).device
    kept = int(keep.sum())
    gram = torch.zeros(kept, kept, dtype=torch.float32, device=device)
    cross = torch.zeros(kept, consumer.width, dtype=torch.float32, device=device)
    tokens = torch.zeros((), dtype=torch.int64, device=device)
    for batch in batches:
        dense = _input_of(reference, consumer.module, batch, run)
        pruned = _input_of(model, consumer.module, batch, run)
        if dense is None or pruned is None:
            continue
        with padding_of(batch):  # the padding's tokens are no tokens of the data
            x_d = real_rows(dense, consumer.module).to(device=device, dtype=torch.float32)
            x_k = real_rows(pruned, consumer.module).to(device=device, dtype=torch.float32)
        x_k = x_k[:, keep.to(device)]
        gram.addmm_(x_k.T, x_k)
        cross.addmm_(x_k.T, x_d)
        tokens += x_k.shape[0]
    gram, cross, tokens = (summed_over_ranks(total) for total in (gram, cross, tokens))
    if int(tokens) == 0:
        return None
    return gram, cross, int(tokens)


def _linear_weight(model: nn.Module, consumer: Consumer) -> Tensor:
    """The consumer's weight as ``model`` computes with it, ``(out, in)``."""
    module_name, attr = split_name(consumer.parameter)
    weight: Tensor = getattr(model.get_submodule(module_name), attr).detach()
    return weight.T if consumer.transposed else weight


def _write(model: nn.Module, consumer: Consumer, keep: Tensor, weight: Tensor) -> None:
    """Write ``weight`` (``(out, kept)``) over the kept entries of the consumer's values."""
    module_name, attr = split_name(consumer.parameter)
    module = model.get_submodule(module_name)
    held = masked_values(module, attr)
    values: Tensor = held[0] if held is not None else getattr(module, attr)
    layout = values.T if consumer.transposed else values
    update = layout.detach().clone()
    update[:, keep.to(update.device)] = weight.to(update.dtype)
    if held is not None:
        mask = held[1].T if consumer.transposed else held[1]
        update = torch.where(mask.to(update.device) != 0, update, layout.detach())
    changes.keep_values(values)  # a refusal later in the call gives the values back
    layout.detach().copy_(update)
    parts = pruned_parts(module, attr)
    if parts is not None:  # the reparametrized tensor, as its forward pre-hook recomputes it
        changes.set_attribute(module, attr, parts.mask.to(dtype=parts.orig.dtype) * parts.orig)
