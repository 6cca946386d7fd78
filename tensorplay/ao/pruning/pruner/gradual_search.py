"""A training run that prunes to a searched mix of depth and widths: :class:`SearchedPruner`.

``prune_one_shot(..., search=True)`` chooses the mix of kinds under a budget and prunes it at
once (:mod:`~tensorplay.ao.pruning.pruner.search`). A run that prunes while it trains (and
distils, as Minitron recovers) chooses the mix the same way, once, when the pruner is built:
the same candidates, realized on the calibration batches, scored and taken back. Then:

* **Depth goes when the pruner is built**: the chosen candidate's number of layers, ranked on
  the batches as the search ranked them (a one-shot layer prune). The widths are planned in the
  blocks that remain, and a unit of a removed block would free nothing.
* **The widths follow the schedule**: one :class:`~tensorplay.ao.pruning.pruner.Pruner` per
  kind of width the candidate pruned (hidden, heads, channels, experts), in the blocks the
  depth left, each on a :class:`KindSchedule`: the schedule scaled to that kind's share of the
  units of each of its groups (``scope="layerwise"``: every group of a kind ends as wide, and
  the shrunk model loads with plain ``from_pretrained``). Which units go is decided step by
  step by each kind's importance, on the weights as training leaves them.

At the schedule's end every kind has pruned as many units as the chosen candidate, so
:func:`~tensorplay.ao.pruning.shrink` leaves the candidate's parameters and every budget is met.
At every step the masked model is one that ``shrink`` removes exactly.

The schedule gives the fraction of the way to the budget (a schedule without its own target,
such as ``CubicSchedule(end_step=...)``). A step asks every pruner whether it can step
(:meth:`~tensorplay.ao.pruning.pruner.Pruner.check_step`) before any of them does.

Example:
    >>> import sys; sys.path.insert(0, "tests")
    >>> import torch
    >>> from hf_models import tiny_llama
    >>> from tensorplay.ao.pruning import LinearSchedule, shrink
    >>> model = tiny_llama()
    >>> batches = [{"input_ids": torch.randint(3, 97, (2, 16))} for _ in range(2)]
    >>> pruner = SearchedPruner(model, LinearSchedule(end_step=2), batches, target_params=0.8,
    ...                         structure=("layer", "channel"), search_grid=2)
    >>> for step in range(3):
    ...     # ... forward, backward, optimizer.step() ...
    ...     _ = pruner.step()
    >>> pruner.kept_params() == pruner.chosen["params"]
    True
    >>> shrink(model).parameters_after == pruner.chosen["params"]
    True
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn
from torch.optim import Optimizer

from tensorplay.ao.pruning.calibration.batches import Forward
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.masking import MaskingMode
from tensorplay.ao.pruning.masking.stats import SparsityReport, TensorSparsity
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.config import check_int
from tensorplay.ao.pruning.pruner.one_shot import one_shot_importance, prune_one_shot
from tensorplay.ao.pruning.pruner.schedules import Schedule, schedule_from_dict
from tensorplay.ao.pruning.pruner.search import choose_mix, kind_importance
from tensorplay.ao.pruning.pruner.search_grid import (
    SEARCH_ORDER,
    SearchGrid,
    check_search,
    check_search_score,
)
from tensorplay.ao.pruning.structured.units.kept_grid import masked_blocks, read_kept_grid
from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
from tensorplay.ao.pruning.structured.units.measures import routed_experts
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget

__all__ = ["STATE_VERSION", "KindSchedule", "RunPruner", "SearchedPruner", "pruner_parts"]

STATE_VERSION = 1
"""The version of :meth:`SearchedPruner.state_dict`."""

_SET_BY_THE_SEARCH = ("scope", "structure", "sparsity", "make_permanent", "reconstruct", "search")


@dataclass(frozen=True)
class KindSchedule(Schedule):
    """One kind's part of a searched run: ``schedule`` (the fraction of the way to the budget,
    0 to 1) times ``share`` (the fraction of each of its groups' units the kind prunes by the
    end), on ``schedule``'s pruning steps.

    Args:
        schedule: A schedule without its own target, or its :meth:`to_dict` form.
        share: The kind's final fraction of units, in [0, 1).

    Raises:
        ValueError: A ``schedule`` with its own target, or a ``share`` outside [0, 1).

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
        >>> part = KindSchedule(LinearSchedule(end_step=4), 0.5)
        >>> [part(step) for step in range(5)], part.should_prune(2)
        ([0.0, 0.125, 0.25, 0.375, 0.5], True)
    """

    schedule: Schedule
    share: float

    def __post_init__(self) -> None:
        if isinstance(self.schedule, Mapping):  # as init_args wrote it
            object.__setattr__(self, "schedule", schedule_from_dict(self.schedule))
        check_schedule(self.schedule)
        if not 0.0 <= self.share < 1.0:
            raise ValueError(f"Expected `share` in [0, 1), but got {self.share!r}.")

    def __call__(self, step: int) -> float:
        return self.share * self.schedule(step)

    def should_prune(self, step: int) -> bool:
        return self.schedule.should_prune(step)

    def latest_pruning_step(self, after: int, until: int) -> int | None:
        return self.schedule.latest_pruning_step(after, until)

    def init_args(self) -> dict[str, Any]:
        return {"schedule": self.schedule.to_dict(), "share": self.share}


def check_schedule(schedule: object) -> Schedule:
    """``schedule``, checked to give the fraction of the way to a budget.

    Raises:
        TypeError: Not a :class:`~tensorplay.ao.pruning.pruner.schedules.Schedule`.
        ValueError: A schedule with its own target (``final_sparsity``, ``sparsity``).

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import CubicSchedule
        >>> check_schedule(CubicSchedule(end_step=10)).has_target()
        False
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"Expected `schedule` to be a Schedule, but got {schedule!r}.")
    if schedule.has_target():
        raise ValueError(
            "Expected a schedule without its own target (the fraction of the way to the "
            f"budget, e.g. CubicSchedule(end_step=...)) for a searched run, but got {schedule!r}:"
            " the budget sets where the run ends."
        )
    return schedule


class SearchedPruner:
    """Prune to the mix of depth and widths a search chose under a budget, as training goes
    (see the module).

    Args:
        model: The model to prune, dense.
        schedule: The fraction of the way to the budget at each step (a schedule without its
            own target).
        batches: The calibration batches the candidates are realized and scored on (read into
            a list).
        structure: The kinds whose mix is searched: a tuple of at least two of ``"layer"``,
            ``"hidden"``, ``"head"``, ``"channel"``, ``"expert"``.
        target_params: The budgets, as in :func:`~tensorplay.ao.pruning.prune_one_shot`; at
            least one.
        target_active_params: See ``target_params``.
        target_memory: See ``target_params``.
        target_latency: See ``target_params``.
        importance: A score's name, or a mapping from kind to name; a kind without one is
            ranked by the score :func:`~tensorplay.ao.pruning.prune_one_shot` gives it (Wanda;
            activations for hidden channels; REAP for experts), in the search and in training.
        forward: How a batch runs through the model; it must return a scalar loss unless the
            batches are mappings holding ``input_ids`` (a causal LM's loss scores them).
        search_grid: The allocations searched, as in ``prune_one_shot`` (default 4).
        search_score: ``"loss"`` or ``"kl"``, as in ``prune_one_shot``.
        allocation: Instead of a search, the mix to prune to (each kind's share of the
            parameters the budget removes, as a row's ``allocation``): it is realized and
            scored once, and must meet every budget. A resumed run passes its state's.
        **options: Any other argument of :class:`~tensorplay.ao.pruning.pruner.Pruner`
            (``seed``, ``exclude``, ``optimizers``...), given to every kind's pruner;
            ``scope`` is ``"layerwise"`` for every kind, and the masks are reparametrized.

    Raises:
        TypeError, ValueError: As :func:`~tensorplay.ao.pruning.prune_one_shot` with
            ``search=True`` (no candidate meets every budget: naming the closest); a schedule
            with its own target; an option the search sets; ``masking="inplace"``. All before
            anything changes.

    Example:
        >>> import sys; sys.path.insert(0, "tests")
        >>> import torch
        >>> from hf_models import tiny_llama
        >>> from tensorplay.ao.pruning import CubicSchedule
        >>> batches = [{"input_ids": torch.randint(3, 97, (2, 16))} for _ in range(2)]
        >>> pruner = SearchedPruner(tiny_llama(), CubicSchedule(end_step=8), batches,
        ...                         target_params=0.75, structure=("hidden", "channel"),
        ...                         search_grid=[{"hidden": 0.5, "channel": 0.5}])
        >>> for row in pruner.search_report():  # each kind alone is a candidate too
        ...     print(row["allocation"])
        {'hidden': 0.5, 'channel': 0.5}
        {'hidden': 1.0, 'channel': 0.0}
        {'hidden': 0.0, 'channel': 1.0}
        >>> sorted(pruner.pruners) == sorted(k for k, n in pruner.chosen["units"].items() if n)
        True
    """

    @changes.atomic
    def __init__(
        self,
        model: nn.Module,
        schedule: Schedule,
        batches: Iterable[Any],
        *,
        structure: tuple[str, ...],
        target_params: int | float | None = None,
        target_active_params: int | float | None = None,
        target_memory: MemoryBudget | None = None,
        target_latency: LatencyBudget | None = None,
        importance: str | Mapping[str, str] | None = None,
        forward: Forward | None = None,
        search_grid: SearchGrid | None = None,
        search_score: Literal["loss", "kl"] = "loss",
        allocation: Mapping[str, float] | None = None,
        **options: Any,
    ) -> None:
        self.schedule = check_schedule(schedule)
        _check_options(options, search_score)
        budgets = {
            "target_params": target_params,
            "target_active_params": target_active_params,
            "target_memory": target_memory,
            "target_latency": target_latency,
        }
        kinds, allocations = check_search(structure, budgets, search_grid, importance, allocation)
        data = list(batches)
        self.model = model
        self._choice = choose_mix(
            prune_one_shot, model, data, kinds, allocations, budgets=budgets,
            importance=importance, forward=forward, options=options, score=search_score,
        )  # fmt: skip
        shares = self._choice.shares
        self.pruners: dict[str, Pruner] = {}
        if "layer" in shares:
            self.pruners["layer"] = self._drop_layers(
                data, shares["layer"], importance, forward, options
            )
        self.dropped = masked_blocks(model)
        self._steps = -1  # the last step taken, while no width has a pruner to count it
        exclude = [*(options.get("exclude") or ())]
        exclude += [rf"^{re.escape(block)}\." for block in self.dropped]
        for kind in SEARCH_ORDER:
            if kind in shares and kind != "layer":
                score = kind_importance(importance, kind) or one_shot_importance(kind, model)
                self.pruners[kind] = Pruner(
                    model, KindSchedule(schedule, shares[kind]), structure=kind,  # type: ignore[arg-type]
                    importance=score, scope="layerwise", **{**options, "exclude": exclude or None},
                )  # fmt: skip

    def _drop_layers(
        self,
        batches: list[Any],
        share: float,
        importance: str | Mapping[str, str] | None,
        forward: Forward | None,
        options: Mapping[str, Any],
    ) -> Pruner:
        """The chosen candidate's layers pruned now, as the search pruned them."""
        pruner = prune_one_shot(
            self.model, batches, share, structure="layer", scope="layerwise",
            importance=kind_importance(importance, "layer"),
            forward=forward, make_permanent=False, **options,
        )  # fmt: skip
        expected = self.chosen["units"]["layer"]
        if pruner.pruned_count() != expected:
            raise RuntimeError(
                f"Expected the {expected} layers the search pruned to be pruned again, but "
                f"{pruner.pruned_count()} were: the model or the batches changed under it."
            )
        return pruner

    @property
    def chosen(self) -> dict[str, Any]:
        """The chosen candidate's row of :meth:`search_report`."""
        return next(dict(row) for row in self._choice.rows if row["chosen"])

    @property
    def allocation(self) -> dict[str, float]:
        """The chosen allocation: each kind's share of the parameters the budget removes."""
        return {kind: float(share) for kind, share in self._choice.allocation.items()}

    @property
    def shares(self) -> dict[str, float]:
        """Each kind's fraction of the units of each of its groups pruned by the schedule's end
        (for ``"layer"``: of the blocks, pruned when the pruner was built)."""
        return dict(self._choice.shares)

    def search_report(self) -> list[dict[str, Any]]:
        """One plain dict per candidate, as
        :meth:`~tensorplay.ao.pruning.pruner.search.SearchResult.search_report`."""
        return [dict(row) for row in self._choice.rows]

    @property
    def last_step(self) -> int:
        """The last step taken (-1 before the first)."""
        return min((pruner.last_step for pruner in self._widths.values()), default=self._steps)

    @property
    def history(self) -> list[tuple[int, str, int]]:
        """``(step, kind, units pruned)`` of each step that pruned units of a kind, in order."""
        found = [
            (step, kind, pruned)
            for kind, pruner in self._widths.items()
            for step, _, pruned in pruner.history
        ]
        return sorted(found, key=lambda entry: (entry[0], SEARCH_ORDER.index(entry[1])))

    @property
    def _widths(self) -> dict[str, Pruner]:
        return {kind: pruner for kind, pruner in self.pruners.items() if kind != "layer"}

    @changes.atomic
    def step(self, step: int | None = None) -> int:
        """Step every kind's pruner (see :meth:`~tensorplay.ao.pruning.pruner.Pruner.step`),
        once each has said it can: every kind prunes, on the weights as they are, before any
        takes its step (and rewinds, with ``rewind``).

        Returns:
            The units newly pruned, over the kinds.

        Raises:
            As :meth:`~tensorplay.ao.pruning.pruner.Pruner.step`. A refusal, also one that comes
            while a kind ranks its scores, leaves every kind's pruner and the model as they
            were.
        """
        widths = self._widths.values()
        if not widths:  # the depth alone, pruned when built: the steps count the way
            self._steps = self._steps + 1 if step is None else check_int("step", step, 0)
            return 0
        taken = {pruner.check_step(step) for pruner in widths}
        if len(taken) > 1:
            raise RuntimeError(
                f"Expected the kinds' pruners to be at one step, but they would take {taken}: "
                "one of them was stepped on its own."
            )
        # Every kind prunes before any takes its step: a kind whose scores its method rejects
        # then leaves the kinds before it unstepped (the transaction puts their masks back).
        pruned = [pruner.prune_step(step) for pruner in widths]
        return sum(part.finish() for part in pruned)

    def accumulate(self, optimizer: Optimizer | None = None) -> int:
        """Add the current gradients to every kind's importance (see
        :meth:`~tensorplay.ao.pruning.pruner.Pruner.accumulate`): once per optimizer step,
        before ``optimizer.step()``, for scores that read gradients (Taylor, movement).

        Returns:
            The number of targets that had a gradient, over the kinds.
        """
        return sum(pruner.accumulate(optimizer) for pruner in self._widths.values())

    def kept_params(self) -> int:
        """The parameters :func:`~tensorplay.ao.pruning.shrink` would leave now (the
        chosen row's ``params`` once the schedule has ended)."""
        return read_kept_grid(self.model, tuple(routed_experts(self.model))).count

    def reports(self) -> dict[str, SparsityReport]:
        """Each kind's :meth:`~tensorplay.ao.pruning.pruner.Pruner.report`, by kind."""
        return {kind: pruner.report() for kind, pruner in self.pruners.items()}

    def report(self) -> SparsityReport:
        """Every kind's groups in one table (a row per group, named ``<kind>/<group>``, counting
        its units; the layers removed when the pruner was built among them), against no target:
        the budget counts parameters (:meth:`kept_params` says where the model stands)."""
        rows = tuple(
            TensorSparsity(f"{kind}/{row.name}", row.shape, row.numel, row.pruned)
            for kind, report in self.reports().items()
            for row in report.rows
        )
        return SparsityReport(rows, None, "group")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds the chosen candidate prunes, in the order pruned."""
        return tuple(self.pruners)

    def target_sparsity(self, step: int | None = None) -> float:
        """The fraction of the way to the budget at ``step`` (default: the last step taken):
        the schedule's value, as a budgeted :class:`~tensorplay.ao.pruning.pruner.Pruner`
        reports it."""
        return self.schedule(self.last_step if step is None else step)

    @property
    def permanent(self) -> bool:
        """Whether :meth:`make_permanent` has been called."""
        return all(pruner.permanent for pruner in self.pruners.values())

    @property
    def mode(self) -> MaskingMode:
        """How the masks are held: the reparametrization, for every kind."""
        return next(iter(self.pruners.values())).mode

    @property
    def optimizers(self) -> list[Optimizer]:
        """Optimizers whose state every kind's pruner clears after each of its pruning steps
        that pruned something (see :attr:`~tensorplay.ao.pruning.pruner.Pruner.optimizers`)."""
        return next(iter(self._widths.values())).optimizers if self._widths else []

    @optimizers.setter
    def optimizers(self, optimizers: Sequence[Optimizer]) -> None:
        for pruner in self._widths.values():
            pruner.optimizers = optimizers

    def held_by(self, optimizer: Optimizer) -> list[str]:
        """The targets of any kind whose parameter ``optimizer`` holds (see
        :meth:`~tensorplay.ao.pruning.pruner.Pruner.held_by`), each once."""
        found = (name for pruner in self.pruners.values() for name in pruner.held_by(optimizer))
        return list(dict.fromkeys(found))

    def mask_gradients(self) -> None:
        """Zero the pruned entries of every kind's gradients now (see
        :meth:`~tensorplay.ao.pruning.pruner.Pruner.mask_gradients`)."""
        for pruner in self.pruners.values():
            pruner.mask_gradients()

    @changes.atomic
    def reparametrize(self) -> None:
        """Give every target of every kind an all-kept mask where it has none, so that a
        checkpoint of a later step loads strictly (see
        :meth:`~tensorplay.ao.pruning.pruner.Pruner.reparametrize`)."""
        for pruner in self.pruners.values():
            pruner.reparametrize()

    @changes.atomic
    def make_permanent(self) -> None:
        """Drop every kind's masks, keeping the zeros (see
        :meth:`~tensorplay.ao.pruning.pruner.Pruner.make_permanent`)."""
        for pruner in self.pruners.values():
            pruner.make_permanent()

    def state_dict(self) -> dict[str, Any]:
        """The run's state: ``version``, the chosen ``allocation``, ``shares`` and ``dropped``
        blocks, the ``search_report``, each width kind's pruner state under ``pruners`` and the
        ``last_step``. With the model's state_dict it resumes the run exactly
        (:meth:`load_state_dict`)."""
        return {
            "version": STATE_VERSION,
            "allocation": self.allocation,
            "shares": self.shares,
            "dropped": list(self.dropped),
            "search_report": self.search_report(),
            "pruners": {kind: pruner.state_dict() for kind, pruner in self._widths.items()},
            "last_step": self.last_step,
        }

    @changes.atomic
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take up a run from its :meth:`state_dict`: this pruner, built on the dense model
        with the same arguments (``allocation=state["allocation"]`` in place of the search), must
        have chosen what the state's run chose. Load the model's state_dict (after
        :meth:`reparametrize`) as well.

        Raises:
            ValueError: A state of another version, or one whose search chose another
                allocation, other shares or other blocks (naming both; build the pruner with
                ``allocation=state["allocation"]``); before anything changes.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"Expected a SearchedPruner state of version {STATE_VERSION}, but got version "
                f"{state.get('version')!r}."
            )
        mine = {"allocation": self.allocation, "shares": self.shares, "dropped": self.dropped}
        for key, value in mine.items():
            if state[key] != value:
                raise ValueError(
                    f"Expected the state's search to have chosen this pruner's {key} {value}, "
                    f"but it chose {state[key]}: build the pruner on the dense model the run "
                    f"started from, with allocation={state['allocation']}."
                )
        pruners = state["pruners"]
        if set(pruners) != set(self._widths):
            raise ValueError(
                f"Expected a state of the kinds {sorted(self._widths)}, but got {sorted(pruners)}."
            )
        before = {kind: pruner.state_dict() for kind, pruner in self._widths.items()}
        loaded: list[str] = []
        try:
            for kind, pruner in self._widths.items():
                pruner.load_state_dict(pruners[kind])
                loaded.append(kind)
        except BaseException:
            for kind in loaded:  # a kind refused: the kinds loaded before it go back
                self._widths[kind].load_state_dict(before[kind])
            raise
        self._steps = int(state.get("last_step", -1))


RunPruner = Pruner | SearchedPruner
"""A pruner a training run steps: one structure's, or a searched mix's."""


def pruner_parts(pruner: RunPruner) -> list[Pruner]:
    """The :class:`~tensorplay.ao.pruning.pruner.Pruner` objects that hold ``pruner``'s masks:
    itself, or a searched run's pruner of each kind (the layers' included).

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> pruner = Pruner(nn.Linear(2, 2), OneShotSchedule(0.5))
        >>> pruner_parts(pruner) == [pruner]
        True
    """
    return list(pruner.pruners.values()) if isinstance(pruner, SearchedPruner) else [pruner]


def _check_options(options: Mapping[str, Any], score: object) -> None:
    """Refuse the options a searched run sets itself, and an unknown ``search_score``."""
    clash = [name for name in _SET_BY_THE_SEARCH if name in options]
    if clash:
        raise ValueError(
            f"Expected no {clash} with a searched run: it prunes every kind layerwise, to the "
            "shares the search chose."
        )
    if options.get("masking", "reparametrize") != "reparametrize":
        raise ValueError(
            f"Expected masking='reparametrize' with a searched run, but got "
            f"{options['masking']!r}: the layers it removes when built are held out of "
            "training by their masks in the forward, which lean masks do not do."
        )
    check_search_score(score)
