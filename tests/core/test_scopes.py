"""The scopes on their own: counts over any unit space, not only the element structure.

``ScoreLists`` is a complete unit space of plain Python scores (one group per list, one unit per
score, pruned lowest first): what a structure of channels or heads hands the scopes. The
scopes must prune it exactly as they prune weights, and the row scope must refuse it.
"""

from __future__ import annotations

import typing
import warnings
from collections.abc import Sequence

import pytest

from tensorplay.ao.pruning.parity.amount import compute_nparams_to_prune
from tensorplay.ao.pruning.pruner.config import Scope
from tensorplay.ao.pruning.pruner.scopes import SCOPES, RowSpace, UnitSpace, make_scope


class ScoreLists:
    """Groups of scores; pruning marks the lowest unpruned ones."""

    def __init__(self, groups: dict[str, list[float]]) -> None:
        self.names = list(groups)
        self.collapse_share = 0.0
        self.has_floors = False  # a group may be emptied
        self._scores = [list(scores) for scores in groups.values()]
        self._kept = [[True] * len(scores) for scores in self._scores]

    def numels(self) -> list[int]:
        return [len(scores) for scores in self._scores]

    def pruned(self) -> list[int]:
        return [kept.count(False) for kept in self._kept]

    def check_reach(
        self, count: int, groups: Sequence[int] | None = None, caps: Sequence[int] | None = None
    ) -> None:
        pass  # nothing to refuse: no group keeps a floor

    def prune(
        self, count: int, groups: Sequence[int] | None = None, caps: Sequence[int] | None = None
    ) -> None:
        chosen = list(range(len(self._scores))) if groups is None else list(groups)
        left = dict(zip(chosen, caps, strict=True)) if caps is not None else None
        units = sorted(
            (score, group, unit)
            for group in chosen
            for unit, score in enumerate(self._scores[group])
            if self._kept[group][unit]
        )
        for _, group, unit in units:
            if count == 0:
                return
            if left is not None:
                if left[group] == 0:
                    continue
                left[group] -= 1
            self._kept[group][unit] = False
            count -= 1

    def kept(self) -> list[list[bool]]:
        return self._kept


def space() -> ScoreLists:
    return ScoreLists({"big": [0.5, 0.9, 0.1, 0.7, 0.3, 0.8], "small": [0.2, 0.05]})


def test_the_scope_literal_names_every_registered_scope() -> None:
    assert list(typing.get_args(Scope)) == list(SCOPES)


def test_a_list_space_is_a_unit_space_without_rows() -> None:
    assert isinstance(space(), UnitSpace) and not isinstance(space(), RowSpace)


def test_global_ranks_every_unit_together_to_the_exact_count() -> None:
    units = space()
    with pytest.warns(UserWarning, match="'small' is 100% pruned"):
        assert make_scope("global", 0.0).prune_to(units, 0.5, step=0) == 4
    assert units.kept() == [[True, True, False, True, False, True], [False, False]]


def test_global_within_min_density_takes_the_rest_from_the_others() -> None:
    units = space()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no group left empty: no collapse warning
        assert make_scope("global", 0.5).prune_to(units, 0.5, step=0) == 4
    assert units.pruned() == [3, 1]
    assert units.kept()[1] == [True, False]


def test_global_warns_once_naming_a_group_it_empties() -> None:
    units = space()
    scope = make_scope("global", 0.0)
    scope.prune_to(units, 0.25, step=2)  # 0.05 and 0.1: 'small' keeps one
    with pytest.warns(UserWarning, match=r"step 3 pruned all 2 units of 'small'.*100% pruned"):
        scope.prune_to(units, 0.5, step=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # emptied before: no second warning
        scope.prune_to(units, 0.75, step=4)


@pytest.mark.parametrize("target", [0.25, 0.5, 0.9])
def test_layerwise_prunes_each_group_to_its_own_count(target: float) -> None:
    units = space()
    make_scope("layerwise", 0.0).prune_to(units, target, step=0)
    assert units.pruned() == [compute_nparams_to_prune(target, n) for n in units.numels()]


def test_the_row_scope_refuses_a_space_without_rows() -> None:
    with pytest.raises(ValueError, match="scope='row', but got ScoreLists, which has none"):
        make_scope("row", 0.0).prune_to(space(), 0.5, step=0)


def test_an_unknown_scope_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'global', 'layerwise' or 'row', but got 'local'"):
        make_scope("local", 0.0)
