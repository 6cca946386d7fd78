"""``importance="wanda"``: pruning by weights and activations (Sun, Liu, Bair & Kolter 2023).

The score of ``W[i, j]`` is ``|W[i, j]| * ||X_j||_2``: the weight's magnitude times the norm of
the input feature it multiplies, over every token of the batches observed
(:mod:`~tensorplay.ao.pruning.importance.input_features` maps the feature to the weight's axis for
``nn.Linear``, Hugging Face ``Conv1D`` and ``nn.Conv1d/2d``). Sun et al. compare the scores
**within each output row** and prune once, with no weight update: use it with ``scope="row"``
and a :class:`~tensorplay.ao.pruning.pruner.schedules.OneShotSchedule` after a calibration pass
(:func:`~tensorplay.ao.pruning.pruner.one_shot.prune_one_shot`).

The norms come from forward hooks on every module that holds a target, installed when the pruner
is made and removed by ``make_permanent`` (and silent once
:func:`~tensorplay.ao.pruning.shrink` has changed their target: the pruner is spent); every
forward adds to them (in ``float32``), in train
or eval mode, with or without gradients. They are **reset after each pruning step**, so a
gradual schedule ranks by the activations of the model as pruned so far. Under DDP (ranks that
see different data) the sums are all-reduced at the pruning step, so every rank ranks by the
norms over all ranks' batches and the masks are identical.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> layer = nn.Linear(2, 1, bias=False)
    >>> layer.weight.data = torch.tensor([[1.0, 1.0]])
    >>> targets = [Target(("weight",), ((layer, "weight"),))]
    >>> score = Wanda()
    >>> score.bind(targets)
    >>> _ = layer(torch.tensor([[3.0, 0.0], [4.0, 1.0]]))
    >>> score.scores(targets)[0].tolist()
    [[5.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from tensorplay.ao.pruning.calibration.finite import check_read
from tensorplay.ao.pruning.calibration.rank_sums import summed_over_ranks
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.edits.spent import ShrinkWatch
from tensorplay.ao.pruning.importance.input_features import FeatureLayout, feature_layout
from tensorplay.ao.pruning.importance.score import Importance, UnitLayout
from tensorplay.ao.pruning.selection import local_part
from tensorplay.ao.pruning.selection.shards import local_rows, placed_like
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["Wanda"]


class Wanda(Importance):
    """``|W| * ||X_j||_2`` from forward hooks (the module docstring)."""

    name: ClassVar[str] = "wanda"

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(dtype)
        self._layouts: dict[str, FeatureLayout] = {}
        self._sums: dict[str, Tensor] = {}
        self._batches: dict[str, int] = {}
        self._handles: list[RemovableHandle] = []

    def bind(self, targets: Sequence[Target], units: Sequence[UnitLayout] = ()) -> None:
        """Find each target's input features and hook its holders (all checked first).

        Raises:
            ValueError: A target held by no ``Linear``/``Conv1D``/``Conv1d``/``Conv2d`` as its
                ``weight`` (a fused 3-D expert tensor: the routed experts' channels of
                ``structure="channel"`` too), or by holders of different layouts.
        """
        del units  # element scores: the structure reduces them per unit
        plans: list[tuple[Target, list[nn.Module]]] = []
        layouts: dict[str, FeatureLayout] = {}
        for target in targets:
            found = [
                (module, feature_layout(module, name, fq))
                for (module, name), fq in zip(target.pairs, target.names, strict=True)
            ]
            known = [(module, layout) for module, layout in found if layout is not None]
            if not known and target.parameter().dim() == 3:
                raise ValueError(
                    "Expected every target of importance='wanda' to be the weight of a Linear, "
                    "Hugging Face Conv1D, Conv1d or Conv2d (Wanda scales by its input "
                    f"features), but {target.name!r} {target.label} is a fused tensor of "
                    "mixture-of-experts experts, whose inputs differ per expert: use "
                    "importance='magnitude' or 'taylor' (with structure='channel', a routed "
                    "expert's channels take part with their layer: exclude the layer to leave "
                    "them out)."
                )
            if not known:
                raise ValueError(
                    "Expected every target of importance='wanda' to be the weight of a Linear, "
                    f"Hugging Face Conv1D, Conv1d or Conv2d (Wanda scales by its input "
                    f"features), but {target.name!r} {target.label} is not: exclude it."
                )
            if len({layout for _, layout in known}) > 1:
                raise ValueError(
                    f"Expected the holders of the tied target {target.name!r} to see the same "
                    "input features for importance='wanda', but their layouts differ."
                )
            layouts[target.name] = known[0][1]
            plans.append((target, [module for module, _ in known]))
        self._layouts = layouts
        self._batches = {target.name: 0 for target, _ in plans}
        for target, modules in plans:
            observe = self._observer(target.name, ShrinkWatch(target.pairs))
            for module in modules:
                self._handles.append(changes.observe(module.register_forward_hook, observe))

    def _observer(self, name: str, shrunk: ShrinkWatch) -> Any:
        layout = self._layouts[name]

        def observe(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if shrunk.spanned() is not None:
                return  # the pruner is spent: the shrunk layer's inputs feed no score
            with torch.no_grad():
                squares = layout.squares(args[0], name.rpartition(".")[0])
                # A NaN or an infinity in the input would make every score of the layer NaN.
                check_read(squares, name.rpartition(".")[0], self._batches[name])
                total = self._sums.get(name)
                if total is None or total.device != squares.device:
                    self._sums[name] = squares.to(self.dtype)
                else:
                    total.add_(squares)
            self._batches[name] += 1

        return observe

    def check_ready(self, targets: Sequence[Target]) -> None:
        """Raises:
        RuntimeError: A target whose layer saw no batch (on any rank), naming them.
        """
        counts = [self._batches.get(target.name, 0) for target in targets]
        counts = summed_over_ranks(torch.tensor(counts, dtype=torch.int64)).tolist()
        unseen = [target.name for target, count in zip(targets, counts, strict=True) if not count]
        if unseen:
            raise RuntimeError(
                "Expected importance='wanda' to have observed at least one batch through every "
                f"target's layer before a pruning step, but {unseen} saw none: run a "
                "calibration pass (forwards of a few batches) before pruner.step()."
            )

    def scores(self, targets: Sequence[Target]) -> list[Tensor]:
        """``|W| * sqrt(sum of squares)``, the sums all-reduced over the ranks first."""
        sums = [self._sum_of(target) for target in targets]
        flat = summed_over_ranks(torch.cat([s.to(torch.float32).reshape(-1) for s in sums]))
        norms = torch.split(flat, [s.numel() for s in sums])
        result = []
        for target, norm, total in zip(targets, norms, sums, strict=True):
            param = target.parameter()
            local = local_part(param.detach())
            rows = local_rows(param, target.label)
            scale = self._layouts[target.name].expand(
                norm.view(total.shape).sqrt().to(local.device), param.shape, rows
            )
            result.append(placed_like(local.abs().to(torch.float32) * scale, param))
        return result

    def _sum_of(self, target: Target) -> Tensor:
        """The target's sums (zeros where this rank saw no batch of it)."""
        found = self._sums.get(target.name)
        if found is not None:
            return found
        param = target.parameter()
        count = self._layouts[target.name].features(param.shape)
        return torch.zeros(count, dtype=self.dtype, device=local_part(param).device)

    def after_pruning(self) -> None:
        """Restart the sums: the next pruning step ranks by the pruned model's activations."""
        self._sums = {}
        self._batches = dict.fromkeys(self._batches, 0)

    def batches(self) -> dict[str, int]:
        """Forward calls observed, by target name, since the last reset (this rank's)."""
        return dict(self._batches)

    def state_dict(self) -> dict[str, Any]:
        """``{"batches", "sums"}``: this rank's sums of squares by target name."""
        return {"batches": dict(self._batches), "sums": dict(self._sums)}

    def load_state_dict(self, state: Mapping[str, Any], targets: Sequence[Target]) -> None:
        """Restore the sums onto the targets' devices.

        Raises:
            ValueError: Other keys or unknown targets.
        """
        names = [target.name for target in targets]
        if not state:
            self.after_pruning()
            return
        if set(state) != {"batches", "sums"} or not set(state["sums"]) <= set(names):
            raise ValueError(
                "Expected an importance state with keys ['batches', 'sums'] of the targets "
                f"{names} for importance='wanda', but got {sorted(state)}."
            )
        devices = {target.name: target.parameter().device for target in targets}
        self._sums = {
            name: value.detach().to(device=devices[name], dtype=self.dtype, copy=True)
            for name, value in state["sums"].items()
        }
        self._batches = {name: int(state["batches"].get(name, 0)) for name in names}

    def close(self) -> None:
        """Remove the forward hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
