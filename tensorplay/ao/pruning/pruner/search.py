"""``prune_one_shot(..., search=True)``: choose the mix of depth and widths under a budget.

Minitron's search (Muralidharan et al. 2024, Sreenivas et al. 2024) on one call. The parameters a
budget asks to remove are shared among the kinds of units (depth: ``"layer"``; widths:
``"hidden"``, ``"head"``, ``"channel"``; ``"expert"`` on a mixture-of-experts model) in every
*allocation* of a grid (:mod:`~tensorplay.ao.pruning.pruner.search_grid`), plus each kind alone.
Each candidate is realized on the model, scored on the calibration batches and taken back; the
best candidate that meets every budget is realized again and kept.

**Realizing a candidate.** Kinds whose units overlap cannot share one pruner, so the kinds are
pruned one after another on the same model, each by a plain
:func:`~tensorplay.ao.pruning.prune_one_shot` of its own (its own calibration pass, its own
importance), in the fixed order of :data:`SEARCH_ORDER`: depth first, then the hidden width,
heads, channels, experts. Each kind is given an explicit number of units, not a budget of its
own: a kind's budget would price its units in the dense model's shapes, but after the kinds
before it a unit holds less (a channel's column is as tall as the hidden width kept; a pruned
layer's heads hold nothing). The count is planned on the kept grids the masks leave
(:mod:`~tensorplay.ao.pruning.structured.units.kept_grid`): after the kinds up to ``k``, the
model should hold ``total - (s_1 + ... + s_k) * (total - budget)`` parameters, and kind ``k``
prunes the fewest units that get there at its units' current price. The blocks a pruned layer
leaves masked are excluded from the later kinds (their units would free nothing), and the
hidden width is pruned in the blocks that remain. The last kind of a candidate lands on the
budget, within one of its units.

**Counting and scoring.** A candidate is applied inside a
:func:`~tensorplay.ao.pruning.edits.changes.transaction` that is then taken back (the model is
never copied): the kinds' masks, then :func:`~tensorplay.ao.pruning.shrink`, whose parameters,
active parameters and memory are the candidate's measures, exactly what the shrunk model holds;
then the mean loss over the calibration batches (the shrunk model computes what the masked one
does), or with ``search_score="kl"`` the mean KL divergence of its next-token distributions
from the dense model's; the padding a batch's ``attention_mask`` marks is not scored.
Candidates always hold their masks as ``masking="reparametrize"`` (whose pruned values survive
in the ``_orig`` parameters, so taking the candidate back writes nothing); the chosen one is
realized with the caller's options.

**Cost.** Each candidate runs, per kind it prunes, one calibration pass over the batches, then one
scoring pass; a candidate's importance reads the model as the kinds before left it, so scores are
not shared between candidates. The chosen candidate is realized once more (one calibration pass
per kind).

Example:
    >>> import sys; sys.path.insert(0, "tests")
    >>> import torch
    >>> from hf_models import tiny_llama
    >>> from tensorplay.ao.pruning import prune_one_shot, shrink
    >>> model = tiny_llama()
    >>> batches = [{"input_ids": torch.randint(3, 97, (2, 16))} for _ in range(2)]
    >>> result = prune_one_shot(model, batches, target_params=0.8,
    ...                         structure=("layer", "channel"), search=True, search_grid=2)
    >>> [row["allocation"] for row in result.search_report()]
    [{'layer': 0.0, 'channel': 1.0}, {'layer': 0.5, 'channel': 0.5}, {'layer': 1.0, 'channel': 0.0}]
    >>> sum(row["chosen"] for row in result.search_report())
    1
    >>> shrink(model).parameters_after == result.chosen["params"]
    True
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.calibration.batches import Forward
from tensorplay.ao.pruning.calibration.padding import real_tokens
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.search_grid import SEARCH_ORDER, Allocation
from tensorplay.ao.pruning.structured.shrinking.shrink import shrink
from tensorplay.ao.pruning.structured.units.budget import model_params
from tensorplay.ao.pruning.structured.units.kept_grid import read_kept_grid
from tensorplay.ao.pruning.structured.units.latency import estimate_latency
from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
from tensorplay.ao.pruning.structured.units.measures import measures_of
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget
from tensorplay.ao.pruning.structured.units.search_reading import SearchReading, read_search

__all__ = [
    "MixChoice",
    "SearchResult",
    "choose_mix",
    "kind_importance",
    "realize_mix",
]

_Found = tuple[dict[str, Any], dict[str, float]]

OneShot = Callable[..., Pruner]
""":func:`~tensorplay.ao.pruning.prune_one_shot`, passed in by its module."""


class SearchResult:
    """What ``prune_one_shot(..., search=True)`` returns: the pruners of the chosen candidate
    and the record of every candidate.

    Args:
        pruners: The chosen candidate's pruner of each kind it pruned, in the order pruned.
        rows: One plain dict per candidate (:meth:`search_report`).

    Example:
        >>> result = SearchResult({}, [{"allocation": {"layer": 1.0}, "chosen": True}])
        >>> result.chosen["allocation"], result.pruners
        ({'layer': 1.0}, {})
    """

    def __init__(self, pruners: Mapping[str, Pruner], rows: Sequence[Mapping[str, Any]]) -> None:
        self.pruners = dict(pruners)
        self._rows = [dict(row) for row in rows]

    @property
    def chosen(self) -> dict[str, Any]:
        """The chosen candidate's row of :meth:`search_report`."""
        return next(dict(row) for row in self._rows if row["chosen"])

    def search_report(self) -> list[dict[str, Any]]:
        """One plain dict per candidate, in the order searched: ``allocation`` (each kind's share
        of the parameters to remove), ``units`` (the units each kind pruned), ``params`` (the
        parameters the shrunk model holds; active parameters under ``active_params`` where the
        model has routed experts or ``target_active_params`` was given, bytes under ``memory``
        with ``target_memory``, the estimated latency in seconds under ``latency`` and as a
        fraction of the dense model's under ``latency_fraction`` with ``target_latency``, read
        from the candidate's masks before it is shrunk),
        ``score`` (the mean calibration loss, or KL), ``meets``
        (whether every budget is met), ``reason`` (why a candidate could not be realized, or
        ``None``; its measures and score are ``None`` then), ``seconds`` and ``chosen``
        (``True`` on exactly one).

        Example:
            >>> SearchResult({}, [{"score": 1.0, "chosen": True}]).search_report()
            [{'score': 1.0, 'chosen': True}]
        """
        return [dict(row) for row in self._rows]


@dataclass(frozen=True)
class MixChoice:
    """What the search chose, before anything is kept: the candidates' rows (the chosen one
    marked) and what realizing the chosen allocation again needs.

    Args:
        rows: One plain dict per candidate (:meth:`SearchResult.search_report`).
        allocation: The chosen allocation.
        shares: Each kind's fraction of the units of every one of its groups that the chosen
            candidate pruned (for ``"layer"``: of the blocks), in :data:`SEARCH_ORDER`.
        reading: What the search read of the dense model.
    """

    rows: list[dict[str, Any]]
    allocation: Allocation
    shares: dict[str, float]
    reading: SearchReading


def choose_mix(
    one_shot: OneShot,
    model: nn.Module,
    batches: Sequence[Any],
    kinds: Sequence[str],
    grid: Sequence[Allocation],
    *,
    budgets: Mapping[str, int | float | MemoryBudget | LatencyBudget | None],
    importance: str | Mapping[str, str] | None,
    forward: Forward | None,
    options: Mapping[str, Any],
    score: str = "loss",
) -> MixChoice:
    """Score every allocation of ``grid`` and choose the best that meets every budget, each
    candidate taken back: the model is left as it was (see the module); ``score``: ``"loss"``
    or ``"kl"`` (from the dense model's logits).

    Raises:
        TypeError: No ``forward`` and batches that are not mappings holding ``input_ids`` (the
            causal LM loss cannot be asked for).
        ValueError: No candidate meets every budget, naming the closest.
    """
    loss = _kl_fn(model, batches) if score == "kl" else _loss_fn(forward, batches)
    if forward is not None:  # each kind's calibration pass runs the batches as the caller does
        options = {**options, "forward": forward}
    reading = read_search(model, budgets, kinds)
    limits = reading.limits
    rows: list[dict[str, Any]] = []
    shares: list[dict[str, float]] = []
    for allocation in grid:
        started = time.perf_counter()
        row: dict[str, Any] = {"allocation": {k: float(v) for k, v in allocation.items()}}
        realized: dict[str, float] = {}
        try:
            found, realized = _trial(
                functools.partial(
                    _candidate, one_shot, model, batches, allocation, reading, importance, loss,
                    options,
                )
            )  # fmt: skip
        except (ValueError, RuntimeError) as error:  # a kind that cannot take its share
            row.update(units=None, params=None, score=None, meets=False, reason=str(error))
        else:
            row.update(found)
            row["meets"] = all(row[key] <= limit for key, limit in limits.items())
            row["reason"] = None
        row["seconds"] = float(f"{time.perf_counter() - started:.3f}")
        row["chosen"] = False
        rows.append(row)
        shares.append(realized)
    feasible = [row for row in rows if row["meets"]]
    if not feasible:
        closest = min(
            (row for row in rows if row["params"] is not None),
            key=lambda row: row["params"],
            default=None,
        )
        raise ValueError(
            f"Expected some candidate of the search to meet every budget ({limits}), but none "
            f"does; the closest: {closest if closest is not None else rows[0]}."
        )
    best = min(feasible, key=lambda row: row["score"])
    best["chosen"] = True
    index = rows.index(best)
    return MixChoice(rows, grid[index], shares[index], reading)


def realize_mix(
    one_shot: OneShot,
    model: nn.Module,
    batches: Sequence[Any],
    choice: MixChoice,
    *,
    importance: str | Mapping[str, str] | None,
    forward: Forward | None,
    make_permanent: bool,
    options: Mapping[str, Any],
) -> SearchResult:
    """Realize the chosen candidate of :func:`choose_mix` on ``model`` and keep it (made
    permanent if asked), all or nothing.

    Raises:
        ValueError, RuntimeError: A kind that cannot take its share again (the model is as it
            was).
    """
    if forward is not None:  # each kind's calibration pass runs the batches as the caller does
        options = {**options, "forward": forward}
    with changes.transaction():
        pruners = _realize(
            one_shot, model, batches, choice.allocation, choice.reading, importance, options
        )
        if make_permanent:
            for pruner in pruners.values():
                pruner.make_permanent()
    return SearchResult(pruners, choice.rows)


def _trial(run: Callable[[], _Found]) -> _Found:
    """``run()`` inside a transaction that is then taken back; what it returned."""
    with changes.trial(keep_values=True):
        return run()


def _candidate(
    one_shot: OneShot,
    model: nn.Module,
    batches: Sequence[Any],
    allocation: Allocation,
    reading: SearchReading,
    importance: str | Mapping[str, str] | None,
    loss: Callable[[nn.Module, Any], Tensor],
    options: Mapping[str, Any],
) -> _Found:
    """Realize ``allocation`` in masks, shrink, measure and score (the caller takes it back):
    the candidate's row entries, and each kind's share of its groups' units (the target of its
    pruner); the latency is estimated from the reading's table on the masks, before
    shrinking."""
    pruners = _realize(
        one_shot, model, batches, allocation, reading, importance,
        {**options, "masking": "reparametrize"},
    )  # fmt: skip
    units = {kind: pruner.pruned_count() for kind, pruner in pruners.items()}
    shares = {kind: pruner.target_sparsity() for kind, pruner in pruners.items()}
    table = reading.latency
    latency = None if table is None else estimate_latency(model, table)
    shrink(model)
    found: dict[str, Any] = {"units": units, "params": model_params(model)}
    measures = measures_of(model, reading.memory, active=reading.active)
    if reading.active:
        measure = measures["target_active_params"]
        found["active_params"] = measure.total // measure.scale
    if reading.memory is not None:
        found["memory"] = measures["target_memory"].total
    if latency is not None and table is not None:
        found["latency"] = latency
        found["latency_fraction"] = latency / table.dense
    found["score"] = _score(model, batches, loss)
    return found, shares


def _realize(
    one_shot: OneShot,
    model: nn.Module,
    batches: Sequence[Any],
    allocation: Allocation,
    reading: SearchReading,
    importance: str | Mapping[str, str] | None,
    options: Mapping[str, Any],
) -> dict[str, Pruner]:
    """Prune each kind of ``allocation`` its share of the parameters the search removes
    (:attr:`~tensorplay.ao.pruning.structured.units.search_reading.SearchReading.remove`), in
    :data:`SEARCH_ORDER`, each sized on the grids the kinds before it left (see the module)."""
    pruners: dict[str, Pruner] = {}
    share = Fraction(0)
    last = [kind for kind in SEARCH_ORDER if allocation.get(kind)][-1]
    for kind in SEARCH_ORDER:
        if not allocation.get(kind):
            continue
        share += allocation[kind]
        goal = reading.total - math.floor(share * reading.remove)
        groups = reading.graph.groups(kind)
        kept = read_kept_grid(model, reading.experts)
        groups = kept.live_groups(kind, groups)
        step = reading.hidden_step if kind == "hidden" else kept.expert_step(groups)
        per_group, size = kept.units_for(
            kind, groups, kept.count - goal, at_least=kind == last, step=step
        )
        if per_group == 0:
            continue
        if per_group >= size:
            raise ValueError(
                f"Expected {kind!r} to reach its share ({float(allocation[kind])}) keeping "
                f"some of the {size} units of each of its {len(groups)} groups, but it needs "
                f"{per_group} of each."
            )
        count = per_group * (1 if kind == "layer" else len(groups))
        exclude = [*(options.get("exclude") or ())]
        if kind != "hidden":  # the hidden group leaves those blocks out itself
            exclude += [rf"^{re.escape(block)}\." for block in kept.dropped]
        pruner = one_shot(
            model, batches, per_group / size,
            **{**options, "exclude": exclude or None},
            structure=kind, importance=kind_importance(importance, kind), scope="layerwise",
            make_permanent=False,
        )  # fmt: skip
        if pruner.pruned_count() != count:
            raise RuntimeError(
                f"Expected {count} {kind!r} units pruned, but the pruner pruned "
                f"{pruner.pruned_count()} of {pruner.total_count()}."
            )
        pruners[kind] = pruner
    return pruners


def kind_importance(importance: str | Mapping[str, str] | None, kind: str) -> str | None:
    """The score a search's ``importance`` names for ``kind``: its entry of a mapping, or the
    one name; ``None`` for the kind's own default.

    Example:
        >>> kind_importance({"hidden": "magnitude"}, "channel"), kind_importance("taylor", "head")
        (None, 'taylor')
    """
    return importance.get(kind) if isinstance(importance, Mapping) else importance


def _loss_fn(forward: Forward | None, batches: Sequence[Any]) -> Callable[[nn.Module, Any], Tensor]:
    """How a candidate is scored on one batch: ``forward``'s scalar loss, or the causal LM loss
    of a batch of ``input_ids``."""
    if forward is not None:
        return lambda model, batch: _scalar(forward(model, batch))
    if batches and all(isinstance(b, Tensor) and not b.is_floating_point() for b in batches):
        return lambda model, batch: _scalar(model(input_ids=batch, labels=batch))
    if not batches or not all(isinstance(b, Mapping) and "input_ids" in b for b in batches):
        raise TypeError(
            "Expected `forward=lambda model, batch: loss` with search=True, or batches of token "
            "ids (tensors, or mappings holding `input_ids`: a causal LM's loss on them scores "
            "the candidates), but got neither."
        )
    return lambda model, batch: _scalar(model(**batch, labels=_labels(batch)))


def _labels(batch: Mapping[str, Any]) -> Tensor:
    """The batch's ``input_ids`` as labels, ``-100`` (not scored) where its
    ``attention_mask`` marks padding."""
    labels: Tensor = batch["input_ids"]
    real = real_tokens(batch)
    return labels if real is None else labels.masked_fill(~real.to(labels.device), -100)


def _kl_fn(model: nn.Module, batches: Sequence[Any]) -> Callable[[nn.Module, Any], Tensor]:
    """How a candidate is scored on one batch with ``search_score="kl"``: the mean over real
    tokens (padding left out) of KL(dense || candidate) of the next-token distributions, the
    dense model's logits of every batch read now, once, and kept on the CPU."""
    call = _logits_call(batches)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            dense = {id(batch): call(model, batch).float().cpu() for batch in batches}
    finally:
        model.train(training)

    def divergence(candidate: nn.Module, batch: Any) -> Tensor:
        logits = call(candidate, batch).float()
        reference = dense[id(batch)].to(logits.device).log_softmax(-1)
        per_token = (reference.exp() * (reference - logits.log_softmax(-1))).sum(-1)
        real = real_tokens(batch)
        if real is None:
            return per_token.mean()
        if real.shape != per_token.shape:
            raise ValueError(
                f"Expected logits of one position per token of the batch's attention_mask "
                f"{tuple(real.shape)} with search_score='kl', but got {tuple(logits.shape)}: "
                "the padding's positions cannot be left out."
            )
        return per_token[real.to(per_token.device)].mean()  # the padding's positions left out

    return divergence


def _logits_call(batches: Sequence[Any]) -> Callable[[nn.Module, Any], Tensor]:
    """The logits of a causal LM on one batch: token ids, or a mapping of its inputs."""
    if batches and all(isinstance(b, Tensor) and not b.is_floating_point() for b in batches):
        return lambda model, batch: _logits(model(input_ids=batch))
    if batches and all(isinstance(b, Mapping) for b in batches):
        return lambda model, batch: _logits(model(**batch))
    raise TypeError(
        "Expected batches of token ids (tensors, or mappings of a causal LM's inputs) with "
        "search_score='kl' (the candidates' logits are compared with the dense model's), but "
        "got others."
    )


def _logits(output: Any) -> Tensor:
    value = getattr(output, "logits", output)
    if not isinstance(value, Tensor) or value.dim() < 2:
        raise TypeError(
            f"Expected logits (a tensor, or an output with `logits`) from the model with "
            f"search_score='kl', but got {type(output).__name__}."
        )
    return value


def _scalar(output: Any) -> Tensor:
    value = getattr(output, "loss", output)
    if not isinstance(value, Tensor) or value.numel() != 1:
        raise TypeError(
            f"Expected a scalar loss from the scoring forward, but got {type(output).__name__}."
        )
    return value


def _score(
    model: nn.Module, batches: Sequence[Any], loss: Callable[[nn.Module, Any], Tensor]
) -> float:
    """The mean loss of ``model`` over ``batches``, in evaluation mode, without gradients."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            values = [float(loss(model, batch)) for batch in batches]
    finally:
        model.train(training)
    return sum(values) / len(values)
