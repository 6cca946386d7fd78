"""Post-training pruning in one call: calibrate on a few batches, prune once.

The workflow of Wanda (Sun et al. 2023) and its peers on a trained model: load it, run a few
calibration batches through it, prune every output row to the target sparsity by
``|W| * ||X_j||``, save. :func:`prune_one_shot` is a
:class:`~tensorplay.ao.pruning.pruner.Pruner` with a
:class:`~tensorplay.ao.pruning.pruner.schedules.OneShotSchedule`, one calibration pass and one
``step()``; anything it does a user can do with those three.

Example:
    >>> import copy
    >>> import torch
    >>> from torch import nn
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    >>> batches = [torch.randn(32, 8) for _ in range(4)]
    >>> pruner = prune_one_shot(model, batches, 0.5)  # Wanda, per row, made permanent
    >>> pruner.sparsity(), sorted(model[0].state_dict())
    (0.5, ['bias', 'weight'])

    Half of the hidden channels, by activation norms, then removed:

    >>> from tensorplay.ao.pruning import shrink
    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    >>> pruner = prune_one_shot(model, batches, 0.5, structure="channel",
    ...                         example_inputs=batches[0])
    >>> _ = shrink(model)
    >>> model[0].out_features, model[2].in_features
    (8, 8)

    The same, with the layer reading the pruned channels re-solved to match the dense outputs:

    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    >>> dense = [model(x).detach() for x in batches]
    >>> def error(model: nn.Module) -> float:
    ...     with torch.no_grad():
    ...         return sum(float((model(x) - y).square().mean()) for x, y in zip(batches, dense))
    >>> plain, solved = copy.deepcopy(model), copy.deepcopy(model)
    >>> _ = prune_one_shot(plain, batches, 0.5, structure="channel", example_inputs=batches[0])
    >>> _ = prune_one_shot(solved, batches, 0.5, structure="channel", example_inputs=batches[0],
    ...                    reconstruct=True)
    >>> error(solved) < error(plain)
    True

    The residual stream's width, its readers re-solved (a Hugging Face model: no tracing):

    >>> import transformers
    >>> config = transformers.LlamaConfig(
    ...     vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
    ...     num_attention_heads=4, num_key_value_heads=2)
    >>> llama = transformers.LlamaForCausalLM(config).eval()
    >>> tokens = [{"input_ids": torch.randint(0, 32, (2, 16))} for _ in range(4)]
    >>> _ = prune_one_shot(llama, tokens, 0.25, structure="hidden", reconstruct=True)
    >>> _ = shrink(llama)
    >>> llama.config.hidden_size
    12
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal, overload

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.calibration.batches import Forward, run_batch
from tensorplay.ao.pruning.calibration.finite import (
    FiniteWatch,
    NonFiniteCalibrationError,
    check_inputs,
)
from tensorplay.ao.pruning.calibration.padding import padding_of
from tensorplay.ao.pruning.distillation.dense_copy import dense_copy
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.config import Scope, Structure
from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
from tensorplay.ao.pruning.pruner.search import SearchResult, choose_mix, realize_mix
from tensorplay.ao.pruning.pruner.search_grid import SearchGrid, check_search, check_search_score
from tensorplay.ao.pruning.structured.dependency.hidden_width import HIDDEN
from tensorplay.ao.pruning.structured.reconstruction import (
    DEFAULT_DAMPING,
    RECONSTRUCTED_KINDS,
    Consumer,
    check_damping,
    consumers_for,
    find_consumers,
)
from tensorplay.ao.pruning.structured.reconstruction import reconstruct as reconstruct_consumers
from tensorplay.ao.pruning.structured.units import STRUCTURES
from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget
from tensorplay.ao.pruning.structured.units.one_shot_scores import one_shot_importance

__all__ = ["calibrate", "one_shot_importance", "one_shot_schedule", "prune_one_shot"]


def _loss_of(output: Any) -> Tensor:
    loss = getattr(output, "loss", output)
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        raise TypeError(
            "Expected the calibration forward to return a scalar loss (or an output with a "
            f"`.loss`) for a gradient importance, but got {type(output).__name__}: pass "
            "`forward=lambda model, batch: loss`."
        )
    return loss


def calibrate(pruner: Pruner, batches: Iterable[Any], forward: Forward | None = None) -> int:
    """Run ``batches`` through ``pruner.model`` for its importance: forwards under
    ``torch.no_grad`` in eval mode (Wanda's input norms), or, for a gradient importance
    (movement, Taylor), a forward and backward per batch, each accumulated as one step with
    the gradients cleared before and after. The model's train/eval mode is restored.

    Args:
        pruner: The pruner whose importance observes the batches.
        batches: Any iterable of batches (a ``DataLoader``, a list of tensors).
        forward: ``(model, batch) -> output`` (a scalar loss for a gradient importance);
            default ``model(batch)``, ``model(*batch)`` for a tuple, ``model(**batch)`` for a
            mapping (a Hugging Face model given ``labels`` returns its loss).

    A mapping batch whose ``attention_mask`` marks padding (a tokenizer's ``padding=True``)
    has its padding positions left out of every score that reads activations per token
    (:mod:`~tensorplay.ao.pruning.calibration.padding`).

    Every batch is checked as it is read (:mod:`~tensorplay.ao.pruning.calibration.finite`):
    a ``NaN`` or an infinity in its inputs, or in the output of any module, is refused before it
    reaches a score.

    Returns:
        The number of batches run.

    Raises:
        TypeError: A gradient importance whose forward returns no scalar loss.
        ValueError: A batch with a non-finite input or activation, naming the batch (its index)
            and the first module whose output holds it; the importance has not counted it.
    """
    run = forward or run_batch
    model = pruner.model
    training = model.training
    count = 0
    model.eval()
    try:
        with FiniteWatch(model) as watch:
            for index, batch in enumerate(batches):
                check_inputs(batch, index)
                _calibrate_one(pruner, batch, run, watch, index)
                count += 1
    finally:
        if pruner.importance.needs_gradients:
            model.zero_grad(set_to_none=True)
        model.train(training)
    return count


def _calibrate_one(
    pruner: Pruner, batch: Any, run: Forward, watch: FiniteWatch, index: int
) -> None:
    """One batch: its forward (and backward for a gradient importance), refused where a
    non-finite value first appears (the module that made it, if the watch saw one)."""
    model = pruner.model
    try:
        if pruner.importance.needs_gradients:
            model.zero_grad(set_to_none=True)
            with padding_of(batch):
                loss = _loss_of(run(model, batch))
            watch.check(index)  # before the gradients reach the accumulators
            if not bool(torch.isfinite(loss.detach())):
                raise ValueError(
                    f"Expected finite calibration data, but the loss of batch {index} is "
                    f"{float(loss)} (every module's output was finite): check its labels."
                )
            torch.autograd.backward(loss)
            pruner.accumulate()
        else:
            with torch.no_grad(), padding_of(batch):
                run(model, batch)
            watch.check(index)
    except NonFiniteCalibrationError as error:  # an importance refused what it was to read
        watch.check(index)  # the module where the value first appeared, if it came earlier
        raise error.at_batch(index) from None


def one_shot_schedule(
    sparsity: float | None,
    target_params: int | float | None,
    target_active_params: int | float | None = None,
    target_memory: MemoryBudget | None = None,
    target_latency: LatencyBudget | None = None,
) -> OneShotSchedule:
    """The schedule of one step: to ``sparsity``, or the whole way to the budgets.

    Raises:
        ValueError: Both a sparsity and a budget, or neither.

    Example:
        >>> one_shot_schedule(0.5, None), one_shot_schedule(None, 0.8)
        (OneShotSchedule(sparsity=0.5, step=0), OneShotSchedule(sparsity=None, step=0))
    """
    budgets = {
        "target_params": target_params,
        "target_active_params": target_active_params,
        "target_memory": target_memory,
        "target_latency": target_latency,
    }
    given = {name: value for name, value in budgets.items() if value is not None}
    if (sparsity is None) == (not given):
        named = "".join(f" and {name}={value!r}" for name, value in given.items())
        raise ValueError(
            "Expected exactly one of `sparsity` and budgets (`target_params`, "
            "`target_active_params`, `target_memory`, `target_latency`), but got "
            f"sparsity={sparsity!r}{named or ' and no budget'}."
        )
    return OneShotSchedule(sparsity)  # without one: the whole way to the budget


@overload
def prune_one_shot(
    model: nn.Module,
    batches: Iterable[Any],
    sparsity: float | None = None,
    *,
    target_params: int | float | None = None,
    target_active_params: int | float | None = None,
    target_memory: MemoryBudget | None = None,
    target_latency: LatencyBudget | None = None,
    importance: str | None = None,
    scope: Scope | None = None,
    structure: Structure | tuple[Structure, ...] = "element",
    forward: Forward | None = None,
    make_permanent: bool = True,
    reconstruct: bool = False,
    reconstruct_damping: float = DEFAULT_DAMPING,
    search: Literal[False] = False,
    search_grid: None = None,
    search_score: Literal["loss"] = "loss",
    **options: Any,
) -> Pruner: ...


@overload
def prune_one_shot(
    model: nn.Module,
    batches: Iterable[Any],
    sparsity: None = None,
    *,
    target_params: int | float | None = None,
    target_active_params: int | float | None = None,
    target_memory: MemoryBudget | None = None,
    target_latency: LatencyBudget | None = None,
    importance: str | Mapping[str, str] | None = None,
    scope: Scope | None = None,
    structure: tuple[Structure, ...],
    forward: Forward | None = None,
    make_permanent: bool = True,
    reconstruct: Literal[False] = False,
    reconstruct_damping: float = DEFAULT_DAMPING,
    search: Literal[True],
    search_grid: SearchGrid | None = None,
    search_score: Literal["loss", "kl"] = "loss",
    **options: Any,
) -> SearchResult: ...


def prune_one_shot(
    model: nn.Module,
    batches: Iterable[Any],
    sparsity: float | None = None,
    *,
    target_params: int | float | None = None,
    target_active_params: int | float | None = None,
    target_memory: MemoryBudget | None = None,
    target_latency: LatencyBudget | None = None,
    importance: str | Mapping[str, str] | None = None,
    scope: Scope | None = None,
    structure: Structure | tuple[Structure, ...] = "element",
    forward: Forward | None = None,
    make_permanent: bool = True,
    reconstruct: bool = False,
    reconstruct_damping: float = DEFAULT_DAMPING,
    search: bool = False,
    search_grid: SearchGrid | None = None,
    search_score: Literal["loss", "kl"] = "loss",
    **options: Any,
) -> Pruner | SearchResult:
    """Prune ``model`` once to ``sparsity`` after a calibration pass over ``batches``.

    Args:
        model: A trained model.
        batches: The calibration batches (:func:`calibrate`).
        sparsity: The fraction of the targets' units pruned, in ``[0, 1]``; or
        target_params: The parameters the model keeps after
            :func:`~tensorplay.ao.pruning.structured.shrinking.shrink.shrink`: an int (every
            parameter of the model, embeddings included, tied ones once) or a float in (0, 1] (that
            fraction of its parameters now); exactly one of ``sparsity`` and the budgets.
            Units are ranked by standardised score per parameter removed
            (:mod:`~tensorplay.ao.pruning.structured.units.budget`); the shrunk model lands at most
            at the budget and within one unit's parameters of it (one unit per layer with
            ``scope="layerwise"``, whose widths are equal per kind).
        target_active_params: The parameters one token uses after shrinking (a
            mixture-of-experts model's parameters outside its routed experts plus ``top_k``
            experts per layer), an int or a fraction as ``target_params``.
        target_memory: The bytes of the weights and the key/value cache after shrinking, at a
            batch size, context length and dtype
            (:class:`~tensorplay.ao.pruning.structured.units.memory_setting.MemoryBudget`).
        target_latency: The estimated inference latency after shrinking, a fraction of the
            dense model's, on the inputs of a
            :class:`~tensorplay.ao.pruning.structured.units.latency_setting.LatencyBudget`: the
            model's parts are timed once on its device, and units are ranked by score per
            share of that estimate they remove
            (:mod:`~tensorplay.ao.pruning.structured.units.latency`).
            The budgets go alone or together: units go until every budget given is met, and
            :meth:`~tensorplay.ao.pruning.pruner.Pruner.budget_report` says where the model
            landed against each.
        importance: The score (:mod:`~tensorplay.ao.pruning.importance`); by default
            :func:`one_shot_importance`'s: Wanda, activations for ``structure="hidden"``, REAP
            (``"reap"``) for ``"expert"``, magnitude for the channels of a model with routed
            experts.
        scope: ``"row"`` (Wanda's choice: each output row on its own), ``"layerwise"`` or
            ``"global"``; by default ``"row"`` for single weights and ``"global"`` for a
            ``structure`` of units (FLAP's choice: channels ranked across the model), but
            ``"layerwise"`` for experts (REAP's: every layer keeps as many, and the shrunk model
            loads with plain ``from_pretrained``).
        structure: What a unit is: ``"element"``, ``"channel"``, ``"head"``, ``"layer"``,
            ``"expert"`` or, with ``target_params``, a tuple of kinds such as
            ``("channel", "head")`` (:class:`~tensorplay.ao.pruning.pruner.config.PrunerConfig`);
            the model's units are masked in every slice, and
            :func:`~tensorplay.ao.pruning.structured.shrinking.shrink.shrink` removes them
            afterwards (a plain model needs ``example_inputs=`` to be traced).
        forward: How a batch runs through the model (:func:`calibrate`).
        make_permanent: Drop the masks and hooks afterwards, keeping the zeros: the model then
            saves as a plain dense-format state_dict (``save_pretrained``, ``torch.save``).
            Experts stay unrouted by their zero router rows while the routing hook is on the
            model: :func:`~tensorplay.ao.pruning.structured.shrinking.shrink.shrink` before saving.
        reconstruct: After the step, re-solve the layers that read the pruned units over
            their kept inputs, so that their outputs match the dense model's on ``batches``
            (:mod:`~tensorplay.ao.pruning.structured.reconstruction`; ``structure="channel"``,
            ``"head"`` or ``"hidden"``: for hidden channels, every Linear or ``Conv1D`` reading
            the residual stream, an untied LM head included; the writers, a tied head, routers
            and routed experts' fused tensors keep their dense values). It holds a dense copy of
            the model while it runs, and ``batches`` are run once more per such layer (an
            iterator is read into a list first).
        reconstruct_damping: The ridge ``lambda`` of the re-solve, relative to the mean
            diagonal of each layer's input Gram matrix.
        search: Search the mix of the kinds of ``structure`` (a tuple of at least two of
            ``"layer"``, ``"hidden"``, ``"head"``, ``"channel"``, ``"expert"``) under the
            budgets: every allocation of what they ask to remove among the kinds is realized,
            scored on ``batches`` and taken back, and the best that meets every budget is kept
            (:mod:`~tensorplay.ao.pruning.pruner.search`). ``importance`` may then map each kind
            to its score; ``forward`` must return a scalar loss unless the batches are
            mappings holding ``input_ids`` (a causal LM's loss scores them).
        search_grid: With ``search``: the shares are multiples of ``1 / search_grid`` (default
            4), or a list of allocations (``[{"layer": 0.5, "channel": 0.5}]``); each kind alone
            is always a candidate.
        search_score: With ``search``: how a candidate is scored on ``batches``: ``"loss"``
            (the mean loss, as above) or ``"kl"`` (the mean over tokens of the KL divergence
            of the candidate's next-token distribution from the dense model's; the dense
            logits of every batch are read once and kept on the CPU, ``tokens * vocabulary *
            4`` bytes).
        **options: Any other argument of :class:`~tensorplay.ao.pruning.pruner.Pruner`
            (``parameters``, ``exclude``, ``keep_dense``, ``min_density``, ``masking``,
            ``multiple_of``, ``example_inputs``...).

    Returns:
        The pruner (its :meth:`~tensorplay.ao.pruning.pruner.Pruner.report` tells what it did);
        with ``search=True``, a :class:`~tensorplay.ao.pruning.pruner.search.SearchResult`:
        the chosen candidate's pruner of each kind and the search's report.

    Raises:
        TypeError, ValueError: As the :class:`~tensorplay.ao.pruning.pruner.Pruner`; both or
            neither of ``sparsity`` and ``target_params``; a budget below the smallest size
            the floors allow (naming it); ``reconstruct=True`` with a ``structure`` other than
            ``"channel"``, ``"head"`` or ``"hidden"``, a negative ``reconstruct_damping``, or a
            layer reading pruned units that is not a Linear or ``Conv1D`` (a convolution). All
            before anything changes.
        RuntimeError: No batch reached a target (nothing is pruned; the hooks are removed).
    """
    schedule = one_shot_schedule(
        sparsity, target_params, target_active_params, target_memory, target_latency
    )
    damping = _check_reconstruct(reconstruct, reconstruct_damping, structure)
    if search is not False:
        return _search(
            model, batches, structure, search, search_grid, reconstruct, importance,
            forward=forward, make_permanent=make_permanent, options=options, score=search_score,
            budgets={"target_params": target_params, "target_active_params":
                     target_active_params, "target_memory": target_memory,
                     "target_latency": target_latency},
        )  # fmt: skip
    if search_grid is not None:
        raise ValueError(
            f"Expected `search_grid` only with search=True, but got search_grid={search_grid!r}."
        )
    if search_score != "loss":
        raise ValueError(
            f"Expected `search_score` only with search=True, but got {search_score!r}."
        )
    if not (importance is None or isinstance(importance, str)):
        raise TypeError(f"Expected `importance` to be a name, but got {importance!r}.")
    kind = STRUCTURES.get(structure) if isinstance(structure, str) else STRUCTURES["channel"]
    chosen: Any = scope or (kind.one_shot_scope if kind is not None else "row")
    score = importance or one_shot_importance(structure, model)
    data = list(batches) if reconstruct and isinstance(batches, Iterator) else batches
    reference = dense_copy(model) if reconstruct else None  # before any hook is on the model
    # A refusal anywhere below (a reconstruction that cannot solve, say) takes back every
    # change: masks, hooks, the records on the model, and the values written in place.
    with changes.transaction(keep_values=reconstruct):
        pruner = Pruner(
            model,
            schedule,
            importance=score,
            scope=chosen,
            structure=structure,
            target_params=target_params,
            target_active_params=target_active_params,
            target_memory=target_memory,
            target_latency=target_latency,
            **options,
        )
        try:
            kinds = (structure,) if isinstance(structure, str) else structure
            consumers = (
                []
                if reference is None
                else _consumers(pruner, reference, kinds, options.get("example_inputs"))
            )
            calibrate(pruner, data, forward)
            pruner.step()
            if reference is not None:
                reconstruct_consumers(
                    model, reference, consumers, data, forward=forward, damping=damping
                )
                pruner.importance.after_pruning()  # its forwards are no observation
        except BaseException:
            pruner.importance.close()
            raise
        if make_permanent:
            pruner.make_permanent()
    return pruner


def _consumers(
    pruner: Pruner, reference: nn.Module, kinds: Iterable[str], example: Any
) -> list[Consumer]:
    """The layers reconstruction re-solves: those reading the units of each kind the pruner
    prunes. The hidden group is the one the pruner recorded, which leaves out the blocks a
    layer pruning masked whole (the graph's spans them: their readers have nothing to fit)."""
    names = [name for names in pruner.aliases.values() for name in names]
    found: list[Consumer] = []
    for kind in kinds:
        if kind == HIDDEN:
            groups = [group for group in pruner.structure.groups if group.kind == HIDDEN]
            found += find_consumers(reference, groups)
        else:
            found += consumers_for(reference, kind, names, example)
    return found


def _search(
    model: nn.Module,
    batches: Iterable[Any],
    structure: object,
    search: object,
    grid: SearchGrid | None,
    reconstruct: bool,
    importance: str | Mapping[str, str] | None,
    *,
    forward: Forward | None,
    make_permanent: bool,
    options: dict[str, Any],
    budgets: dict[str, Any],
    score: object,
) -> SearchResult:
    """``prune_one_shot(..., search=True)``, its options checked first."""
    if search is not True:
        raise TypeError(f"Expected `search` to be a bool, but got {search!r}.")
    score = check_search_score(score)
    if reconstruct:
        raise ValueError(
            "Expected reconstruct=False with search=True: the candidates are scored as pruned."
        )
    kinds, allocations = check_search(structure, budgets, grid, importance)
    data = list(batches)
    choice = choose_mix(
        prune_one_shot, model, data, kinds, allocations, budgets=budgets,
        importance=importance, forward=forward, options=options, score=score,
    )  # fmt: skip
    return realize_mix(
        prune_one_shot, model, data, choice, importance=importance, forward=forward,
        make_permanent=make_permanent, options=options,
    )  # fmt: skip


def _check_reconstruct(
    reconstruct: object, damping: object, structure: str | tuple[str, ...]
) -> float:
    """The damping, once ``reconstruct`` and ``structure`` (one kind, or several with a
    parameter budget) are checked to go together."""
    if not isinstance(reconstruct, bool):
        raise TypeError(f"Expected `reconstruct` to be a bool, but got {reconstruct!r}.")
    value = check_damping("reconstruct_damping", damping)
    kinds = (structure,) if isinstance(structure, str) else structure
    if reconstruct and not all(kind in RECONSTRUCTED_KINDS for kind in kinds):
        raise ValueError(
            f"Expected structure='channel', 'head' or 'hidden' with reconstruct=True, but got "
            f"{structure!r}: only the layers that read pruned channels, heads or hidden "
            "channels are re-solved."
        )
    return value
