"""Nothing left out silently: the selected tensors that no unit of a structure spans.

A structure of channels, heads or layers prunes only the tensors its units span; a tensor the
selection chose (by default every Linear and Conv weight) that no taking part group of the
chosen kind spans, in a scored or an unscored slice, stays dense. :func:`uncovered` names each
such tensor once, when the pruner is built, with why where known:

* its group of the chosen kind does not take part, because the selection leaves out another
  tensor the group is scored by;
* in a traced model, its output channels cannot be removed (they reach the model's output, a
  norm across them...: the dependency graph's ``unprunable``), or its module is not in the
  traced forward.

What a known Hugging Face family leaves whole by design is not named: the units of another kind
(a Llama's attention projections under ``structure="channel"``, its FFN under ``"head"``: the
family's table says what each kind spans), the model's outputs (the LM head, a classifier) and
the residual stream's width (a patch embedding). Nor are the tensors of a block masked whole
(a layer pruned before): ``shrink`` removes them with their block. :meth:`Uncovered.warn` says
it all in one :class:`UserWarning`, and the pruner's report shows :meth:`Uncovered.notes` under
its table.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> model = nn.Sequential(
    ...     nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    >>> graph = DependencyGraph(model, torch.randn(2, 4))
    >>> selected = [Target((f"{i}.weight",), ((model[i], "weight"),)) for i in (0, 2, 4)]
    >>> found = uncovered("channel", graph, graph.groups("channel"), selected)
    >>> found.reasons  # '2.weight' is spanned: the input columns of the channels of '0'
    {'4.weight': "its output channels cannot go: they reach the model's output"}
    >>> print(found.notes()[0])
    dense: 1 selected tensor (14.29% of the selected parameters) in no channel unit: '4.weight'
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from tensorplay.ao.pruning.frames import user_stacklevel
from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup
from tensorplay.ao.pruning.structured.units.kept_grid import masked_blocks
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["Uncovered", "uncovered"]


@dataclass(frozen=True)
class Uncovered:
    """The selected tensors a structure leaves dense, and why.

    Args:
        kind: The structure's kind of unit (``"channel"``, ``"head"``, ``"layer"``).
        reasons: Why each such tensor is in no unit, by its name, in the selection's order.
        share: Their parameters over all the selected tensors' parameters.
        selected: How many tensors the selection chose.

    Example:
        >>> [note] = Uncovered("head", {"lm_head.weight": "a test"}, 0.25, 4).notes()
        >>> note.startswith("dense: 1 selected tensor (25.00% of the selected parameters)")
        True
        >>> note.endswith("in no head unit: 'lm_head.weight'")
        True
    """

    kind: str
    reasons: dict[str, str]
    share: float
    selected: int

    def _count(self) -> str:
        count = len(self.reasons)
        return f"{count} selected tensor{'s' if count != 1 else ''}"

    def notes(self) -> tuple[str, ...]:
        """The line the pruner's report shows under its table (none when every tensor is
        covered; see the class)."""
        if not self.reasons:
            return ()
        names = ", ".join(repr(name) for name in self.reasons)
        return (
            f"dense: {self._count()} ({100 * self.share:.2f}% of the selected parameters) in no "
            f"{self.kind} unit: {names}",
        )

    def warn(self) -> None:
        """One :class:`UserWarning` naming every such tensor, grouped by reason (none when every
        tensor is covered).

        Example:
            >>> with warnings.catch_warnings(record=True) as caught:
            ...     warnings.simplefilter("always")
            ...     Uncovered("channel", {"out.weight": "a model output"}, 0.5, 2).warn()
            >>> message = str(caught[0].message)
            >>> message.startswith("structure='channel' leaves 1 selected tensor of 2 dense")
            True
            >>> "spans it. 'out.weight': a model output. Select only" in message
            True
        """
        if not self.reasons:
            return
        by_reason: dict[str, list[str]] = {}
        for name, reason in self.reasons.items():
            by_reason.setdefault(reason, []).append(repr(name))
        why = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in by_reason.items())
        them = "them" if len(self.reasons) != 1 else "it"
        warnings.warn(
            f"structure={self.kind!r} leaves {self._count()} of {self.selected} dense "
            f"({100 * self.share:.2f}% of the selected parameters): no {self.kind} unit spans "
            f"{them}. {why}. Select only what {self.kind} units span (`parameters`, `include`, "
            "`exclude`) to silence this.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def uncovered(
    kind: str,
    graph: DependencyGraph,
    taking_part: Sequence[UnitGroup],
    selected: Sequence[Target],
    model: nn.Module | None = None,
) -> Uncovered:
    """The tensors of ``selected`` that no group of ``taking_part`` spans, with why (see the
    module).

    Args:
        kind: The structure's kind of unit.
        graph: The model's dependency graph.
        taking_part: The groups of ``kind`` the pruner prunes.
        selected: The tensors the selection chose.
        model: The model, whose blocks masked whole leave their tensors unnamed.
    """
    spanned = {name for group in taking_part for name in group.parameters()}
    reasons: dict[str, str] = {}
    for target in selected:
        if spanned.intersection(target.names):
            continue
        reason = _why(kind, graph, set(target.names), selected)
        if reason is not None:
            reasons[target.name] = reason
    if reasons and model is not None:  # the masks are read only where a tensor is named
        removed = tuple(f"{block}." for block in masked_blocks(model))
        reasons = {name: why for name, why in reasons.items() if not name.startswith(removed)}
    numels = {target.name: target.parameter().numel() for target in selected}
    total = sum(numels.values())
    share = sum(numels[name] for name in reasons) / total if total else 0.0
    return Uncovered(kind, reasons, share, len(selected))


def _why(
    kind: str, graph: DependencyGraph, names: set[str], selected: Sequence[Target]
) -> str | None:
    """Why no unit of ``kind`` spans the tensor of ``names``; ``None`` where its family leaves
    it whole by design."""
    chosen = {name for target in selected for name in target.names}
    for group in graph.groups(kind):
        if names.intersection(group.parameters()):
            missing = [name for name in group.scored_parameters() if name not in chosen]
            return f"its {kind} group {group.name!r} also needs {missing} selected"
    if graph.blocks is not None:
        return None  # another kind's units, the outputs, the residual stream: by design
    modules = {name.rpartition(".")[0] for name in names}
    found = [graph.unprunable[module] for module in modules if module in graph.unprunable]
    if found:
        return f"its output channels cannot go: {found[0]}"
    return "not in the traced forward"
