"""Scores of experts observed in the forwards: ``"reap"`` and ``"frequency"``.

Both watch each mixture-of-experts layer's experts module (a forward hook: it receives the
tokens, the experts each token is routed to and their gate weights, as every transformers 5
experts module of :mod:`~tensorplay.ao.pruning.structured.dependency.families.moe` does) over the
batches seen since the last pruning step, and give one score per expert:

* ``"frequency"``: the share of the tokens routed to the expert (over all tokens seen; the
  shares of a layer sum to its ``top_k``);
* ``"reap"`` (Router-weighted Expert Activation Pruning, Lasby et al. 2025): the mean, over
  the tokens routed to the expert, of its gate weight renormalised over the token's top-k
  times the L2 norm of its output, ``mean_t g_e(x_t) * ||E_e(x_t)||_2``; an expert no token
  reached scores 0.

They rank experts only (``structure="expert"``, checked by the configuration): each scored
tensor of a layer (its fused ``gate_up_proj`` and ``down_proj``) gets the expert's score in every
entry of the expert's slice, so the unit's root mean square is the score itself. Observed in a
calibration pass (:func:`~tensorplay.ao.pruning.pruner.one_shot.prune_one_shot`, where ``"reap"`` is
the default for experts) or in training (every forward adds, in train or eval mode, with or
without gradients). The sums are part of the pruner's state (a resumed run continues them),
reset after each pruning step (a gradual schedule ranks by the model as pruned so far), summed
over the ranks at a pruning step, and silent once
:func:`~tensorplay.ao.pruning.shrink` has changed the experts (the pruner is spent).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.targets.tied import Target
    >>> experts = nn.Module()  # 2 experts of 1 channel over 1 feature, as transformers holds them
    >>> experts.gate_up_proj = nn.Parameter(torch.ones(2, 2, 1))
    >>> experts.down_proj = nn.Parameter(torch.tensor([[[1.0]], [[2.0]]]))
    >>> experts.act_fn = nn.Identity()
    >>> experts.forward = lambda x, index, weights: x  # only its inputs are observed
    >>> targets = [Target((name,), ((experts, name),)) for name in ("gate_up_proj", "down_proj")]
    >>> score = Frequency()
    >>> score.bind(targets)
    >>> _ = experts(torch.ones(4, 1), torch.tensor([[0], [0], [0], [1]]), torch.ones(4, 1))
    >>> score.expert_scores("")
    tensor([0.7500, 0.2500], dtype=torch.float64)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from tensorplay.ao.pruning.calibration.finite import check_read
from tensorplay.ao.pruning.calibration.padding import real_rows
from tensorplay.ao.pruning.calibration.rank_sums import summed_over_ranks
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.edits.spent import ShrinkWatch
from tensorplay.ao.pruning.importance.score import Importance, UnitLayout
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["Frequency", "Reap", "expert_output"]

_FUSED = ("gate_up_proj", "down_proj")


def expert_output(experts: nn.Module, expert: int, tokens: Tensor) -> Tensor:
    """What expert ``expert`` of a fused experts module outputs for ``tokens`` (before its gate
    weight): ``down @ (act(gate @ x) * (up @ x))``, with the weights the module computes with.

    Example:
        >>> experts = nn.Module()
        >>> experts.gate_up_proj = nn.Parameter(torch.tensor([[[1.0], [2.0]]]))
        >>> experts.down_proj = nn.Parameter(torch.tensor([[[3.0]]]))
        >>> experts.act_fn = nn.Identity()
        >>> expert_output(experts, 0, torch.tensor([[1.0]])).tolist()  # 3 * (1 * 2)
        [[6.0]]
    """
    gate_up: Tensor = getattr(experts, "gate_up_proj")  # noqa: B009  (masked: not a parameter)
    down: Tensor = getattr(experts, "down_proj")  # noqa: B009
    gate, up = nn.functional.linear(tokens, gate_up[expert]).chunk(2, dim=-1)
    act: Any = getattr(experts, "act_fn")  # noqa: B009
    return nn.functional.linear(act(gate) * up, down[expert])


class _ExpertObserver(Importance):
    """Counts of the tokens routed to each expert of each experts module, by module name."""

    structures: ClassVar[tuple[str, ...] | None] = ("expert",)
    needs_outputs: ClassVar[bool] = False

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(dtype)
        self._modules: dict[str, nn.Module] = {}
        self._tokens: dict[str, int] = {}
        self._batches: dict[str, int] = {}  # forwards each experts module saw
        self._counts: dict[str, Tensor] = {}
        self._sums: dict[str, Tensor] = {}
        self._handles: list[RemovableHandle] = []

    def bind(self, targets: Sequence[Target], units: Sequence[UnitLayout] = ()) -> None:
        """Hook each experts module holding a target (all checked first).

        Raises:
            ValueError: A target that is not the ``gate_up_proj`` or ``down_proj`` of a fused
                experts module (3-D, experts along dim 0, with an ``act_fn``).
        """
        del units  # element scores: the structure reduces them per unit
        found: dict[str, tuple[nn.Module, list[tuple[nn.Module, str]]]] = {}
        for target in targets:
            module, local = target.pairs[0]
            if local not in _FUSED or not _is_fused_experts(module):
                raise ValueError(
                    f"Expected every target of importance={self.name!r} to be the gate_up_proj "
                    "or down_proj of a mixture-of-experts layer's fused experts, but "
                    f"{target.name!r} {target.label} is not: use structure='expert'."
                )
            name = target.name.rpartition(".")[0]
            found.setdefault(name, (module, []))[1].extend(target.pairs)
        for name, (module, pairs) in found.items():
            self._modules[name] = module
            self._tokens[name] = 0
            self._batches[name] = 0
            hook = self._observer(name, ShrinkWatch(pairs))
            self._handles.append(
                changes.observe(module.register_forward_hook, hook, with_kwargs=True)
            )

    def _observer(self, name: str, shrunk: ShrinkWatch) -> Any:
        def observe(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
        ) -> None:
            if shrunk.spanned() is not None:
                return  # the pruner is spent: the experts were renumbered
            tokens, index, weights = _routing_inputs(args, kwargs)
            # The padding's tokens are routed too: they are no tokens of the calibration text.
            index = real_rows(index.reshape(len(tokens), -1), name)
            weights = real_rows(weights.reshape(len(tokens), -1), name)
            tokens = real_rows(tokens, name)
            with torch.no_grad():
                for read in (tokens, weights):  # a NaN would make every expert's score NaN
                    check_read(read, name, self._batches[name])
                self._observe(name, module, tokens, index, weights)
            self._batches[name] += 1

        return observe

    def _observe(
        self, name: str, module: nn.Module, tokens: Tensor, index: Tensor, weights: Tensor
    ) -> None:
        experts = int(getattr(module, "gate_up_proj").shape[0])  # noqa: B009
        flat = index.reshape(len(tokens), -1)
        counts = torch.bincount(flat.flatten().cpu(), minlength=experts + 1)[:experts]
        self._add(self._counts, name, counts.to(torch.float64))
        self._tokens[name] += len(tokens)
        if not self.needs_outputs:
            return
        gates = weights.reshape(flat.shape).float()
        gates = gates / gates.sum(dim=-1, keepdim=True)  # renormalised over the top-k
        sums = torch.zeros(experts, dtype=torch.float64)
        for expert in torch.nonzero(counts).flatten().tolist():
            rows, slots = torch.where(flat == expert)
            norms = expert_output(module, expert, tokens[rows]).float().norm(dim=-1)
            sums[expert] = (gates[rows, slots] * norms).sum().double().cpu()
        self._add(self._sums, name, sums)

    @staticmethod
    def _add(store: dict[str, Tensor], name: str, value: Tensor) -> None:
        held = store.get(name)
        store[name] = value if held is None else held + value

    def check_ready(self, targets: Sequence[Target]) -> None:
        """Raises:
        RuntimeError: An experts module that saw no token (on any rank), naming them.
        """
        names = list(self._modules)
        seen = summed_over_ranks(torch.tensor([self._tokens[name] for name in names]))
        unseen = [name for name, count in zip(names, seen.tolist(), strict=True) if not count]
        if unseen:
            raise RuntimeError(
                f"Expected importance={self.name!r} to have observed at least one token through "
                f"every experts module before a pruning step, but {unseen} saw none: run a "
                "calibration pass (forwards of a few batches) before pruner.step()."
            )

    def expert_scores(self, name: str) -> Tensor:
        """One float64 score per expert of the experts module ``name`` (summed over ranks)."""
        raise NotImplementedError

    def _totals(self, name: str) -> tuple[Tensor, Tensor, int]:
        """The counts, sums and tokens of ``name``, summed over the ranks."""
        experts = int(getattr(self._modules[name], "gate_up_proj").shape[0])  # noqa: B009
        zeros = torch.zeros(experts, dtype=torch.float64)
        counts = self._counts.get(name, zeros)
        sums = self._sums.get(name, zeros)
        tokens = torch.tensor([float(self._tokens.get(name, 0))], dtype=torch.float64)
        flat = summed_over_ranks(torch.cat([counts, sums, tokens]))
        return flat[:experts], flat[experts : 2 * experts], int(flat[-1])

    def scores(self, targets: Sequence[Target]) -> list[Tensor]:
        """Each target's expert scores, the score of expert ``e`` in all of its slice."""
        cache: dict[str, Tensor] = {}
        result = []
        for target in targets:
            name = target.name.rpartition(".")[0]
            if name not in cache:
                cache[name] = self.expert_scores(name)
            param = target.parameter()
            score = cache[name].to(device=param.device, dtype=torch.float32)
            result.append(score.view(-1, *(1,) * (param.dim() - 1)).expand(param.shape))
        return result

    def after_pruning(self) -> None:
        """Restart the sums: the next pruning step ranks by the pruned model's routing."""
        self._counts, self._sums = {}, {}
        self._tokens = dict.fromkeys(self._tokens, 0)

    def state_dict(self) -> dict[str, Any]:
        """``{"tokens", "counts", "sums"}`` by experts module name (this rank's)."""
        return {
            "tokens": dict(self._tokens),
            "counts": dict(self._counts),
            "sums": dict(self._sums),
        }

    def load_state_dict(self, state: Mapping[str, Any], targets: Sequence[Target]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            ValueError: Other keys, or modules this score does not observe.
        """
        if not state:
            self.after_pruning()
            return
        if set(state) != {"tokens", "counts", "sums"} or not set(state["tokens"]) <= set(
            self._modules
        ):
            raise ValueError(
                f"Expected an importance state with keys ['counts', 'sums', 'tokens'] of the "
                f"experts modules {list(self._modules)} for importance={self.name!r}, but got "
                f"{sorted(state)}."
            )
        self._tokens = {name: int(state["tokens"].get(name, 0)) for name in self._modules}
        self._counts = {k: v.detach().to("cpu", torch.float64) for k, v in state["counts"].items()}
        self._sums = {k: v.detach().to("cpu", torch.float64) for k, v in state["sums"].items()}

    def close(self) -> None:
        """Remove the forward hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


class Frequency(_ExpertObserver):
    """``importance="frequency"``: the share of tokens routed to each expert (the module)."""

    name: ClassVar[str] = "frequency"

    def expert_scores(self, name: str) -> Tensor:
        """``tokens routed to e / tokens seen``."""
        counts, _, tokens = self._totals(name)
        return counts / max(tokens, 1)


class Reap(_ExpertObserver):
    """``importance="reap"``: the router-weighted mean norm of each expert's output (the
    module)."""

    name: ClassVar[str] = "reap"
    needs_outputs: ClassVar[bool] = True

    def expert_scores(self, name: str) -> Tensor:
        """``sum_t g_e(x_t) ||E_e(x_t)|| / (tokens routed to e)``; 0 where none was."""
        counts, sums, _ = self._totals(name)
        return torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))


def _is_fused_experts(module: nn.Module) -> bool:
    shapes = [getattr(getattr(module, key, None), "shape", None) for key in _FUSED]
    return all(shape is not None and len(shape) == 3 for shape in shapes) and callable(
        getattr(module, "act_fn", None)
    )


def _routing_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Tensor, ...]:
    """``(tokens, top_k_index, top_k_weights)`` of an experts module's call."""
    names = ("hidden_states", "top_k_index", "top_k_weights")
    values = [*args, *(kwargs[name] for name in names[len(args) :])]
    tokens = values[0]
    return tokens.reshape(-1, tokens.shape[-1]), values[1], values[2]
