"""What ``target_latency=`` counts: a latency table measured once, and the estimate read from it.

Timing every candidate a pruner weighs is out of the question, so the latency of a pruned model
is *estimated* from one table, measured once on the dense model, on its own device and in its
dtype, on the inputs of a
:class:`~tensorplay.ao.pruning.structured.units.latency_setting.LatencyBudget`
(:func:`latency_table`; the forwards run in evaluation mode under ``torch.no_grad``, each time is
the least over ``repeats`` forwards after ``warmup`` untimed ones, ``torch.cuda.synchronize``
around each timed span on a GPU). The least, not the median: on a machine doing other work, a
forward is interrupted more often than any one part of it, so medians would charge the
interruptions to the whole forward and inflate the rests below; the least of each is the time
its work takes when nothing else runs, and the parts then add up to the whole. On a CPU running
one torch thread the clock is that thread's CPU time (``time.thread_time``), which other programs
cannot stretch; elsewhere it is the wall clock (``time.perf_counter``), and a CPU shared with
other work is best timed on one thread (``torch.set_num_threads(1)``):

* **Leaves** (:class:`LeafTime`): every module holding parameters of its own (a ``Linear``, a
  ``Conv1D``, an embedding, a norm, the LM head, a router, a layer of fused experts), its time
  less that of any such module inside it.
* **Cores** (:class:`CoreTime`): every outermost module whose class name holds ``Attention`` or
  ``MLP``, its time less that of its leaves: the attention's scores, softmax and weighted sum,
  an MLP's activation.
* **Rests**: per block (decoder layer) what its time leaves over, and outside the blocks what
  the whole forward, timed without hooks, leaves over (the residual adds, rotary tables, the
  loss). A rest found negative (timing noise) counts as zero.

Blocks that run the same computation (one class, the same modules of the same shapes) are
timed alike: each part's time is its mean over those blocks. Their differences are noise, and
equal prices let a budget weigh one layer's units against another's (``scope="layerwise"``
needs it).

The estimate (:func:`estimate_latency`) is a FLOP-proportional model calibrated per leaf: each
leaf's time times the fraction of its work kept, its parameters' kept elements over their dense
ones (a routed expert tensor counted per expert: a token still uses ``top_k`` experts, so removing
experts keeps its work, narrowing them does not); each core's time times the fraction of its first
projection's outputs kept (the heads, or an MLP's channels); each block's rest unless the block is
removed; the rest outside blocks always. The kept elements are those the masks keep
(:func:`~tensorplay.ao.pruning.structured.units.kept_grid.read_kept_grid`), so the model is read as
masked, before :func:`~tensorplay.ao.pruning.shrink`. It is an estimate: small matrices run below
the peak rate, so shrinking them saves less than their share of work (the benchmark
``benchmarks/bench_latency.py`` measures the gap); the table is only as steady as the device it
was measured on.

:class:`LatencyMeasure` prices each unit in the same model (what one unit frees, in picoseconds),
so a budget planner adds units exactly as it does parameters.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
    >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    >>> table = latency_table(model, LatencyBudget(0.5, input_shape=(4, 8), repeats=3))
    >>> [leaf.module for leaf in table.leaves], table.dense > 0
    (['0', '2'], True)
    >>> estimate_latency(model, table) == table.dense  # nothing pruned yet
    True
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch import Tensor, nn

from tensorplay.ao.pruning.calibration.batches import run_batch
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.parity.aliases import ParameterTable
from tensorplay.ao.pruning.structured.dependency.blocks import find_blocks
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup
from tensorplay.ao.pruning.structured.units.kept_grid import read_kept_grid
from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
from tensorplay.ao.pruning.structured.units.measures import Measure, routed_experts

__all__ = [
    "PICOSECONDS",
    "CoreTime",
    "LatencyMeasure",
    "LatencyTable",
    "LeafTime",
    "estimate_latency",
    "latency_table",
]

PICOSECONDS = 10**12
"""The scale of :class:`LatencyMeasure`'s integer counts: picoseconds per second."""

_CORE_NAMES = ("Attention", "MLP")


@dataclass(frozen=True)
class LeafTime:
    """One module holding parameters of its own, and its time.

    Args:
        module: Its name in the model.
        block: The block (decoder layer) it lies in, ``None`` outside the blocks.
        seconds: Its time per forward, less that of any leaf inside it.
        params: The canonical names of its own parameters.
        shapes: Their dense shapes.
        routed: Per parameter, whether it is a routed expert tensor (dim 0 its experts).

    Example:
        >>> leaf = LeafTime("fc", None, 1e-5, ("fc.weight",), ((4, 2),), (False,))
        >>> leaf.work({"fc.weight": (3, 2)})  # 6 of 8 elements kept
        0.75
    """

    module: str
    block: str | None
    seconds: float
    params: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    routed: tuple[bool, ...]

    def work(self, extents: Mapping[str, tuple[int, ...]]) -> float:
        """The fraction of its work the kept ``extents`` (per canonical name) keep."""
        dense = sum(_work(s, r) for s, r in zip(self.shapes, self.routed, strict=True))
        kept = sum(_work(extents[p], r) for p, r in zip(self.params, self.routed, strict=True))
        return kept / dense if dense else 1.0


@dataclass(frozen=True)
class CoreTime:
    """The computation of an attention or MLP module outside its leaves, and its time.

    Args:
        module: The attention or MLP module's name.
        block: The block it lies in, ``None`` outside the blocks.
        seconds: Its time per forward less its leaves'.
        param: The canonical name of its first projection's weight, whose outputs (heads,
            channels) its work is proportional to.
        dim: The dimension of that weight that indexes its outputs (1 for a ``Conv1D``).
        size: The dense number of those outputs.

    Example:
        >>> CoreTime("attn", None, 1e-5, "attn.q.weight", 0, 8).work({"attn.q.weight": (6, 8)})
        0.75
    """

    module: str
    block: str | None
    seconds: float
    param: str
    dim: int
    size: int

    def work(self, extents: Mapping[str, tuple[int, ...]]) -> float:
        """The fraction of its work the kept ``extents`` keep."""
        return extents[self.param][self.dim] / self.size


@dataclass(frozen=True)
class LatencyTable:
    """The latency of a dense model, per part (see the module).

    Args:
        device: The device it was measured on.
        total: The time of the whole forward, timed without hooks.
        leaves: Every leaf (:class:`LeafTime`).
        cores: Every core (:class:`CoreTime`).
        rests: Per block, by name, what its time leaves over.
        outside: What the whole forward leaves over outside the blocks' and the leaves' times.

    Example:
        >>> table = LatencyTable("cpu", 3e-5, (), (), (("layers.0", 1e-5),), 2e-5)
        >>> round(table.dense * 1e6, 9), LatencyTable.from_dict(table.to_dict()) == table
        (30.0, True)
    """

    device: str
    total: float
    leaves: tuple[LeafTime, ...]
    cores: tuple[CoreTime, ...]
    rests: tuple[tuple[str, float], ...]
    outside: float

    @property
    def dense(self) -> float:
        """The estimate of the dense model: every part's time summed (the measured
        :attr:`total`, but for rests clamped at zero)."""
        parts = [leaf.seconds for leaf in self.leaves] + [core.seconds for core in self.cores]
        return math.fsum([*parts, *(seconds for _, seconds in self.rests), self.outside])

    def estimate(self, extents: Mapping[str, tuple[int, ...]], dropped: Sequence[str]) -> float:
        """The estimated latency of the model whose tensors keep ``extents`` (per canonical
        name) and whose ``dropped`` blocks are removed."""
        gone = set(dropped)
        return math.fsum(
            [
                *(leaf.seconds * leaf.work(extents) for leaf in self.leaves),
                *(core.seconds * core.work(extents) for core in self.cores),
                *(seconds for block, seconds in self.rests if block not in gone),
                self.outside,
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (what a pruner's state holds), read back by :meth:`from_dict`."""
        return {
            "device": self.device,
            "total": self.total,
            "leaves": [
                [leaf.module, leaf.block, leaf.seconds, list(leaf.params),
                 [list(shape) for shape in leaf.shapes], list(leaf.routed)]
                for leaf in self.leaves
            ],
            "cores": [
                [core.module, core.block, core.seconds, core.param, core.dim, core.size]
                for core in self.cores
            ],
            "rests": [[block, seconds] for block, seconds in self.rests],
            "outside": self.outside,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyTable:
        """The table :meth:`to_dict` wrote.

        Raises:
            ValueError: A mapping of other keys or entries.
        """
        try:
            leaves = tuple(
                LeafTime(str(m), b, float(s), tuple(p), tuple(tuple(x) for x in shapes),
                         tuple(bool(r) for r in routed))
                for m, b, s, p, shapes, routed in data["leaves"]
            )  # fmt: skip
            cores = tuple(
                CoreTime(str(m), b, float(s), str(p), int(d), int(n))
                for m, b, s, p, d, n in data["cores"]
            )
            rests = tuple((str(block), float(seconds)) for block, seconds in data["rests"])
            return cls(
                str(data["device"]), float(data["total"]), leaves, cores, rests,
                float(data["outside"]),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"Expected a latency table as LatencyTable.to_dict() writes it, but got one "
                f"that cannot be read ({error!r})."
            ) from None

    def check_model(self, model: nn.Module) -> None:
        """Refuse a model other than the one measured: other leaves or other dense shapes
        (a shrunk model: estimate before shrinking).

        Raises:
            ValueError: Naming the first leaf that differs.
        """
        table = ParameterTable.of(model)
        shapes = {name: tuple(shape) for name, shape in table.shapes.items()}
        for leaf in self.leaves:
            for param, shape in zip(leaf.params, leaf.shapes, strict=True):
                if shapes.get(param) != shape:
                    raise ValueError(
                        f"Expected the model the latency table was measured on, with "
                        f"{param!r} of shape {shape}, but got "
                        f"{shapes.get(param, 'no such parameter')}: measure the table on this "
                        "model (a shrunk model is estimated before shrinking, from its masks)."
                    )


def latency_table(model: nn.Module, budget: LatencyBudget) -> LatencyTable:
    """Measure the latency of ``model`` per part, on its device, on ``budget``'s inputs (see
    the module). Nothing is left on the model: the timing hooks go on and come off through
    :mod:`~tensorplay.ao.pruning.edits.changes`, and every module's training flag is restored.

    Raises:
        ValueError: A model without parameters, whose forward fails on the inputs, or whose
            experts are of no known mixture-of-experts family (a token's work in them cannot
            be read).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)).train()
        >>> table = latency_table(model, LatencyBudget(0.5, input_shape=(2, 4), repeats=2))
        >>> len(table.leaves), model.training, len(model[0]._forward_hooks)
        (2, True, 0)
    """
    first = next(iter(model.parameters()), None)
    if first is None:
        raise ValueError(
            f"Expected a model with parameters for `target_latency`, but {type(model).__name__} "
            "has none."
        )
    device = first.device
    inputs = _inputs(model, budget, device, first.dtype)
    params = ParameterTable.of(model)
    try:  # a routed expert's work is per token, not per expert: they must be found
        routed = set(routed_experts(model, params))
    except ValueError as error:
        raise ValueError(str(error).replace("`target_active_params`", "`target_latency`")) from None
    found = find_blocks(model)
    blocks = found.block_names() if found is not None else []
    modules = dict(model.named_modules())
    leaves = [name for name, module in modules.items() if _own(module)]
    cores = _cores(modules, leaves)
    sync = _synchronizer(device)
    clock = _clock(device)
    with changes.trial():
        for module in modules.values():
            changes.set_attribute(module, "training", False)
        inclusive = _time_levels(
            model, inputs, budget, sync, [leaves, [core for core, _ in cores], blocks], clock
        )
        total = inclusive.pop("")
    timed = [*leaves, *(core for core, _ in cores), *blocks]
    exclusive = {name: max(0.0, inclusive[name] - _inner(inclusive, timed, name)) for name in timed}
    exclusive.update(_alike(modules, blocks, timed, exclusive))
    outside = max(0.0, total - sum(inclusive[name] for name in _outermost(timed)))
    canonical = params.canonical
    leaf_times = tuple(
        LeafTime(
            name, _block_of(name, blocks), exclusive[name],
            tuple(_canonical(canonical, name, local) for local, _ in _own(modules[name])),
            tuple(tuple(p.shape) for _, p in _own(modules[name])),
            tuple(_canonical(canonical, name, local) in routed for local, _ in _own(modules[name])),
        )
        for name in leaves
    )  # fmt: skip
    core_times = tuple(
        CoreTime(name, _block_of(name, blocks), exclusive[name], param, dim, size)
        for name, (param, dim, size) in ((n, _projection(modules, n, leaves, canonical))
                                         for n, _ in cores)
    )  # fmt: skip
    rests = tuple((block, exclusive[block]) for block in blocks)
    return LatencyTable(str(device), total, leaf_times, core_times, rests, outside)


def estimate_latency(model: nn.Module, table: LatencyTable) -> float:
    """The estimated latency of ``model`` as its masks leave it, in seconds, from ``table``
    measured on it dense (see the module).

    Raises:
        ValueError: A model other than the one measured (:meth:`LatencyTable.check_model`).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.parity.methods import custom_from_mask
        >>> leaf = LeafTime("0", None, 4e-6, ("0.weight", "0.bias"), ((4, 3), (4,)),
        ...                 (False, False))
        >>> table = LatencyTable("cpu", 5e-6, (leaf,), (), (), 1e-6)
        >>> model = nn.Sequential(nn.Linear(3, 4))
        >>> mask = torch.ones(4, 3)
        >>> mask[0] = 0  # one output row of four goes: its weights, not (yet) its bias
        >>> _ = custom_from_mask(model[0], "weight", mask)
        >>> round(estimate_latency(model, table) * 1e6, 6)  # 1 + 4 * (9 + 4) / 16
        4.25
    """
    table.check_model(model)
    experts = {param for leaf in table.leaves for param, r in zip(leaf.params, leaf.routed,
                                                                   strict=True) if r}  # fmt: skip
    grid = read_kept_grid(model, experts)
    return table.estimate(grid.extents, grid.dropped)


class LatencyMeasure(Measure):
    """The estimated latency (:func:`estimate_latency`), in picoseconds: what the model takes
    now and what one unit frees, the same model read per unit (a unit's share of each leaf's
    work, of its attention's or MLP's outputs, and its block's rest when it removes the block).
    Exact against :func:`estimate_latency` wherever each leaf is narrowed along one dimension
    only (every structure a pruner combines), to the rounding of a picosecond per unit.

    Args:
        model: The model measured.
        latency: Its table.
        table: Its parameters (read from ``model`` if not given).

    Example:
        >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
        >>> leaf = LeafTime("0", None, 8e-6, ("0.weight",), ((4, 3),), (False,))
        >>> table = LatencyTable("cpu", 1e-5, (leaf,), (), (), 2e-6)
        >>> measure = LatencyMeasure(nn.Sequential(nn.Linear(3, 4)), table)
        >>> row = UnitGroup("0", "channel", 4, (Slice("0.weight", 0),))  # 1 of 4 rows
        >>> measure.total, measure.price(row)  # 10 and 2 microseconds
        (10000000, 2000000)
    """

    option = "target_latency"
    label = "latency (s, estimated)"
    unit = "seconds"
    scale = PICOSECONDS

    def __init__(
        self, model: nn.Module, latency: LatencyTable, table: ParameterTable | None = None
    ) -> None:
        super().__init__(model, table)
        self.latency = latency
        self.total = round(latency.dense * PICOSECONDS)
        self._holders: dict[str, list[LeafTime]] = {}
        for leaf in latency.leaves:
            for param in leaf.params:
                self._holders.setdefault(param, []).append(leaf)
        self._cores: dict[str, list[CoreTime]] = {}
        for core in latency.cores:
            self._cores.setdefault(core.param, []).append(core)
        self._blocks = dict(latency.rests)
        self._block_params: dict[str, set[str]] = {}
        for leaf in latency.leaves:
            if leaf.block is not None:
                self._block_params.setdefault(leaf.block, set()).update(leaf.params)

    def price(self, group: UnitGroup) -> int:
        """What one unit of ``group`` frees, in picoseconds."""
        removed: dict[str, Fraction] = {}  # leaf -> work removed, in its elements
        outputs: dict[str, int] = {}  # core -> outputs removed
        whole: set[str] = set()
        for name, piece in group.distinct_slices(self._aliases):
            if piece.dim is None:
                whole.add(name)
            for leaf in self._holders.get(name, ()):
                removed[leaf.module] = removed.get(leaf.module, Fraction(0)) + self._work(
                    leaf, name, piece
                )
            for core in self._cores.get(name, ()):
                if piece.dim is None:
                    outputs[core.module] = core.size
                elif piece.dim == core.dim and piece.expert is None:
                    outputs[core.module] = outputs.get(core.module, 0) + piece.width
        seconds = Fraction(0)
        for leaf in self.latency.leaves:
            if leaf.module in removed:
                dense = sum(_work(s, r) for s, r in zip(leaf.shapes, leaf.routed, strict=True))
                seconds += Fraction(leaf.seconds) * min(removed[leaf.module] / dense, Fraction(1))
        for core in self.latency.cores:
            if core.module in outputs:
                seconds += Fraction(core.seconds) * Fraction(min(outputs[core.module], core.size),
                                                             core.size)  # fmt: skip
        for block, params in self._block_params.items():
            if params and params <= whole:
                seconds += Fraction(self._blocks[block])
        return round(seconds * PICOSECONDS)

    def _work(self, leaf: LeafTime, name: str, piece: Any) -> Fraction:
        """The work (elements, a routed tensor's per expert) ``piece`` of ``name`` removes."""
        routed = leaf.routed[leaf.params.index(name)]
        shape = leaf.shapes[leaf.params.index(name)]
        if not routed:
            return Fraction(self._numel(piece))
        if piece.dim == 0 and piece.expert is None:
            return Fraction(0)  # a whole expert: a token still uses top_k others as large
        return Fraction(self._numel(piece), shape[0])


def _work(shape: Sequence[int], routed: bool) -> int:
    """The work of a tensor of ``shape``: its elements, a routed expert tensor's one expert's."""
    return math.prod(shape[1:]) if routed else math.prod(shape)


def _own(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return list(module.named_parameters(recurse=False))


def _full(prefix: str, local: str) -> str:
    return f"{prefix}.{local}" if prefix else local


def _canonical(canonical: Mapping[str, str], prefix: str, local: str) -> str:
    """The canonical name of ``prefix.local`` (a masked tensor's ``_orig`` under its own)."""
    full = _full(prefix, local)
    if full not in canonical and full.endswith("_orig"):
        full = full.removesuffix("_orig")
    return canonical[full]


def _inside(name: str, outer: str) -> bool:
    return outer == "" or name.startswith(f"{outer}.")


def _block_of(name: str, blocks: Sequence[str]) -> str | None:
    return next((block for block in blocks if name == block or _inside(name, block)), None)


def _cores(modules: Mapping[str, nn.Module], leaves: Sequence[str]) -> list[tuple[str, nn.Module]]:
    """The outermost modules named ``*Attention*`` or ``*MLP*`` holding leaves and none of
    their own parameters."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in modules.items():
        kind = type(module).__name__
        if not any(word in kind for word in _CORE_NAMES) or _own(module) or not name:
            continue
        if any(_inside(name, outer) for outer, _ in found):
            continue
        if any(_inside(leaf, name) for leaf in leaves):
            found.append((name, module))
    return found


def _projection(
    modules: Mapping[str, nn.Module], core: str, leaves: Sequence[str], canonical: Mapping[str, str]
) -> tuple[str, int, int]:
    """The first leaf of ``core`` (in the order its modules are registered): its weight's
    canonical name, the dimension indexing its outputs and their number."""
    first = next(leaf for leaf in leaves if _inside(leaf, core))
    local, weight = _own(modules[first])[0]
    dim = 1 if type(modules[first]).__name__ == "Conv1D" else 0
    return _canonical(canonical, first, local), dim, int(weight.shape[dim])


def _alike(
    modules: Mapping[str, nn.Module],
    blocks: Sequence[str],
    timed: Sequence[str],
    times: Mapping[str, float],
) -> dict[str, float]:
    """The times of the blocks that run the same computation (one class, the same timed
    modules inside, of the same classes and parameter shapes) and of each of their parts,
    averaged over those blocks: their differences are timing noise, and equal blocks priced
    alike let a budget compare their units (a layer with a layer, one layer's channels with
    another's)."""
    alike: dict[tuple[Any, ...], list[str]] = {}
    for block in blocks:
        inside = [name for name in timed if _inside(name, block)]
        key = (
            type(modules[block]).__name__,
            tuple(
                (name[len(block):], type(modules[name]).__name__,
                 tuple(tuple(p.shape) for _, p in _own(modules[name])))
                for name in inside
            ),
        )  # fmt: skip
        alike.setdefault(key, []).append(block)
    found: dict[str, float] = {}
    for members in alike.values():
        first = members[0]
        parts = [""] + [name[len(first) :] for name in timed if _inside(name, first)]
        for part in parts:
            mean = statistics.fmean(times[f"{block}{part}"] for block in members)
            found.update({f"{block}{part}": mean for block in members})
    return found


def _outermost(names: Sequence[str]) -> list[str]:
    return [name for name in names if not any(_inside(name, other) for other in names
                                              if other != name)]  # fmt: skip


def _inner(times: Mapping[str, float], names: Sequence[str], outer: str) -> float:
    """The time of the outermost timed modules strictly inside ``outer``."""
    inside = [name for name in names if name != outer and _inside(name, outer)]
    return sum(times[name] for name in _outermost(inside))


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return lambda: None


def _clock(device: torch.device) -> Callable[[], float]:
    """The CPU time of this thread where the model runs on the CPU on one torch thread (other
    programs on the machine do not stretch it), else the wall clock."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def _time_levels(
    model: nn.Module,
    inputs: Any,
    budget: LatencyBudget,
    sync: Callable[[], None],
    levels: Sequence[Sequence[str]],
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Per module of ``levels``, and for the whole forward without hooks (under ``""``), the
    least over ``repeats`` forwards of its time per forward. Each round runs the forward once
    per level, hooks on that level's modules only (a hook's overhead never lands in another
    level's times), and the levels take turns, so a spell of load on the machine reaches them
    all alike."""
    modules = dict(model.named_modules())
    rounds = [[], *levels]
    samples: dict[str, list[float]] = {name: [] for level in rounds for name in [*level, ""]}
    with torch.no_grad():
        for index in range(budget.warmup + budget.repeats):
            for level in rounds:
                spent = dict.fromkeys(level, 0.0)
                started: dict[str, list[float]] = {name: [] for name in level}
                with changes.trial():
                    for name in level:
                        module = modules[name]
                        changes.hook(
                            module.register_forward_pre_hook, _start(started[name], sync, clock)
                        )
                        changes.hook(
                            module.register_forward_hook,
                            _stop(name, started, spent, sync, clock),
                        )
                    sync()
                    begun = clock()
                    _forward(model, inputs)
                    sync()
                    took = clock() - begun
                if index < budget.warmup:
                    continue
                if not level:
                    samples[""].append(took)
                for name in level:
                    samples[name].append(spent[name])
    return {name: min(values) for name, values in samples.items() if values}


def _start(
    stack: list[float], sync: Callable[[], None], clock: Callable[[], float]
) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any) -> None:
        sync()
        stack.append(clock())

    return hook


def _stop(
    name: str,
    started: dict[str, list[float]],
    spent: dict[str, float],
    sync: Callable[[], None],
    clock: Callable[[], float],
) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        sync()
        spent[name] += clock() - started[name].pop()

    return hook


def _forward(model: nn.Module, inputs: Any) -> None:
    try:
        run_batch(model, inputs)
    except Exception as error:
        raise ValueError(
            f"Expected the forward of {type(model).__name__} to run on `target_latency`'s "
            f"inputs (what it is timed on), but it raised {error!r}."
        ) from error


def _inputs(
    model: nn.Module, budget: LatencyBudget, device: torch.device, dtype: torch.dtype
) -> Any:
    """``budget``'s inputs on ``device``: its example inputs, or inputs of its shape."""
    if budget.input_shape is None:
        return _moved(budget.example_inputs, device)
    generator = torch.Generator().manual_seed(0)
    shape = tuple(budget.input_shape)
    embeddings = getattr(model, "get_input_embeddings", None)
    found = embeddings() if callable(embeddings) else None
    if isinstance(found, nn.Embedding):
        ids = torch.randint(0, found.num_embeddings, shape, generator=generator)
        return ids.to(device)
    floating = dtype if dtype.is_floating_point else torch.float32
    return torch.randn(shape, generator=generator).to(device=device, dtype=floating)


def _moved(value: Any, device: torch.device) -> Any:
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return {key: _moved(item, device) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(_moved(item, device) for item in value)
    return value
