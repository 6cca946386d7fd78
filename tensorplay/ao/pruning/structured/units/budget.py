"""Pruning to a parameter budget: which units go so that the model lands at a size.

``target_params=`` (:class:`~tensorplay.ao.pruning.pruner.Pruner`,
:func:`~tensorplay.ao.pruning.pruner.one_shot.prune_one_shot`) asks for the number of parameters the
model has after :func:`~tensorplay.ao.pruning.structured.shrinking.shrink.shrink`, not for a
fraction of units. This module holds the arithmetic, pure functions of unit scores and unit sizes:

* **A unit's parameters** (:func:`unit_params`): the elements of every slice it spans, ``width``
  indices along ``dim`` of each sliced parameter, a whole tensor for ``dim=None``; a parameter
  reached through several names (tied) counts once.
* **The ranking** (:func:`budget_keys`): the unit scores are standardised within each kind
  (mean 0, standard deviation 1 over the units still kept; FLAP's normalisation, so an attention
  head's score and an FFN channel's compare), then divided by the unit's parameters: the lowest
  *score per parameter removed* goes first. Within one group every unit has the same size, so
  the group's own order (lowest score first) is kept, and the selection engine prunes them.
* **Globally** (:func:`plan_global`): units are taken in that order, each group keeping its
  floor, until the parameters removed reach what the budget asks; the model then lands at most
  at the budget and within the last unit's parameters of it.
* **Per layer** (:func:`plan_layerwise`): every group of one kind keeps the same width, so
  plain ``from_pretrained`` loads the shrunk model; among the widths that fit the budget within
  one unit per layer, the one keeping the most standardised score wins.

Example:
    >>> import torch
    >>> keys = [torch.tensor([0.1, 0.5, 0.2]), torch.tensor([0.3, 0.05])]
    >>> plan_global(keys, [10, 30], [2, 1], need=35)  # 0.05 (30), then 0.1 (10)
    [1, 1]
    >>> resolve_budget(0.5, 1000), resolve_budget(600, 1000)
    (500, 600)
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup

__all__ = [
    "budget_keys",
    "check_reachable",
    "check_target_params",
    "model_params",
    "plan_global",
    "plan_global_all",
    "plan_layerwise",
    "plan_layerwise_all",
    "resolve_budget",
    "unit_params",
]


def model_params(model: nn.Module) -> int:
    """Every parameter of ``model``, tied ones once.

    Example:
        >>> model_params(nn.Linear(3, 2))
        8
    """
    return sum(param.numel() for param in model.parameters())


def check_target_params(target_params: object, option: str = "target_params") -> int | float:
    """``target_params`` (or the budget ``option``) checked as a budget needs no model to check
    it: an int (parameters kept) or a float in (0, 1] (a fraction of the model's parameters).

    Raises:
        TypeError: Neither an int nor a float.
        ValueError: An int below 1 or a float outside (0, 1].

    Example:
        >>> check_target_params(0.8), check_target_params(1000)
        (0.8, 1000)
        >>> check_target_params(-3, "target_active_params")
        Traceback (most recent call last):
        ...
        ValueError: Expected `target_active_params` to be a positive int, but got -3.
    """
    if isinstance(target_params, bool) or not isinstance(target_params, (int, float)):
        raise TypeError(
            f"Expected `{option}` to be an int (parameters) or a float in (0, 1], but got "
            f"{target_params!r}."
        )
    if isinstance(target_params, int) and target_params < 1:
        raise ValueError(f"Expected `{option}` to be a positive int, but got {target_params}.")
    if isinstance(target_params, float) and not 0.0 < target_params <= 1.0:
        raise ValueError(
            f"Expected `{option}` as a float to be in (0, 1], but got {target_params}."
        )
    return target_params


def resolve_budget(
    target_params: int | float, total: int, option: str = "target_params", what: str = "parameters"
) -> int:
    """The budget in parameters (or the ``what`` of the budget ``option``): an int as given, a
    float in (0, 1] as that fraction of ``total`` (rounded down).

    Raises:
        TypeError, ValueError: As :func:`check_target_params`; also an int above ``total``
            (the model is that small already: nothing would be pruned), naming both.

    Example:
        >>> resolve_budget(0.8, 29472)
        23577
        >>> resolve_budget(30000, 29472)
        Traceback (most recent call last):
        ...
        ValueError: Expected `target_params` (the parameters the model keeps) to be at most the model's 29472 parameters, but got 30000: nothing would be pruned.
    """  # noqa: E501
    value = check_target_params(target_params) if option == "target_params" else target_params
    if isinstance(value, float):
        return int(value * total)
    if value > total:
        raise ValueError(
            f"Expected `{option}` (the {what} the model keeps) to be at most the "
            f"model's {total} {what}, but got {value}: nothing would be pruned."
        )
    return value


def unit_params(
    group: UnitGroup, shapes: Mapping[str, torch.Size], aliases: Mapping[str, str]
) -> int:
    """The parameters one unit of ``group`` spans (``aliases``: each name to one name of its
    parameter, so a tied parameter's slice counts once).

    Example:
        >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
        >>> group = UnitGroup("fc", "channel", 4, (Slice("a.weight", 0), Slice("b.weight", 1)))
        >>> shapes = {"a.weight": torch.Size([4, 3]), "b.weight": torch.Size([2, 4])}
        >>> unit_params(group, shapes, {})
        5
        >>> experts = UnitGroup("e[1]", "channel", 4, (Slice("up", 1, expert=1),
        ...                                            Slice("down", 2, expert=1)))
        >>> unit_params(experts, {"up": torch.Size([2, 4, 3]), "down": torch.Size([2, 3, 4])}, {})
        6
    """
    seen: set[tuple[str, int | None, int, int | None]] = set()
    count = 0
    for piece in group.slices:
        key = (aliases.get(piece.parameter, piece.parameter), piece.dim, piece.offset, piece.expert)
        if key in seen:
            continue
        seen.add(key)
        shape = shapes[piece.parameter]
        numel = shape.numel() // (shape[0] if piece.expert is not None else 1)  # one expert's
        count += numel if piece.dim is None else numel // shape[piece.dim] * piece.width
    return count


def budget_keys(
    scores: Sequence[Tensor], kinds: Sequence[str], params: Sequence[int]
) -> list[Tensor]:
    """Per group, each unit's key: its score standardised over the units of its kind, divided
    by its parameters (lowest first). A kind whose scores are all equal standardises to 0.

    Example:
        >>> keys = budget_keys([torch.tensor([1.0, 3.0]), torch.tensor([5.0])],
        ...                    ["channel", "head"], [2, 10])
        >>> [key.tolist() for key in keys]
        [[-0.5, 0.5], [0.0]]
    """
    by_kind: dict[str, list[Tensor]] = {}
    for score, kind in zip(scores, kinds, strict=True):
        by_kind.setdefault(kind, []).append(score.to(torch.float64))
    moments: dict[str, tuple[float, float]] = {}
    for kind, found in by_kind.items():
        joined = torch.cat(found)
        spread = float(joined.std(unbiased=False)) if joined.numel() > 1 else 0.0
        moments[kind] = (float(joined.mean()), spread if spread > 0 else 1.0)
    keys = []
    for score, kind, size in zip(scores, kinds, params, strict=True):
        mean, spread = moments[kind]
        keys.append((score.to(torch.float64) - mean) / spread / size)
    return keys


def plan_global(
    keys: Sequence[Tensor], params: Sequence[int], limits: Sequence[int], need: int
) -> list[int]:
    """Per group, the units to prune: lowest key first across all groups, at most ``limits[i]``
    from group ``i`` (its lowest), until their parameters reach ``need`` (all allowed if they
    cannot). Ties go to the earlier group, then the earlier unit.

    Example:
        >>> plan_global([torch.tensor([0.0, 1.0])], [4], [2], need=5)
        [2]
    """
    return plan_global_all(keys, [(size,) for size in params], limits, (need,))


def plan_global_all(
    keys: Sequence[Tensor],
    costs: Sequence[Sequence[int]],
    limits: Sequence[int],
    needs: Sequence[int],
) -> list[int]:
    """As :func:`plan_global` for several budgets at once: ``costs[i][b]`` is what one unit of
    group ``i`` frees of budget ``b`` (at least 0), and units go, lowest key first, until every
    budget ``b`` has freed ``needs[b]``; the last unit taken is the first no longer needed
    by any budget.

    Example:
        >>> keys = [torch.tensor([0.0, 1.0]), torch.tensor([0.5])]
        >>> plan_global_all(keys, [(4, 0), (1, 6)], [2, 1], needs=(3, 5))  # 0.0 (4, 0), 0.5 (1, 6)
        [1, 1]
    """
    if all(need <= 0 for need in needs):
        return [0] * len(keys)
    eligible, owners = [], []
    for index, (key, limit) in enumerate(zip(keys, limits, strict=True)):
        lowest = torch.sort(key, stable=True).values[:limit]
        eligible.append(lowest)
        owners.append(torch.full((lowest.numel(),), index, dtype=torch.int64))
    order = torch.sort(torch.cat(eligible), stable=True).indices
    owner = torch.cat(owners)[order]
    table = torch.tensor([list(cost) for cost in costs], dtype=torch.int64).reshape(
        len(keys), len(needs)
    )
    taken = torch.cumsum(table[owner], dim=0)
    reach = 0
    for column, need in enumerate(needs):
        if need > 0:
            found = torch.searchsorted(taken[:, column].contiguous(), torch.tensor([need]))
            reach = max(reach, int(found[0]) + 1)
    chosen = owner[: min(reach, order.numel())]
    return torch.bincount(chosen, minlength=len(keys)).tolist()


def plan_layerwise(
    kinds: Sequence[str],
    sizes: Sequence[int],
    params: Sequence[int],
    floors: Sequence[int],
    kept_scores: Sequence[Tensor],
    need: int,
    steps: Sequence[int] | None = None,
) -> dict[str, int]:
    """The width every group of each kind keeps (``sizes``, ``params``, ``floors``: per kind,
    the units each group keeps now, one unit's parameters, the fewest it must keep;
    ``kept_scores``: per kind, ``groups x kept`` standardised scores): the widths whose
    removed parameters reach ``need`` by the least excess (within one unit per group of the
    finest kind where any does), the most kept score among those. ``steps``: per kind, the
    multiple a kept width must be (or the whole ``size``): a routed expert's channels keep a
    16-byte multiple (``expert_width_step`` of
    :mod:`~tensorplay.ao.pruning.structured.dependency.unit_groups`); 1 by default.

    Example:
        >>> plan_layerwise(["channel", "head"], [4, 2], [10, 30], [1, 1],
        ...                [torch.ones(2, 4), torch.zeros(2, 2)], need=60)
        {'channel': 4, 'head': 1}
    """
    costs = [(cost,) for cost in params]
    return plan_layerwise_all(kinds, sizes, costs, floors, kept_scores, (need,), steps)


def plan_layerwise_all(
    kinds: Sequence[str],
    sizes: Sequence[int],
    costs: Sequence[Sequence[int]],
    floors: Sequence[int],
    kept_scores: Sequence[Tensor],
    needs: Sequence[int],
    steps: Sequence[int] | None = None,
) -> dict[str, int]:
    """As :func:`plan_layerwise` for several budgets at once (``costs``: per kind, one unit's
    cost in each budget; ``needs``: what each budget asks freed): the widths that free every
    ``needs[b]``; among them those within one unit per group of the finest kind of some budget
    (else the least excess, relative to that unit), the most kept score among those.

    Example:
        >>> plan_layerwise_all(["channel", "head"], [4, 2], [(10, 0), (30, 5)], [1, 1],
        ...                    [torch.ones(2, 4), torch.zeros(2, 2)], needs=(80, 10))
        {'channel': 3, 'head': 1}
    """
    groups = [int(scores.shape[0]) for scores in kept_scores]
    best = [
        torch.cat([torch.zeros(1, dtype=torch.float64), scores.sort(dim=1, descending=True)
                   .values.sum(dim=0).to(torch.float64).cumsum(0)])
        for scores in kept_scores
    ]  # fmt: skip
    budgets = range(len(needs))
    slacks = [
        min((count * cost[b] for count, cost in zip(groups, costs, strict=True) if cost[b] > 0),
            default=0)
        for b in budgets
    ]  # fmt: skip
    found: tuple[float, float, tuple[int, ...]] | None = None
    steps = [1] * len(sizes) if steps is None else steps
    ranges = [
        [width for width in range(floor, size + 1) if width % step == 0 or width == size]
        for floor, size, step in zip(floors, sizes, steps, strict=True)
    ]
    asked = [b for b in budgets if needs[b] > 0]
    for widths in itertools.product(*ranges):
        removed = [
            sum(
                (size - width) * count * cost[b]
                for size, width, count, cost in zip(sizes, widths, groups, costs, strict=True)
            )
            for b in budgets
        ]
        if any(removed[b] < needs[b] for b in budgets):
            continue
        excess = [removed[b] - needs[b] for b in asked]
        if len(needs) == 1:  # one budget: its excess itself
            tight = excess[0] < slacks[0]
            over = float(excess[0])
        else:
            tight = any(e < slacks[b] for e, b in zip(excess, asked, strict=True))
            over = min((e / max(slacks[b], 1) for e, b in zip(excess, asked, strict=True)),
                       default=0.0)  # fmt: skip
        kept = sum(float(total[width]) for total, width in zip(best, widths, strict=True))
        rank = (0.0 if tight else over, -kept, widths)
        if found is None or rank < found:
            found = rank
    if found is None:  # the least each kind can keep
        return dict(zip(kinds, [candidates[0] for candidates in ranges], strict=True))
    return dict(zip(kinds, found[2], strict=True))


def check_reachable(
    budget: int,
    total: int,
    removable: int,
    cost_floor: str,
    option: str = "target_params",
    scale: int = 1,
    *,
    as_fraction: bool = False,
) -> None:
    """Refuse a budget below the smallest size the floors allow, before anything changes
    (``budget``, ``total``, ``removable``: counts of the budget ``option`` times ``scale``;
    ``as_fraction``: the message gives sizes as fractions of ``total``, as ``target_latency``
    is given).

    Raises:
        ValueError: Naming the budget and the smallest reachable size.

    Example:
        >>> check_reachable(900, 1000, 200, "at least one unit per group")
        >>> check_reachable(700, 1000, 200, "one unit per group")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: Expected `target_params` to be at least 800, the smallest size ...
    """
    if budget < total - removable and as_fraction:
        raise ValueError(
            f"Expected `{option}` to be at least {(total - removable) / total:.4f} (of the "
            f"dense model's), the smallest reachable ({cost_floor}), but got "
            f"{budget / total:.4f}."
        )
    if budget < total - removable:
        least = -(-(total - removable) // scale)
        raise ValueError(
            f"Expected `{option}` to be at least {least}, the smallest size "
            f"reachable ({cost_floor}), but got {budget // scale}."
        )
