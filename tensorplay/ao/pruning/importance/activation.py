r"""``importance="activation"``: channels and heads ranked by the activations they produce.

Minitron (Muralidharan et al. 2024, "Compact Language Models via Pruning and Knowledge
Distillation") ranks the width units of a trained model by their activations over a small
calibration set, with forwards only. A unit's **activation** here is what the layer that reads
it (its *consumer*) receives of it: the entries of the consumer's input that the unit's slice of
the consumer's weight multiplies.

* an FFN channel: its entry of the input of the down projection (``act(gate) * up``,
  ``act(fc1)``): Minitron's neuron activation;
* an attention head: its columns of the input of the output projection (``o_proj``,
  ``attention.output.dense``, GPT-2's ``c_proj``), the head's attention output; under
  grouped-query attention a unit is a key/value head with its query heads, and its activation
  is all of their outputs;
* a channel of a plain model: its input columns of every Linear or convolution that reads it.

With :math:`a_{n,p,i}` the entry :math:`i` of unit :math:`u`'s activation at position :math:`p`
(a token, a pixel) of sample :math:`n`, over the :math:`N` samples observed, the score is the
mean over the samples of the L2 norm over the positions (and over the unit's entries: a head's
``head_dim``), Minitron's best aggregation (batch: mean, sequence: L2):

.. math::

    F_u = \sum_{c \in C(u)} \frac{1}{N_c} \sum_{n=1}^{N_c}
          \sqrt{\sum_{p} \sum_{i \in u} \left(a^{c}_{n,p,i}\right)^{2}}

where :math:`C(u)` are the unit's consumers (one in every Hugging Face family: the down or
output projection) and :math:`N_c` the samples consumer :math:`c` saw. A sample is an entry
along the first dimension of the consumer's input and the positions are the dimensions between
it and the features: ``(batch, sequence, features)`` for a transformer, ``(batch, features)``
one position per sample, ``(batch, channels, *spatial)`` for a convolution (an unbatched input
is one sample). A model that flattens its tokens into one
dimension before the layer (Qwen2-MoE's shared expert) gives one sample per token there. Every
real token counts: in a calibration pass over batches whose ``attention_mask`` marks padding,
the padding's positions are left out (:mod:`~tensorplay.ao.pruning.calibration.padding`); in
training forwards every position counts.

The lowest-scored units are pruned first; this score is theirs as it stands (the structure
takes no root mean square of it), so units of every group compare on one scale under
``scope="global"``. It scores units only: ``structure="channel"`` or ``"head"`` (or both, with a
parameter budget); single weights, layers and experts are refused when the pruner is made, as
are consumers it cannot read exactly (a grouped convolution) and sharded (FSDP2) models.

The sums come from forward hooks on the consumers, installed when the pruner is made and removed
by ``make_permanent`` (silent once :func:`~tensorplay.ao.pruning.shrink` has changed them); every
forward adds, in train or eval mode, with or without gradients, each input checked for
non-finite values first (:func:`~tensorplay.ao.pruning.calibration.finite.check_read`). They
are kept in ``float64`` (one number per unit and consumer: ``accumulator_dtype`` does not apply),
are part of the pruner's state, are **reset after each pruning step** (a gradual schedule ranks
by the model as pruned so far) and are summed over the ranks of a process group (DDP) at a
pruning step, so every rank prunes the same units.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning import OneShotSchedule, Pruner
    >>> _ = torch.manual_seed(0)
    >>> model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    >>> pruner = Pruner(model, OneShotSchedule(0.5), structure="channel",
    ...                 importance="activation", example_inputs=torch.randn(2, 4))
    >>> batch = torch.randn(8, 4)
    >>> _ = model(batch)  # a calibration forward
    >>> by_hand = model[1](model[0](batch)).abs().mean(dim=0)  # 8 samples of one position
    >>> pruner.importance.unit_scores(pruner.structure.groups[0]).float().allclose(by_hand)
    True
    >>> pruner.step()
    3
    >>> model[2].weight_mask.any(dim=0).equal(by_hand > by_hand.median())
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from tensorplay.ao.pruning.calibration.finite import check_read
from tensorplay.ao.pruning.calibration.padding import real_rows, real_samples, refuse_padding
from tensorplay.ao.pruning.calibration.rank_sums import summed_over_ranks
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.edits.spent import ShrinkWatch
from tensorplay.ao.pruning.importance.score import Importance, UnitLayout, UnitSlice
from tensorplay.ao.pruning.selection.sharding import is_dtensor
from tensorplay.ao.pruning.targets.layouts import is_transposed
from tensorplay.ao.pruning.targets.tied import Target

__all__ = ["Activation", "unit_key"]


def unit_key(group: UnitLayout) -> str:
    """The name a group's sums go by in the score's state: ``"<kind>:<group name>"``.

    Example:
        >>> from types import SimpleNamespace
        >>> unit_key(SimpleNamespace(kind="head", name="model.layers.0.self_attn"))
        'head:model.layers.0.self_attn'
    """
    return f"{group.kind}:{group.name}"


@dataclass(frozen=True)
class _Read:
    """Where one consumer's input holds a group's units: ``size`` units of ``width`` entries
    from ``offset`` along the features (the last dimension, or dim 1 of a convolution's)."""

    key: str
    index: int
    offset: int
    width: int
    size: int
    channels_first: bool
    spatial: int

    def norms(self, inputs: Tensor, where: str) -> Tensor:
        """Per sample of one forward's ``inputs`` (read by ``where``), each unit's L2 norm over
        its entries at every real position (:mod:`~tensorplay.ao.pruning.calibration.padding`):
        ``(samples, size)``, float32."""
        x = inputs.detach().to(torch.float32)
        span = self.size * self.width
        if self.channels_first:
            refuse_padding(where)
            if x.dim() == self.spatial + 1:  # unbatched: one sample
                x = x.unsqueeze(0)
            section = x.narrow(1, self.offset, span).reshape(len(x), self.size, self.width, -1)
            return section.square().sum(dim=(2, 3)).sqrt()
        if x.dim() == 1:
            x = x.unsqueeze(0)
        x = real_samples(x, where)
        x = x.reshape(len(x), -1, x.shape[-1])  # (samples, positions, features)
        section = x.narrow(2, self.offset, span).reshape(len(x), -1, self.size, self.width)
        return section.square().sum(dim=(1, 3)).sqrt()

    def absolute(self, outputs: Tensor, where: str) -> Tensor:
        """Per real token of one forward's ``outputs`` (a norm's, features last, made by
        ``where``), each unit's absolute value summed over its entries: ``(tokens, size)``,
        float32."""
        x = outputs.detach().to(torch.float32)
        x = real_rows(x, where).narrow(1, self.offset, self.size * self.width)
        return x.abs().reshape(len(x), self.size, self.width).sum(dim=2)


class Activation(Importance):
    """Minitron's activation score of channels and heads (the module docstring)."""

    name: ClassVar[str] = "activation"
    structures: ClassVar[tuple[str, ...] | None] = ("channel", "head", "hidden")

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(dtype)
        self._sizes: dict[str, int] = {}  # units per group, by unit_key
        self._consumers: dict[str, list[str]] = {}  # each read's consumer module, by unit_key
        self._sums: dict[str, Tensor] = {}  # (reads, size) float64: sum over samples of norms
        self._samples: dict[str, Tensor] = {}  # (reads,) float64: samples seen
        self._batches: dict[str, int] = {}  # forwards each consumer saw, by module name
        self._reduced: tuple[dict[str, Tensor], dict[str, Tensor]] | None = None
        self._handles: list[RemovableHandle] = []

    def bind(self, targets: Sequence[Target], units: Sequence[UnitLayout] = ()) -> None:
        """Find the consumers of every unit group and hook them (all checked first).

        Raises:
            ValueError: No units (single weights), a group of a kind this score does not rank
                (naming it), a group no Linear, ``Conv1D`` or ungrouped convolution reads,
                a grouped convolution reading one, or a sharded (FSDP2) target.
        """
        if not units:
            raise ValueError(
                "Expected importance='activation' with structure='channel' or 'head', but got "
                "single weights: it scores units by the activations they produce, and a weight "
                "has none of its own."
            )
        holders = {
            name: (target, pair)
            for target in targets
            for name, pair in zip(target.names, target.pairs, strict=True)
        }
        plans: dict[str, tuple[nn.Module, list[_Read], list[tuple[nn.Module, str]]]] = {}
        norm_plans: dict[str, tuple[nn.Module, list[_Read], list[tuple[nn.Module, str]]]] = {}
        consumers: dict[str, list[str]] = {}
        for group in units:
            key = unit_key(group)
            if group.kind not in (self.structures or ()):
                raise ValueError(
                    f"Expected structure='channel' or 'head' with importance='activation', but "
                    f"got structure={group.kind!r} (group {group.name!r}): it scores channels "
                    "and heads only."
                )
            found = consumers.setdefault(key, [])
            for piece in group.slices:
                if group.kind == "hidden":
                    self._plan_norm(group, piece, found, holders, norm_plans)
                    continue
                read = self._read_of(group, piece, len(found), holders)
                if read is None:
                    continue
                module_name = piece.parameter.rpartition(".")[0]
                target, pair = holders[piece.parameter]
                plan = plans.setdefault(module_name, (pair[0], [], []))
                plan[1].append(read)
                plan[2].extend(target.pairs)
                found.append(module_name)
            if not found and group.kind == "hidden":
                raise ValueError(
                    f"Expected the hidden group {group.name!r} to have norms over the residual "
                    "stream for importance='activation' (it reads their outputs), but got none."
                )
            if not found:
                raise ValueError(
                    f"Expected every unit group of importance='activation' to be read by a "
                    f"Linear, Hugging Face Conv1D, Conv1d or Conv2d (its activation is that "
                    f"layer's input), but group {group.name!r} ({group.kind}) is read by none"
                    + (
                        " (a routed expert's slice of a fused tensor): rank it by 'magnitude' "
                        "or 'taylor'."
                        if any(getattr(piece, "expert", None) is not None for piece in group.slices)
                        else "."
                    )
                )
        self._sizes = {unit_key(group): group.size for group in units}
        self._consumers = consumers
        self.after_pruning()
        for module_name, (module, reads, pairs) in plans.items():
            observe = self._observer(module_name, reads, ShrinkWatch(pairs))
            self._handles.append(changes.observe(module.register_forward_hook, observe))
        for module_name, (module, reads, pairs) in norm_plans.items():
            observe = self._observer(module_name, reads, ShrinkWatch(pairs), at_output=True)
            self._handles.append(changes.observe(module.register_forward_hook, observe))

    @staticmethod
    def _plan_norm(
        group: UnitLayout,
        piece: UnitSlice,
        found: list[str],
        holders: Mapping[str, tuple[Target, tuple[nn.Module, str]]],
        plans: dict[str, tuple[nn.Module, list[_Read], list[tuple[nn.Module, str]]]],
    ) -> None:
        """A hidden channel's read at the output of a norm over the stream: the slice of a
        norm's 1-D ``weight`` (Minitron's embedding-channel score reads the norms' outputs)."""
        held = holders.get(piece.parameter)
        if held is None or piece.dim != 0:
            return
        target, (module, local) = held
        if local != "weight" or target.parameter().dim() != 1:
            return
        if is_dtensor(target.parameter()):
            raise ValueError(
                f"Expected plain tensors with importance='activation', but {target.name!r} is a "
                "DTensor (FSDP2): prune on one device or under DDP, or use another importance."
            )
        module_name = piece.parameter.rpartition(".")[0]
        read = _Read(unit_key(group), len(found), piece.offset, piece.width, group.size, False, 0)
        plan = plans.setdefault(module_name, (module, [], []))
        plan[1].append(read)
        plan[2].extend(target.pairs)
        found.append(module_name)

    @staticmethod
    def _read_of(
        group: UnitLayout,
        piece: UnitSlice,
        index: int,
        holders: Mapping[str, tuple[Target, tuple[nn.Module, str]]],
    ) -> _Read | None:
        """The read ``piece`` is if it indexes the input features of the weight it lies in
        (``None`` if it does not: a producer's rows, a bias).

        Raises:
            ValueError: A sharded target, or a grouped convolution reading the units.
        """
        held = holders.get(piece.parameter)
        if held is None or piece.dim is None:
            return None
        target, (module, local) = held
        if is_dtensor(target.parameter()):
            raise ValueError(
                f"Expected plain tensors with importance='activation', but {target.name!r} is a "
                "DTensor (FSDP2): prune on one device or under DDP, or use another importance."
            )
        if local != "weight":
            return None
        convolution = isinstance(module, (nn.Conv1d, nn.Conv2d))
        if isinstance(module, nn.Linear) or convolution:
            axis = 1
        elif type(module).__name__ == "Conv1D" and is_transposed(module):
            axis = 0
        else:
            return None
        if piece.dim != axis:
            return None
        if convolution and module.groups != 1:
            raise ValueError(
                f"Expected the layers that read units of importance='activation' to be "
                f"ungrouped, but {piece.parameter.rpartition('.')[0]!r} "
                f"({type(module).__name__}) has groups={module.groups}: which of its input "
                f"channels a unit of group {group.name!r} is cannot be read exactly."
            )
        spatial = 1 if isinstance(module, nn.Conv1d) else 2
        return _Read(
            unit_key(group), index, piece.offset, piece.width, group.size, convolution, spatial
        )

    def _observer(
        self,
        module_name: str,
        reads: Sequence[_Read],
        shrunk: ShrinkWatch,
        *,
        at_output: bool = False,
    ) -> Any:
        def observe(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if shrunk.spanned() is not None:
                return  # the pruner is spent: the shrunk layer's inputs feed no score
            seen = output if at_output else args[0]
            with torch.no_grad():
                # A NaN or an infinity in the input would make every unit's score NaN.
                check_read(seen, module_name, self._batches[module_name])
                for read in reads:
                    if at_output:
                        norms = read.absolute(seen, module_name)
                    else:
                        norms = read.norms(seen, module_name)
                    sums = self._sums[read.key][read.index]
                    sums += norms.sum(dim=0).to(device="cpu", dtype=torch.float64)
                    self._samples[read.key][read.index] += len(norms)
            self._batches[module_name] += 1
            self._reduced = None

        return observe

    def _totals(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The sums and sample counts, summed over the ranks (one ``all_reduce``; cached until
        the next forward)."""
        if self._reduced is not None:
            return self._reduced
        keys = sorted(self._sums)
        parts = [self._sums[key].flatten() for key in keys]
        parts += [self._samples[key] for key in keys]
        flat = summed_over_ranks(torch.cat([torch.zeros(0, dtype=torch.float64), *parts]))
        sums, samples, offset = {}, {}, 0
        for key in keys:
            count = self._sums[key].numel()
            sums[key] = flat[offset : offset + count].view(self._sums[key].shape)
            offset += count
        for key in keys:
            count = self._samples[key].numel()
            samples[key] = flat[offset : offset + count]
            offset += count
        self._reduced = (sums, samples)
        return self._reduced

    def check_ready(self, targets: Sequence[Target]) -> None:
        """Raises:
        RuntimeError: A consumer that saw no batch (on any rank), naming them.
        """
        _, samples = self._totals()
        unseen = [
            consumer
            for key, counts in samples.items()
            for consumer, count in zip(self._consumers[key], counts.tolist(), strict=True)
            if not count
        ]
        if unseen:
            raise RuntimeError(
                "Expected importance='activation' to have observed at least one batch through "
                f"every layer that reads a unit before a pruning step, but {unseen} saw none: "
                "run a calibration pass (forwards of a few batches) before pruner.step()."
            )

    def unit_scores(self, group: UnitLayout) -> Tensor:
        """``F_u`` of every unit of ``group`` (float64), summed over the ranks first.

        Raises:
            ValueError: A group :meth:`bind` was not given.
        """
        key = unit_key(group)
        if key not in self._sizes:
            raise ValueError(
                f"Expected a unit group importance='activation' observes, but got {key!r}: "
                f"it observes {sorted(self._sizes)}."
            )
        sums, samples = self._totals()
        return (sums[key] / samples[key].clamp(min=1).unsqueeze(1)).sum(dim=0)

    def scores(self, targets: Sequence[Target]) -> list[Tensor]:
        """Refused: this score ranks units (:meth:`unit_scores`), not single weights.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError(
            "Expected unit scores from importance='activation' (Importance.unit_scores), but "
            f"element scores of {[target.name for target in targets]} were asked: it ranks "
            "channels and heads, not single weights."
        )

    def after_pruning(self) -> None:
        """Restart the sums: the next pruning step ranks by the pruned model's activations."""
        self._sums = {
            key: torch.zeros(len(found), self._sizes[key], dtype=torch.float64)
            for key, found in self._consumers.items()
        }
        self._samples = {
            key: torch.zeros(len(found), dtype=torch.float64)
            for key, found in self._consumers.items()
        }
        self._batches = {name: 0 for found in self._consumers.values() for name in found}
        self._reduced = None

    def state_dict(self) -> dict[str, Any]:
        """``{"samples", "sums"}`` by :func:`unit_key`: this rank's, per consumer of the group."""
        return {
            "samples": {key: value.clone() for key, value in self._samples.items()},
            "sums": {key: value.clone() for key, value in self._sums.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any], targets: Sequence[Target]) -> None:
        """Restore :meth:`state_dict` (``{}``: nothing observed).

        Raises:
            ValueError: Other keys, groups this score does not observe, or sums of another
                shape.
        """
        if not state:
            self.after_pruning()
            return
        expected = {key: value.shape for key, value in self._sums.items()}
        if set(state) != {"samples", "sums"} or set(state["sums"]) != set(expected):
            raise ValueError(
                "Expected an importance state with keys ['samples', 'sums'] of the unit groups "
                f"{sorted(expected)} for importance='activation', but got {sorted(state)}."
            )
        for key, shape in expected.items():
            sums, samples = state["sums"][key], state["samples"].get(key)
            if tuple(sums.shape) != tuple(shape) or samples is None or len(samples) != shape[0]:
                raise ValueError(
                    f"Expected the sums of {key!r} to have shape {tuple(shape)} for "
                    f"importance='activation', but got {tuple(sums.shape)}."
                )
        self._sums = {
            key: value.detach().to("cpu", torch.float64, copy=True)
            for key, value in state["sums"].items()
        }
        self._samples = {
            key: value.detach().to("cpu", torch.float64, copy=True)
            for key, value in state["samples"].items()
        }
        self._reduced = None

    def close(self) -> None:
        """Remove the forward hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
