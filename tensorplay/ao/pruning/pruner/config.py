"""The pruner's configuration: every argument that needs no model, checked once.

:class:`PrunerConfig` holds what :class:`~tensorplay.ao.pruning.pruner.Pruner` decides with, as
plain data, and checks it when it is made, one validator per rule. The pruner builds one from its
arguments and the Lightning callback builds one from its own, so a bad value fails with the same
message in both, before any model is touched.

Example:
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> PrunerConfig(OneShotSchedule(0.5), rewind="init").rewind
    'init'
    >>> PrunerConfig(OneShotSchedule(0.5), min_density="0.1")
    Traceback (most recent call last):
    ...
    TypeError: Expected `min_density` to be a float in [0, 1), but got '0.1'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, Literal

from tensorplay.ao.pruning.importance.registry import ACCUMULATOR_DTYPES, IMPORTANCES
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.method_selection import counts_itself
from tensorplay.ao.pruning.parity.methods import RandomUnstructured
from tensorplay.ao.pruning.pruner.schedules import Schedule
from tensorplay.ao.pruning.pruner.scopes import SCOPES, scope_choices
from tensorplay.ao.pruning.pruner.search_grid import check_search
from tensorplay.ao.pruning.structured.units import STRUCTURES, structure_choices
from tensorplay.ao.pruning.structured.units.budget import check_target_params
from tensorplay.ao.pruning.structured.units.combined import CombinedStructure, check_kinds
from tensorplay.ao.pruning.structured.units.latency_setting import (
    LatencyBudget,
    check_target_latency,
)
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget, check_target_memory
from tensorplay.ao.pruning.targets.parameters import (
    KeepDense,
    ModuleType,
    check_selection_args,
    resolve_method,
)

__all__ = [
    "AccumulatorDtype",
    "BUDGETS",
    "Masking",
    "PrunerConfig",
    "Rewind",
    "Scope",
    "Structure",
    "counts_itself",
]

Scope = Literal["global", "layerwise", "row"]
Structure = Literal["element", "channel", "head", "layer", "expert", "hidden"]
Rewind = Literal["none", "init", "step"]
Masking = Literal["reparametrize", "inplace"]
AccumulatorDtype = Literal["float32", "bfloat16"]

_REWINDS: tuple[str, ...] = ("none", "init", "step")
_MASKINGS: tuple[str, ...] = ("reparametrize", "inplace")


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``.

    Raises:
        TypeError: Not an int.
        ValueError: Below ``minimum``.

    Example:
        >>> check_int("rewind_step", 3, 0)
        3
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Expected `{name}` to be an int, but got {value!r}.")
    if value < minimum:
        raise ValueError(f"Expected `{name}` to be an int >= {minimum}, but got {value}.")
    return value


def _check_schedule(schedule: object) -> None:
    if not isinstance(schedule, Schedule):
        raise TypeError(f"Expected `schedule` to be a Schedule, but got {schedule!r}.")


def _check_parameters(parameters: object) -> None:
    if parameters is not None and not isinstance(parameters, str) and len(parameters) == 0:  # type: ignore[arg-type]
        raise ValueError(
            "Expected `parameters` to name at least one tensor, but got an empty sequence."
        )


def _check_scope(scope: object) -> None:
    if scope not in SCOPES:
        raise ValueError(f"Expected `scope` to be {scope_choices()}, but got {scope!r}.")


def _check_min_density(min_density: object) -> None:
    if isinstance(min_density, bool) or not isinstance(min_density, (int, float)):
        raise TypeError(f"Expected `min_density` to be a float in [0, 1), but got {min_density!r}.")
    if not 0.0 <= min_density < 1.0:
        raise ValueError(f"Expected `min_density` to be a float in [0, 1), but got {min_density}.")


def _check_rewind(rewind: object) -> None:
    if rewind not in _REWINDS:
        raise ValueError(f"Expected `rewind` to be one of {_REWINDS}, but got {rewind!r}.")


def _check_masking(masking: object) -> None:
    if masking not in _MASKINGS:
        raise ValueError(f"Expected `masking` to be one of {_MASKINGS}, but got {masking!r}.")


def _check_importance(
    importance: object, accumulator_dtype: object, method: type[BasePruningMethod]
) -> None:
    if importance not in IMPORTANCES:
        raise ValueError(
            f"Expected `importance` to be one of {tuple(IMPORTANCES)}, but got {importance!r}."
        )
    if accumulator_dtype not in ACCUMULATOR_DTYPES:
        raise ValueError(
            f"Expected `accumulator_dtype` to be one of {tuple(ACCUMULATOR_DTYPES)}, but got "
            f"{accumulator_dtype!r}."
        )
    if importance != "magnitude" and method.compute_mask is RandomUnstructured.compute_mask:
        raise ValueError(
            f"Expected a method that ranks by scores with importance={importance!r}, but got "
            "random_unstructured, which ignores them."
        )


def _check_structure(
    structure: object,
    multiple_of: object,
    method: type[BasePruningMethod],
    scope: str,
    importance: str,
) -> None:
    # Imported here: the structures reach the masking modes, which read this module.

    ranks = IMPORTANCES[importance].structures
    if isinstance(structure, tuple):
        check_kinds(structure)
        CombinedStructure.check_options(
            method, scope, importance, check_int("multiple_of", multiple_of, 1)
        )
        outside = [kind for kind in structure if ranks is not None and kind not in ranks]
        if outside:
            raise ValueError(
                f"Expected `structure` to hold only {' or '.join(map(repr, ranks or ()))} with "
                f"importance={importance!r}, but got {structure!r}: it scores those units only."
            )
        return
    kind = STRUCTURES.get(structure) if isinstance(structure, str) else None
    if kind is None:
        raise ValueError(
            f"Expected `structure` to be {structure_choices()}, but got {structure!r}."
        )
    multiple = check_int("multiple_of", multiple_of, 1)
    kind.check_options(method, scope, importance, multiple)
    if ranks is not None and structure not in ranks:
        raise ValueError(
            f"Expected `structure` to be {' or '.join(map(repr, ranks))} with "
            f"importance={importance!r}, but got {structure!r}: it scores those units only."
        )


def _structure_of(structure: object) -> object:
    """A list of kinds (YAML) as a tuple, a tuple of one kind as that kind."""
    if isinstance(structure, (list, tuple)):
        return structure[0] if len(structure) == 1 else tuple(structure)
    return structure


def _single_importance(importance: object) -> str:
    """A pruner's one score: ``None`` is ``"magnitude"``; a mapping (a score per kind) is a
    searched run's."""
    if importance is None:
        return "magnitude"
    if isinstance(importance, Mapping):
        raise ValueError(
            f"Expected `importance` to be a score's name, but got {dict(importance)!r}: a score "
            "per kind is for search=True, which ranks each kind on its own."
        )
    if not isinstance(importance, str):
        raise ValueError(
            f"Expected `importance` to be one of {tuple(IMPORTANCES)}, but got {importance!r}."
        )
    return importance


def _check_search_flag(search: object) -> bool:
    if not isinstance(search, bool):
        raise TypeError(f"Expected `search` to be a bool, but got {search!r}.")
    return search


_SEARCH_DEFAULTS = {
    "scope": "global",
    "multiple_of": 1,
    "masking": "reparametrize",
    "rewind": "none",
}
"""The options a searched run sets itself (every kind layerwise, masks in the forward) or
does not take, at their defaults."""


def _check_searched(config: PrunerConfig, budgets: Mapping[str, object]) -> None:
    """With ``search=True``: the searched kinds, a budget, a score per kind (or each kind's
    own), and none of the options the search sets."""
    check_search(config.structure, budgets, None, config.importance)
    importance = config.importance
    names = importance.values() if isinstance(importance, Mapping) else [importance]
    unknown = [name for name in names if name is not None and name not in IMPORTANCES]
    if unknown:
        raise ValueError(
            f"Expected `importance` to name scores among {tuple(IMPORTANCES)}, but got "
            f"{unknown[0]!r}."
        )
    for name, default in _SEARCH_DEFAULTS.items():
        if getattr(config, name) != default:
            raise ValueError(
                f"Expected {name}={default!r} (the default) with search=True, but got "
                f"{name}={getattr(config, name)!r}: a searched run prunes every kind "
                "layerwise to the shares the search chose, with the masks in the forward."
            )


BUDGETS = ("target_params", "target_active_params", "target_memory", "target_latency")
"""The budgets, each usable alone or with the others."""


def _check_budgets(
    budgets: dict[str, object], schedule: Schedule, structure: object, multiple_of: int
) -> None:
    """The budgets (``target_params``, ``target_active_params``: a positive int or a float in
    (0, 1]; ``target_memory`` a checked :class:`MemoryBudget`), with units that shrink and a
    schedule without a target of its own; a tuple of kinds needs one."""
    given = {name: value for name, value in budgets.items() if value is not None}
    if bool(given) == schedule.has_target():
        which = "both" if given else "neither"
        raise ValueError(
            "Expected exactly one of the schedule's final sparsity and budgets (`target_params`, "
            f"`target_active_params`, `target_memory`, `target_latency`), but got {which} "
            f"({schedule!r}, {_named(given)}): leave the schedule's target out to prune to a "
            "budget."
        )
    if not given:
        if isinstance(structure, tuple):
            raise ValueError(
                "Expected a budget (`target_params`, `target_active_params`, `target_memory` or "
                f"`target_latency`) with structure={structure!r}, but got none: units of several "
                "kinds are ranked by score per share of a budget removed."
            )
        return
    for name in ("target_params", "target_active_params"):
        if name in given:
            check_target_params(given[name], name)
    option = next(iter(given))
    if not isinstance(structure, tuple) and structure not in (
        "channel", "head", "layer", "expert", "hidden"
    ):  # fmt: skip
        raise ValueError(
            f"Expected `structure` to be 'channel', 'head', 'layer', 'expert', 'hidden' or a "
            f"tuple of kinds with `{option}`, but got {structure!r}: a budget counts what "
            "shrink() removes."
        )
    if multiple_of != 1:
        raise ValueError(
            f"Expected `multiple_of` to be 1 with `{option}`, but got {multiple_of}: "
            "budgets with rounded widths are not supported yet."
        )


def _named(given: dict[str, object]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in given.items()) or "no budget"


def _check_seed(seed: object) -> None:
    if seed is not None:
        check_int("seed", seed, 0)


def _check_method_options(method: type[BasePruningMethod], min_density: float, scope: str) -> None:
    if min_density > 0 and counts_itself(method):
        raise ValueError(
            f"Expected `min_density` to be 0 with a method that decides its own count "
            f"({method.__name__} takes no `amount`), but got {min_density}."
        )
    SCOPES[scope].check_method(method)


@dataclass(frozen=True)
class PrunerConfig:
    """What a :class:`~tensorplay.ao.pruning.pruner.Pruner` decides with, checked on creation.

    ``None`` selects the default. Sequences are kept as given, so the configuration reads back
    as it was written (e.g. in YAML).

    Args:
        schedule: Step to cumulative target sparsity; see
            :mod:`tensorplay.ao.pruning.pruner.schedules`.
        parameters: Fully qualified names of the tensors to prune, e.g. ``["fc1.weight"]``;
            default: those :func:`~tensorplay.ao.pruning.targets.select_parameters` selects
            with the five arguments below (the weights of every Linear, Conv, attention and
            Hugging Face ``Conv1D`` layer). Give either ``parameters`` or those.
        module_types: Module classes, class names or import paths whose parameters are
            selected; default :data:`~tensorplay.ao.pruning.targets.DEFAULT_MODULE_TYPES`.
        names: Parameter names inside those modules, e.g. ``["weight", "bias"]``; default
            :data:`~tensorplay.ao.pruning.targets.DEFAULT_NAMES`.
        include: Regexes (``re.search``) a selected name matches at least one of.
        exclude: Regexes a selected name matches none of.
        keep_dense: Any of ``"embeddings"``, ``"first"``, ``"last"``: leave the embeddings (and
            weights tied to them), the first or the last selected module dense.
        method: An unstructured pruning method: a class, a name (``"l1_unstructured"``,
            ``"random_unstructured"``) or an import path. One whose constructor takes no
            ``amount`` (an N:M method) decides its own count, applied to each target on its own
            on the pruning steps (:func:`counts_itself`).
        scope: ``"global"`` ranks all targets together, ``"layerwise"`` each on its own,
            ``"row"`` each output row of each target on its own (an output unit of a Linear,
            convolution or ``Conv1D``, whose rows are the stored tensor's columns; a tensor of
            fewer than two dimensions is one group): every row gets the same exact count,
            ``round(target * row_size)`` minus its pruned units
            (:mod:`~tensorplay.ao.pruning.structured.units.row_pruning`), with ``l1_unstructured``
            or ``random_unstructured``.
        min_density: No target (with a ``structure`` of units: no group) is pruned below this
            fraction of its units kept, in [0, 1). When the caps bind, the units a capped tensor
            cannot give up are taken from the others, still lowest score first; if all are
            capped, fewer units are pruned than asked.
        rewind: After each pruning step that pruned something, reset the unpruned values of the
            targets (lottery tickets, Frankle & Carbin 2019; weight rewinding, Renda et al.
            2020) to their values when the pruner was made (``"init"``) or right after step
            ``rewind_step`` (``"step"``, snapshot taken before that step prunes). Other
            parameters keep training. ``"none"``: no rewinding.
        rewind_step: The step whose values ``rewind="step"`` restores.
        seed: Seed of each pruning step's random draws: step ``t`` draws from ``seed + t`` in a
            forked RNG that neither disturbs nor depends on the training RNG, so masks of
            random methods are the same on every rank and after a resume. ``None``: draw from
            the global RNG.
        masking: How masks are held (:mod:`~tensorplay.ao.pruning.masking`):
            ``"reparametrize"``, torch's ``<name>_orig``/``<name>_mask``/hook, state_dicts that
            move to and from ``torch.nn.utils.prune``; or ``"inplace"``, the lean masks: a bool
            ``<name>_mask``, pruned weights zeroed in place and kept zero by the optimizers
            given to ``Pruner.attach``, pruned values gone once pruned (:ref:`lean-masks`).
            FSDP2 models (``DTensor`` parameters) need ``"inplace"``; counts and reports are
            then collectives (:mod:`~tensorplay.ao.pruning.selection.shards`).
        importance: What units are ranked by (:mod:`~tensorplay.ao.pruning.importance`):
            ``"magnitude"`` (the weights; the default), ``"movement"`` (``-sum_t w_t g_t``, Sanh
            et al. 2020), ``"taylor"`` (``sum_t |w_t g_t|``, Molchanov et al. 2019), both
            accumulated once per optimizer step (``Pruner.accumulate``), ``"wanda"``
            (``|W| * ||X_j||``, Sun et al. 2023, from forward hooks; with ``scope="row"``),
            ``"activation"`` (the activations each channel or head produces, Muralidharan et al.
            2024, from forward hooks; ``structure="channel"`` or ``"head"`` only:
            :mod:`~tensorplay.ao.pruning.importance.activation`), or,
            with ``structure="expert"`` only, ``"reap"`` and ``"frequency"`` (observed routing:
            :mod:`~tensorplay.ao.pruning.importance.expert_routing`). ``None``: ``"magnitude"``;
            with ``search=True``, each kind's own score (as
            :func:`~tensorplay.ao.pruning.prune_one_shot` ranks it), and a mapping from kind to
            name may give some kinds theirs.
        accumulator_dtype: ``"float32"`` (4 bytes per pruned parameter) or ``"bfloat16"`` (2)
            for the accumulated gradient scores and Wanda's input norms.
        structure: What one unit is (:mod:`~tensorplay.ao.pruning.structured.units`): ``"element"``
            (a single weight; the default), ``"channel"`` (an FFN neuron or a conv filter with
            every slice that depends on it: its bias, norm entries and the consumers' input
            columns), ``"head"`` (an attention head; under grouped-query attention a key/value
            head with its query heads), ``"layer"`` (a residual block) or ``"expert"`` (one
            expert of a mixture-of-experts layer,
            :mod:`~tensorplay.ao.pruning.structured.units.experts`; every layer keeps its ``top_k``
            experts), or a tuple of kinds (``("channel", "head")``, with ``target_params``). The
            schedule's sparsity then counts units of that kind, ``round(target * units)``, ranked by
            one score each (the root mean square of the element scores over the unit's weights),
            across the model (``scope="global"``) or within each group (``"layerwise"``); every
            group keeps at least one unit. Found by
            :class:`~tensorplay.ao.pruning.structured.dependency.graph.DependencyGraph`: Hugging
            Face families by their modules, other models by tracing (``Pruner``'s
            ``example_inputs``).
        multiple_of: With ``"channel"`` or ``"head"``, the width each group keeps is a
            multiple of it (8 for hardware): after each pruning step a group's kept width is
            rounded to the nearest multiple (half up; at least one multiple and
            ``min_density``'s floor), so the units pruned may differ from
            ``round(target * units)`` by up to ``multiple_of // 2`` per group; the history
            records the real count. A group narrower than it is refused when the pruner is
            built.
        target_params: Prune to a parameter budget instead of a fraction of units
            (:mod:`~tensorplay.ao.pruning.structured.units.budget`): an int, the parameters of the
            whole model after :func:`~tensorplay.ao.pruning.structured.shrinking.shrink.shrink`
            (tied ones once), or a float in (0, 1], that fraction of the model's parameters when the
            pruner is built. The schedule then has no target of its own (``CubicSchedule(
            end_step=...)``, ``OneShotSchedule()``) and gives the way there: at step ``t`` the
            parameters pruned are ``schedule(t) * (total - budget)``. Needs ``"channel"``,
            ``"head"``, ``"layer"``, ``"expert"`` or a tuple of kinds (a YAML list; a tuple
            needs a budget) and ``multiple_of=1``.
        target_active_params: A budget of the parameters one token uses, alone or with the
            other budgets (every budget given is met): a mixture-of-experts model's parameters
            outside the routed experts plus ``top_k`` experts per layer (a dense model's: all
            of them); an int or a float in (0, 1] as ``target_params``
            (:mod:`~tensorplay.ao.pruning.structured.units.measures`).
        target_memory: A budget of bytes at inference, the weights and the key/value cache at
            a batch size, context length and dtype: a
            :class:`~tensorplay.ao.pruning.structured.units.memory_setting.MemoryBudget` (or a
            mapping of its fields, as YAML gives it), alone or with the other budgets.
        target_latency: A budget of inference latency, a fraction of the dense model's,
            estimated from a table of the model's parts timed once on its device on given
            inputs: a
            :class:`~tensorplay.ao.pruning.structured.units.latency_setting.LatencyBudget` (or a
            mapping of its fields), alone or with the other budgets
            (:mod:`~tensorplay.ao.pruning.structured.units.latency`).
        search: Search the mix of the kinds of a ``structure`` tuple under the budgets (any of
            ``"layer"``, ``"hidden"``, ``"head"``, ``"channel"``, ``"expert"``), as
            :class:`~tensorplay.ao.pruning.pruner.gradual_search.SearchedPruner` does: for the
            training-framework adapters, which build one in place of a
            :class:`~tensorplay.ao.pruning.pruner.Pruner`. ``scope``, ``multiple_of``,
            ``masking`` and ``rewind`` stay at their defaults then.

    Raises:
        TypeError: A value of the wrong type (``schedule``, ``min_density``, ``rewind_step``,
            ``seed``, selection entries, ``method``).
        ValueError: A value out of range, an unknown ``scope``, ``rewind``, ``masking``,
            ``importance``, ``accumulator_dtype``, ``method`` or ``keep_dense`` entry,
            ``parameters`` together with a selection filter, ``min_density`` with a method that
            decides its own count, ``scope="row"`` with a method other than L1 or random, an
            importance with ``random_unstructured``, an unknown ``structure``, or a structured
            one with a method other than L1 or random, ``scope="row"``, ``"movement"`` or
            ``multiple_of`` on layers; ``multiple_of`` other than 1 on elements; with
            ``search=True``, a ``structure`` that is not a tuple of searched kinds, no budget,
            or an option the search sets.

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import CubicSchedule
        >>> config = PrunerConfig(CubicSchedule(0.8, end_step=100), method="random_unstructured")
        >>> config.method_class.__name__, config.scope, config.importance
        ('RandomUnstructured', 'global', 'magnitude')
        >>> searched = PrunerConfig(CubicSchedule(end_step=100), structure=["layer", "hidden"],
        ...                         target_params=0.75, search=True)
        >>> searched.structure, searched.importance
        (('layer', 'hidden'), None)
    """

    schedule: Schedule
    parameters: Sequence[str] | None = None
    module_types: Sequence[ModuleType] | None = None
    names: Sequence[str] | None = None
    include: Sequence[str] | None = None
    exclude: Sequence[str] | None = None
    keep_dense: Sequence[KeepDense] = ()
    method: str | type[BasePruningMethod] = "l1_unstructured"
    scope: Scope = "global"
    min_density: float = 0.0
    rewind: Rewind = "none"
    rewind_step: int = 0
    seed: int | None = None
    masking: Masking = "reparametrize"
    importance: str | Mapping[str, str] | None = None
    accumulator_dtype: AccumulatorDtype = "float32"
    structure: Structure | tuple[Structure, ...] = "element"
    multiple_of: int = 1
    target_params: int | float | None = None
    target_active_params: int | float | None = None
    target_memory: MemoryBudget | None = None
    target_latency: LatencyBudget | None = None
    search: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "structure", _structure_of(self.structure))
        object.__setattr__(self, "target_memory", check_target_memory(self.target_memory))
        object.__setattr__(self, "target_latency", check_target_latency(self.target_latency))
        _check_schedule(self.schedule)
        _check_parameters(self.parameters)
        check_selection_args(
            self.parameters,
            module_types=self.module_types,
            names=self.names,
            include=self.include,
            exclude=self.exclude,
            keep_dense=self.keep_dense,
        )
        _check_scope(self.scope)
        _check_min_density(self.min_density)
        _check_rewind(self.rewind)
        check_int("rewind_step", self.rewind_step, 0)
        _check_seed(self.seed)
        _check_masking(self.masking)
        _check_method_options(self.method_class, self.min_density, self.scope)
        budgets = {name: getattr(self, name) for name in BUDGETS}
        if _check_search_flag(self.search):
            _check_searched(self, budgets)
        else:
            importance = _single_importance(self.importance)
            object.__setattr__(self, "importance", importance)
            _check_importance(importance, self.accumulator_dtype, self.method_class)
            _check_structure(
                self.structure, self.multiple_of, self.method_class, self.scope, importance
            )
        _check_budgets(budgets, self.schedule, self.structure, self.multiple_of)

    def as_kwargs(self) -> dict[str, Any]:
        """The fields by name but ``search``: the keyword arguments of
        :class:`~tensorplay.ao.pruning.pruner.Pruner` that made this configuration (with
        ``search=True``: those of
        :class:`~tensorplay.ao.pruning.pruner.gradual_search.SearchedPruner`, the options
        among them).

        Example:
            >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
            >>> sorted(PrunerConfig(OneShotSchedule(0.5)).as_kwargs())[:4]
            ['accumulator_dtype', 'exclude', 'importance', 'include']
        """
        return {
            field.name: getattr(self, field.name)
            for field in fields(self)
            if field.name != "search"
        }

    @cached_property
    def method_class(self) -> type[BasePruningMethod]:
        """The pruning method's class (``method`` resolved)."""
        return resolve_method(self.method)
