"""What a budget counts: parameters, active parameters or bytes, of a model and of each unit.

A budget (``target_params=``, ``target_active_params=``, ``target_memory=``) is a bound on one
*measure* of the model that :func:`~tensorplay.ao.pruning.structured.shrinking.shrink.shrink`
leaves. Each measure here says what the model holds now (:attr:`Measure.total`) and what one
unit of a group frees (:meth:`Measure.price`), in integers, so the planner
(:mod:`~tensorplay.ao.pruning.structured.units.budget_space`) adds them exactly:

* **Parameters** (:class:`ParamsMeasure`): every parameter, tied ones once.
* **Active parameters** (:class:`ActiveMeasure`): what one token computes with. Every parameter
  outside the routed experts, and per mixture-of-experts layer ``top_k`` experts' parameters,
  ``top_k`` times the layer's expert tensors divided by its number of experts (the router's
  ``top_k``; the shared expert and the router count whole). The fused expert tensors store one
  width for every expert of a layer, so this mean is one expert's size and the count is exact.
  Hence what each unit frees: an FFN channel or a head its parameters; a routed expert's
  channel (all experts of a layer keep one width) ``top_k / num_experts`` of its parameters;
  an expert only its router row (the others are as large: a token still uses ``top_k`` of
  them); a layer its parameters with its experts counted as above. Counts are kept multiplied
  by :attr:`Measure.scale`, the least common multiple of the layers' expert counts, so they
  stay integers. A dense model's active parameters are its parameters.
* **Memory** (:class:`MemoryMeasure`): the bytes of the weights and of the key/value cache at a
  :class:`~tensorplay.ao.pruning.structured.units.memory_setting.MemoryBudget`'s setting:
  ``parameters * element_size`` plus ``2 * layers * kv_heads * head_dim * context_length *
  batch_size * element_size``, the cache read from each attention module's key and value
  projections (``k_proj``, ``v_proj``: under grouped-query attention their widths are the
  key/value heads', not the query heads'). A unit frees its weights' bytes and the cache its
  key and value rows hold: a key/value head (with its query heads) ``2 * head_dim`` per cached
  position, a layer its attention's whole cache. Every layer caches every position (no sliding
  window). A model without attention modules has weights only.

Example:
    >>> import transformers
    >>> from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget
    >>> config = transformers.LlamaConfig(
    ...     vocab_size=16, hidden_size=16, intermediate_size=8, num_hidden_layers=2,
    ...     num_attention_heads=4, num_key_value_heads=2)
    >>> model = transformers.LlamaForCausalLM(config)
    >>> memory = MemoryMeasure(model, MemoryBudget(1, context_length=10, dtype="float16"))
    >>> params = ParamsMeasure(model).total
    >>> memory.total == 2 * params + 2 * 2 * (2 * 4) * 10 * 2  # weights + K and V of 2 layers
    True
    >>> ActiveMeasure(model).total == params  # dense: every parameter is active
    True
"""

from __future__ import annotations

import math
from typing import ClassVar

from torch import nn

from tensorplay.ao.pruning.parity.aliases import ParameterTable
from tensorplay.ao.pruning.structured.dependency.blocks import find_blocks, hf_config_of
from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice, UnitGroup
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget

__all__ = [
    "ActiveMeasure",
    "Measure",
    "MemoryMeasure",
    "ParamsMeasure",
    "kv_projections",
    "measures_of",
    "routed_experts",
]

_TOP_K_KEYS = ("num_experts_per_tok", "top_k", "moe_topk")


class Measure:
    """A measure of a model a budget bounds (see the module).

    Attributes:
        option: The argument that budgets it (``"target_params"``).
        label: What a report calls it.
        unit: What it counts (``"parameters"``, ``"bytes"``).
        scale: Counts are kept multiplied by it (integers).
        total: The model's measure when it was read, times :attr:`scale`.

    Example:
        >>> from tensorplay.ao.pruning.structured.dependency.unit_groups import Slice
        >>> row = UnitGroup("fc", "channel", 2, (Slice("weight", 0),))
        >>> ParamsMeasure(nn.Linear(3, 2)).price(row)  # one row of 3 weights
        3
    """

    option: ClassVar[str]
    label: ClassVar[str]
    unit: ClassVar[str] = "parameters"
    scale: int = 1
    total: int

    def __init__(self, model: nn.Module, table: ParameterTable | None = None) -> None:
        self._table = ParameterTable.of(model) if table is None else table
        self._shapes = self._table.shapes
        self._aliases = self._table.canonical

    def price(self, group: UnitGroup) -> int:
        """What one unit of ``group`` frees, times :attr:`scale`."""
        seen: set[tuple[str, int | None, int, int | None]] = set()
        count = 0
        for piece in group.slices:
            canonical = self._aliases.get(piece.parameter, piece.parameter)
            key = (canonical, piece.dim, piece.offset, piece.expert)
            if key not in seen:
                seen.add(key)
                count += self._slice_price(piece, canonical)
        return count

    def _numel(self, piece: Slice) -> int:
        """The elements of one unit's part of ``piece``."""
        shape = self._shapes[piece.parameter]
        numel = shape.numel() // (shape[0] if piece.expert is not None else 1)
        return numel if piece.dim is None else numel // shape[piece.dim] * piece.width

    def _slice_price(self, piece: Slice, canonical: str) -> int:
        return self._numel(piece) * self.scale


class ParamsMeasure(Measure):
    """Every parameter, tied ones once.

    Example:
        >>> ParamsMeasure(nn.Linear(3, 2)).total
        8
    """

    option = "target_params"
    label = "parameters"

    def __init__(self, model: nn.Module, table: ParameterTable | None = None) -> None:
        super().__init__(model, table)
        self.total = self._table.count


class ActiveMeasure(Measure):
    """The parameters one token computes with (see the module).

    Raises:
        ValueError: A model whose routed experts are found but not their ``top_k``, or that
            holds experts of no known mixture-of-experts family (:func:`routed_experts`).

    Example:
        >>> ActiveMeasure(nn.Linear(3, 2)).total
        8
    """

    option = "target_active_params"
    label = "active parameters"
    unit = "active parameters"

    def __init__(self, model: nn.Module, table: ParameterTable | None = None) -> None:
        super().__init__(model, table)
        self._routed = routed_experts(model, self._table)  # tensor -> (top_k, experts)
        self.scale = math.lcm(1, *(experts for _, experts in self._routed.values()))
        whole = self._table.count * self.scale
        routed = sum(
            self._shapes[name].numel() * (self.scale - self.scale // experts * top_k)
            for name, (top_k, experts) in self._routed.items()
        )
        self.total = whole - routed

    def _slice_price(self, piece: Slice, canonical: str) -> int:
        found = self._routed.get(canonical)
        if found is None:
            return self._numel(piece) * self.scale
        top_k, experts = found
        if piece.dim == 0 and piece.expert is None:
            return 0  # a whole expert: the others are as large, a token still uses top_k
        return self._numel(piece) * (self.scale // experts) * top_k


class MemoryMeasure(Measure):
    """The bytes of the weights and the key/value cache at ``setting`` (see the module).

    Raises:
        ValueError: An attention module whose key/value layout cannot be read
            (:func:`kv_projections`).

    Example:
        >>> measure = MemoryMeasure(nn.Linear(3, 2), MemoryBudget(1, context_length=8))
        >>> measure.total  # 8 parameters of 2 bytes, no attention
        16
    """

    option = "target_memory"
    label = "memory (bytes)"
    unit = "bytes"

    def __init__(
        self, model: nn.Module, setting: MemoryBudget, table: ParameterTable | None = None
    ) -> None:
        super().__init__(model, table)
        self._kv = set(kv_projections(model, self._table))
        self._element = setting.element_size
        self._cached = setting.context_length * setting.batch_size * self._element
        rows = sum(self._shapes[name][0] for name in self._kv)
        self.total = self._table.count * self._element + rows * self._cached

    def _slice_price(self, piece: Slice, canonical: str) -> int:
        price = self._numel(piece) * self._element
        if canonical in self._kv and piece.expert is None and piece.dim in (None, 0):
            rows = self._shapes[piece.parameter][0] if piece.dim is None else piece.width
            price += rows * self._cached
        return price


def routed_experts(
    model: nn.Module, table: ParameterTable | None = None
) -> dict[str, tuple[int, int]]:
    """Each routed expert tensor of ``model`` (its canonical name) with its layer's ``top_k``
    and number of experts: the fused tensors of the mixture-of-experts layers the dependency
    analysis knows (:mod:`~tensorplay.ao.pruning.structured.dependency.families.moe`), ``top_k``
    read from the router. Empty for a dense model.

    Raises:
        ValueError: A model whose config names experts per token (``num_experts_per_tok``) or
            that holds an ``experts`` module, but whose routed experts are not found: their
            ``top_k`` cannot be read.

    Example:
        >>> routed_experts(nn.Linear(2, 2))
        {}
    """
    aliases = (ParameterTable.of(model) if table is None else table).canonical
    found: dict[str, tuple[int, int]] = {}
    blocks = find_blocks(model)
    layers = 0
    if blocks is not None:
        for name, block in zip(blocks.block_names(), blocks.blocks, strict=True):
            units = blocks.family.units(name, block)
            if units.expert is None or units.routing is None:
                continue
            layers += 1
            router = f"{units.routing.router}."
            for piece in units.expert.slices:
                if not piece.parameter.startswith(router):
                    canonical = aliases.get(piece.parameter, piece.parameter)
                    found[canonical] = (units.routing.top_k, units.expert.size)
    expected = _moe_modules(model)
    if len(expected) > layers:
        raise ValueError(
            f"Expected the routed experts of {type(model).__name__} and their router's top_k "
            f"(a router with an int `top_k`, fused expert tensors) for `target_active_params`, "
            f"but {expected[layers]!r} is not a mixture-of-experts layer tensorplay knows: the "
            "parameters one token uses cannot be counted. Known: Qwen2-MoE, Qwen3-MoE, "
            "Mixtral, OLMoE."
        )
    return found


def _moe_modules(model: nn.Module) -> list[str]:
    """The modules named ``experts`` in ``model`` (each an MoE layer's), or, if its config names
    experts per token and none is so named, the model itself."""
    named = [name for name, _ in model.named_modules() if name.rpartition(".")[2] == "experts"]
    configs = [hf_config_of(module) for module in model.modules()]
    per_token = any(
        isinstance(getattr(config, key, None), int) and getattr(config, key) > 0
        for config in configs
        if config is not None
        for key in _TOP_K_KEYS
    )
    return named or ([type(model).__name__] if per_token else [])


def kv_projections(model: nn.Module, table: ParameterTable | None = None) -> list[str]:
    """The key and value projection weights of every attention module of ``model`` (canonical
    names): ``<attention>.k_proj.weight`` and ``<attention>.v_proj.weight``, whose output
    widths are what one position of the key/value cache holds (under grouped-query attention,
    the key/value heads times ``head_dim``). An attention module is one whose class name holds
    ``"Attention"``; one inside another is the outer one's.

    Raises:
        ValueError: An attention module without ``nn.Linear`` ``k_proj`` and ``v_proj`` (a
            fused query/key/value projection, an encoder's ``key``/``value``), naming it.

    Example:
        >>> kv_projections(nn.Sequential(nn.Linear(2, 2)))
        []
    """
    aliases = (ParameterTable.of(model) if table is None else table).canonical
    found: list[str] = []
    outer: list[str] = []
    for name, module in model.named_modules():
        if "attention" not in type(module).__name__.lower():
            continue
        if any(name.startswith(f"{prefix}.") for prefix in outer):
            continue
        outer.append(name)
        projections = [getattr(module, key, None) for key in ("k_proj", "v_proj")]
        if not all(isinstance(projection, nn.Linear) for projection in projections):
            raise ValueError(
                f"Expected the key/value projections `k_proj` and `v_proj` (nn.Linear) of the "
                f"attention module {name!r} ({type(module).__name__}) for `target_memory`, but "
                "it has none: the key/value cache it holds cannot be read. Use `target_params` "
                "or `target_active_params`."
            )
        prefix = f"{name}." if name else ""
        found += [aliases[f"{prefix}{key}.weight"] for key in ("k_proj", "v_proj")]
    return found


def measures_of(
    model: nn.Module,
    memory: MemoryBudget | None,
    *,
    active: bool,
    table: ParameterTable | None = None,
) -> dict[str, Measure]:
    """The measures a report shows, by option: parameters always, active parameters with
    ``active``, memory with a ``memory`` setting.

    Raises:
        ValueError: As :class:`ActiveMeasure` and :class:`MemoryMeasure`.

    Example:
        >>> list(measures_of(nn.Linear(2, 2), None, active=True))
        ['target_params', 'target_active_params']
    """
    table = ParameterTable.of(model) if table is None else table
    found: dict[str, Measure] = {"target_params": ParamsMeasure(model, table)}
    if active:
        found["target_active_params"] = ActiveMeasure(model, table)
    if memory is not None:
        found["target_memory"] = MemoryMeasure(model, memory, table)
    return found
