"""The lifecycle of a pruner inside a training framework, once for every adapter.

A training framework calls its callbacks at its own events; what the pruner needs at those
events is the same in every framework: build it from a
:class:`~tensorplay.ao.pruning.pruner.config.PrunerConfig` with rank zero's seed and give every
target its mask before a checkpoint's weights are loaded; attach the optimizers when the
masking mode hooks them, hand them over for state resets and take the rewind snapshot when
training starts; before each optimizer step mask the gradients and accumulate gradient scores;
take the pruning step of the framework's global step; report; and at the end detach, report and
make the pruning permanent if asked. :class:`PruningSession` does all of it and imports no
framework: an adapter owns one and maps its framework's hooks onto it, a guard and one call each
(``callbacks/lightning/gradual_pruning.py`` for Lightning,
``callbacks/transformers/gradual_pruning_callback.py`` for the Hugging Face Trainer).

Example:
    >>> import torch
    >>> from torch import nn
    >>> from tensorplay.ao.pruning.pruner.schedules import LinearSchedule
    >>> config, options = split_arguments({"schedule": LinearSchedule(0.5, end_step=2),
    ...                                    "verbose": False})
    >>> session = PruningSession(config, options, name="MyAdapter", built_when="fit starts")
    >>> model = nn.Linear(4, 4)
    >>> _ = session.build(model)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> session.start([optimizer])
    >>> for step in range(1, 3):  # the framework's loop
    ...     model(torch.randn(2, 4)).sum().backward()
    ...     session.before_optimizer_step(optimizer)
    ...     optimizer.step()
    ...     _ = session.step(step)
    >>> session.metrics()["pruning/sparsity"]
    0.5
    >>> session.finish()
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from tensorplay.ao.pruning.calibration.batches import Forward
from tensorplay.ao.pruning.distillation.distill import attached_distillation
from tensorplay.ao.pruning.distillation.sharded_copy import check_gatherable
from tensorplay.ao.pruning.edits import changes
from tensorplay.ao.pruning.imports import import_path
from tensorplay.ao.pruning.masking.optimizer_hooks import OptimizerAttachment
from tensorplay.ao.pruning.masking.stats import SparsityReport
from tensorplay.ao.pruning.pruner.conductor import Pruner
from tensorplay.ao.pruning.pruner.config import BUDGETS, PrunerConfig
from tensorplay.ao.pruning.pruner.gradual_search import RunPruner, SearchedPruner, pruner_parts
from tensorplay.ao.pruning.pruner.schedules import schedule_from_dict
from tensorplay.ao.pruning.pruner.search_grid import SearchGrid, check_search, check_search_score
from tensorplay.ao.pruning.saving.permanent_saves import (
    PermanentSaves,
    kept_zeros,
    restore_masks,
    save_permanent,
)
from tensorplay.ao.pruning.selection.sharding import first_sharded
from tensorplay.ao.pruning.structured.dependency.blocks import find_blocks
from tensorplay.ao.pruning.structured.dependency.graph import DependencyGraph
from tensorplay.ao.pruning.structured.dependency.recorded import recorded_groups
from tensorplay.ao.pruning.structured.dependency.unit_groups import UnitGroup
from tensorplay.ao.pruning.structured.shrinking.gathered import gather_shrunk, write_shrunk
from tensorplay.ao.pruning.structured.shrinking.reshape import ShrunkShapes
from tensorplay.ao.pruning.structured.shrinking.shrink import shrink
from tensorplay.ao.pruning.structured.shrinking.shrink_report import ShrinkReport
from tensorplay.ao.pruning.structured.units.latency_setting import LatencyBudget
from tensorplay.ao.pruning.structured.units.memory_setting import MemoryBudget
from tensorplay.ao.pruning.structured.units.routing import routed_around
from tensorplay.ao.pruning.targets.parameters import method_name

from .distilling import Distilling, check_distill_arguments
from .example_inputs import ExampleInputs, FirstForward, check_example_inputs
from .metrics import pruning_metrics
from .state_keys import pruner_state

__all__ = [
    "AdapterOptions",
    "Option",
    "PruningRollbackWarning",
    "PruningSession",
    "SessionOptions",
    "check_options",
    "plain_arguments",
    "split_arguments",
]


class PruningRollbackWarning(UserWarning):
    """A checkpoint loaded after training took the model back to fewer pruned units than the
    run had reached (a framework's best-model reload); it says both sparsities and the fix.

    Example:
        >>> issubclass(PruningRollbackWarning, UserWarning)
        True
    """


@dataclass(frozen=True)
class AdapterOptions:
    """The adapters' arguments that are not the pruner's (:class:`PrunerConfig` holds those).

    Args:
        log_per_tensor: Also report ``pruning/sparsity/<module>.<name>``.
        make_permanent: At the end of training, drop the masks, keeping the zeros.
        reset_optimizer_state: Give the pruner the framework's optimizers, whose state it
            clears after each pruning event.
        verbose: Report each pruning event and the final sparsity table (on rank zero).
        shrink_at_end: At the end of training, remove the pruned units physically
            (:func:`~tensorplay.ao.pruning.shrink`; the pruning is made permanent first) and
            report the parameters and widths before and after (on rank zero). Under FSDP2 the
            sharded model stays as it is: it is gathered once on rank zero, to the CPU, and the
            shrunk copy is written to ``shrunk_dir``
            (:func:`~tensorplay.ao.pruning.save_shrunk`).
        shrunk_dir: Where ``shrink_at_end`` writes the shrunk model on rank zero
            (:func:`~tensorplay.ao.pruning.structured.shrinking.gathered.write_shrunk`: a Hugging
            Face model's ``save_pretrained`` folder, else ``model.pt``); ``None``: nowhere on one
            device or under DDP (the model itself is shrunk), the adapter's default folder under
            FSDP2.
        distill_weight: The weight of the distillation term added to the task loss (0: off).
        distill_temperature: Its temperature.
        teacher: The teacher; ``None``: a frozen dense copy of the model taken just before the
            first pruning step.
        example_inputs: Inputs of a plain model's forward (a tensor or a tuple of positional
            inputs) that tracing it for ``structure="channel"`` takes; ``None``: the
            framework's, or those of the model's first training forward. Like ``teacher``, it
            has no plain-data form (a YAML config leaves it out).
        search_batches: With ``search=True``, the calibration batches the candidates are
            realized and scored on when the pruner is built (read into a list; no plain-data
            form).
        search_forward: With ``search=True``, how a batch runs through the model the adapter
            prunes, returning a scalar loss: ``forward(model, batch)``; ``None``:
            ``model(**batch)`` for a mapping (a causal LM's loss where it holds ``input_ids``),
            ``model(*batch)`` for a tuple, else ``model(batch)`` (see
            :func:`~tensorplay.ao.pruning.prune_one_shot`).
        search_grid: With ``search=True``, the allocations searched (an int: shares in
            multiples of its inverse; or a list of mappings from kind to share); ``None``: 4.
        search_score: With ``search=True``, ``"loss"`` or ``"kl"`` (against the dense model).
        search_allocation: With ``search=True``, the mix to prune to instead of a search (a
            row's ``allocation`` of ``search_report()``); a resumed run passes its state's.

    Raises:
        TypeError: A distillation argument of the wrong type; ``example_inputs`` neither a
            tensor nor a tuple.
        ValueError: ``distill_weight`` < 0 or ``distill_temperature`` <= 0.
    """

    log_per_tensor: bool = False
    make_permanent: bool = False
    reset_optimizer_state: bool = False
    verbose: bool = True
    shrink_at_end: bool = False
    shrunk_dir: str | None = None
    distill_weight: float = 0.0
    distill_temperature: float = 2.0
    teacher: nn.Module | None = None
    example_inputs: ExampleInputs | None = field(default=None, compare=False)
    search_batches: Sequence[Any] | None = field(default=None, compare=False)
    search_forward: Forward | None = field(default=None, compare=False)
    search_grid: SearchGrid | None = None
    search_score: Literal["loss", "kl"] = "loss"
    search_allocation: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        check_distill_arguments(self.distill_weight, self.distill_temperature, self.teacher)
        check_example_inputs(self.example_inputs)

    @property
    def distilling(self) -> bool:
        """Whether a distillation term is added (``distill_weight > 0``)."""
        return self.distill_weight > 0


class Option:
    """A callback attribute that reads and sets the option of the same name of the callback's
    session (``callback.verbose = False``), so the options live in one place.

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> class Adapter:
        ...     verbose = Option()
        ...     def __init__(self):
        ...         config, options = split_arguments({"schedule": OneShotSchedule(0.5)})
        ...         self._session = PruningSession(config, options, name="A", built_when="")
        >>> adapter = Adapter()
        >>> adapter.verbose = False
        >>> adapter.verbose, adapter._session.options.verbose
        (False, False)
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, callback: Any, owner: type | None = None) -> Any:
        if callback is None:
            return self
        return getattr(callback._session.options, self.name)

    def __set__(self, callback: Any, value: Any) -> None:
        session = callback._session
        session.options = replace(session.options, **{self.name: value})


class SessionOptions:
    """What every adapter exposes of its session: the checked configuration, and each field of
    :class:`AdapterOptions` as an attribute that reads and sets it (``callback.verbose = False``).
    An adapter inherits it and sets ``self._session``; a new option is one line here.

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> class Adapter(SessionOptions):
        ...     def __init__(self):
        ...         config, options = split_arguments({"schedule": OneShotSchedule(0.5)})
        ...         self._session = PruningSession(config, options, name="A", built_when="")
        >>> adapter = Adapter()
        >>> adapter.shrink_at_end = True
        >>> adapter.shrink_at_end, adapter.config.scope
        (True, 'global')
    """

    _session: PruningSession

    @property
    def config(self) -> PrunerConfig:
        """The pruner's configuration, checked when the callback was made."""
        return self._session.config

    @property
    def report(self) -> SparsityReport:
        """The sparsity report (per group or tensor, and in all), also after ``shrink_at_end``:
        then the one read just before shrinking, as ``pruner.report()`` would have given it
        (the pruner itself is spent by shrinking). Before the pruner is built, a
        ``RuntimeError``."""
        return self._session.report()

    @property
    def shrink_report(self) -> ShrinkReport | None:
        """What ``shrink_at_end`` removed: parameters and widths before and after (``None``
        until the model is shrunk)."""
        return self._session.shrink_report

    @property
    def shrunk_model(self) -> nn.Module | None:
        """The model ``shrink_at_end`` shrank: the trained model itself on one device or under
        DDP; under FSDP2, where the trained model stays sharded, the unsharded copy gathered
        and shrunk on rank zero (on the CPU; ``None`` on the other ranks). ``None`` until
        then."""
        return self._session.shrunk_model

    log_per_tensor = Option()
    make_permanent = Option()
    reset_optimizer_state = Option()
    verbose = Option()
    shrink_at_end = Option()
    shrunk_dir = Option()
    distill_weight = Option()
    distill_temperature = Option()
    teacher = Option()
    example_inputs = Option()
    search_batches = Option()
    search_forward = Option()
    search_grid = Option()
    search_score = Option()
    search_allocation = Option()


_CONFIG_FIELDS = tuple(field.name for field in fields(PrunerConfig))
_OPTION_FIELDS = tuple(field.name for field in fields(AdapterOptions))


def split_arguments(arguments: Mapping[str, Any]) -> tuple[PrunerConfig, AdapterOptions]:
    """An adapter's constructor arguments (by name), split into the pruner's configuration
    (checked by :class:`PrunerConfig`) and the adapter's options. An adapter passes its own
    arguments through (``locals()`` at the top of its ``__init__``), so an argument added to the
    adapters is read here, in one place. A ``schedule`` given in its
    :meth:`~tensorplay.ao.pruning.pruner.schedules.Schedule.to_dict` form (as
    :func:`plain_arguments` writes it) is rebuilt.

    Raises:
        TypeError: A name that is neither a field of :class:`PrunerConfig` nor of
            :class:`AdapterOptions`; as :class:`PrunerConfig`.
        ValueError: As :class:`PrunerConfig` and
            :func:`~tensorplay.ao.pruning.pruner.schedules.schedule_from_dict`.

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> config, options = split_arguments({"schedule": OneShotSchedule(0.5), "verbose": False})
        >>> config.scope, options.verbose
        ('global', False)
    """
    given = {name: value for name, value in arguments.items() if name not in ("self", "__class__")}
    unknown = sorted(set(given) - set(_CONFIG_FIELDS) - set(_OPTION_FIELDS))
    if unknown:
        raise TypeError(
            f"Expected the arguments of a pruning adapter to be fields of PrunerConfig or "
            f"AdapterOptions, but got {unknown}."
        )
    if isinstance(given.get("schedule"), Mapping):
        given["schedule"] = schedule_from_dict(given["schedule"])
    config = PrunerConfig(**{name: given[name] for name in _CONFIG_FIELDS if name in given})
    options = AdapterOptions(**{name: given[name] for name in _OPTION_FIELDS if name in given})
    check_options(config, options)
    return config, options


def check_options(config: PrunerConfig, options: AdapterOptions) -> None:
    """Refuse options that contradict the configuration: ``shrink_at_end`` or
    ``example_inputs`` with single weights; a search without batches, or search options
    without a search.

    Raises:
        TypeError, ValueError: Naming both.
    """
    check_search_options(config, options)
    if options.example_inputs is not None and config.structure == "element":
        raise ValueError(
            "Expected `structure` to be 'channel' with `example_inputs` (they are traced to find "
            "a plain model's channels), but got structure='element': single weights need no "
            "tracing. Choose structure='channel', or leave example_inputs=None."
        )
    if options.shrink_at_end and config.structure == "element":
        raise ValueError(
            "Expected `structure` to be 'channel', 'head' or 'layer' with shrink_at_end=True, "
            "but got structure='element': single weights leave no unit to remove, so nothing "
            "would shrink. Choose a structure, or make_permanent=True to keep the zeros."
        )


_SEARCH_OPTIONS = (
    "search_batches",
    "search_forward",
    "search_grid",
    "search_score",
    "search_allocation",
)


def check_search_options(config: PrunerConfig, options: AdapterOptions) -> None:
    """With ``search=True``: calibration batches, a grid or an allocation (not both) over the
    searched kinds, a known score; without it: none of the search's options (they would be
    ignored).

    Raises:
        TypeError, ValueError: Naming the option and the value.

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import CubicSchedule
        >>> config = PrunerConfig(CubicSchedule(end_step=10), structure=("layer", "hidden"),
        ...                       target_params=0.8, search=True)
        >>> check_search_options(config, AdapterOptions())
        Traceback (most recent call last):
        ...
        ValueError: Expected `search_batches` (the calibration batches the candidates are ...
    """
    if not config.search:
        given = [name for name in _SEARCH_OPTIONS if getattr(options, name) != _DEFAULTS[name]]
        if given:
            raise ValueError(
                f"Expected search=True with {given}, but got search=False: they set up the "
                "search of the mix of kinds. Pass search=True, or leave them out."
            )
        return
    if options.search_batches is None or isinstance(options.search_batches, (str, bytes)):
        raise ValueError(
            "Expected `search_batches` (the calibration batches the candidates are realized "
            f"and scored on) with search=True, but got {options.search_batches!r}."
        )
    if options.search_forward is not None and not callable(options.search_forward):
        raise TypeError(
            f"Expected `search_forward` to be callable or None, but got {options.search_forward!r}."
        )
    check_search_score(options.search_score)
    budgets = {name: getattr(config, name) for name in BUDGETS}
    check_search(
        config.structure, budgets, options.search_grid, config.importance,
        options.search_allocation,
    )  # fmt: skip


_DEFAULTS = {name: getattr(AdapterOptions(), name) for name in _SEARCH_OPTIONS}


def plain_arguments(config: PrunerConfig, options: AdapterOptions) -> dict[str, Any] | None:
    """The adapter arguments that :func:`split_arguments` turns into ``config`` and
    ``options``, as plain data (JSON or YAML): the schedule in its ``to_dict`` form, classes by
    import path. ``None`` if something has no such form (a lambda schedule, a class defined in a
    function).

    Example:
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> plain = plain_arguments(*split_arguments({"schedule": OneShotSchedule(0.5)}))
        >>> plain["schedule"], plain["method"], plain["verbose"]
        ({'class_path': 'tensorplay.ao.pruning.pruner.schedules.OneShotSchedule', 'init_args':
        {'sparsity': 0.5, 'step': 0}}, 'l1_unstructured', True)
        >>> split_arguments(plain)[0].schedule == OneShotSchedule(0.5)
        True
    """
    try:
        schedule = config.schedule.to_dict()
    except (TypeError, ValueError):
        return None
    plain: dict[str, Any] = {"schedule": schedule, "method": method_name(config.method_class)}
    for name in _CONFIG_FIELDS:
        if name in plain:
            continue
        value = getattr(config, name)
        if isinstance(value, MemoryBudget):
            value = value.to_dict()  # PrunerConfig builds it back from the mapping
        if isinstance(value, LatencyBudget):
            if value.input_shape is None:
                return None  # timed on example tensors, which have no plain-data form
            value = value.to_dict()
        if isinstance(value, Sequence) and not isinstance(value, str):
            value = [item if isinstance(item, str) else import_path(item) for item in value]
            if None in value:
                return None
        plain[name] = value
    if any(getattr(options, name) is not None for name in _UNPLAIN_OPTIONS):
        return None  # a module, tensors, batches and a function have no plain-data form
    plain.update({name: getattr(options, name) for name in _OPTION_FIELDS})
    return plain


_UNPLAIN_OPTIONS = ("teacher", "example_inputs", "search_batches", "search_forward")

_FAR_STEP = 2**62  # "any later step" for a schedule's latest pruning step


def shrink_groups(
    pruner: RunPruner, example_inputs: ExampleInputs | None = None
) -> list[UnitGroup] | None:
    """The groups of units of ``pruner``'s structure (channels, heads, layers or experts), whose
    pruned units shrinking removes: those the pruner recorded on the model when it was built
    (never re-derived), else the model's dependency graph (traced with ``example_inputs``, as the
    pruner's was) asked for that kind. A searched run's: ``None``, every group its kinds'
    pruners recorded (:func:`~tensorplay.ao.pruning.shrink`'s default)."""
    if isinstance(pruner, SearchedPruner):
        return None
    kind = pruner.config.structure
    recorded = [group for group in recorded_groups(pruner.model) if group.kind == kind]
    return recorded or DependencyGraph(pruner.model, example_inputs).groups(kind)


def refuse_steps(optimizer: Optimizer, name: str) -> None:
    """Make ``optimizer`` (a framework's wrapper unwrapped) raise when it steps: it holds the
    tensors of the model before shrinking, and its state their shapes.

    Example:
        >>> import torch
        >>> optimizer = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
        >>> refuse_steps(optimizer, "Adapter")
        >>> optimizer.step()
        Traceback (most recent call last):
        ...
        RuntimeError: Expected a new optimizer for the shrunk model, but this one was made ...
    """
    while isinstance(getattr(optimizer, "optimizer", None), Optimizer):
        optimizer = optimizer.optimizer  # type: ignore[attr-defined]

    def refuse(*_: Any) -> None:
        raise RuntimeError(
            "Expected a new optimizer for the shrunk model, but this one was made before "
            f"{name}(shrink_at_end=True) shrank it: it holds the tensors the model had, and "
            "their state. Build a new optimizer from the model's parameters."
        )

    changes.hook(optimizer.register_step_pre_hook, refuse)


def rank_zero_value(value: int) -> int:
    """``value`` as rank zero has it, when a ``torch.distributed`` process group is up.

    Example:
        >>> rank_zero_value(7)  # one process
        7
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    values = [value]
    torch.distributed.broadcast_object_list(values, src=0)
    return int(values[0])


def check_one_choice(pruner: SearchedPruner, name: str) -> None:
    """Refuse a searched run whose ranks chose different mixes or different layers (their
    models or batches differed when the pruner was built), when a ``torch.distributed``
    process group is up: each rank would prune a model of its own.

    Raises:
        RuntimeError: Naming each rank's choice and the fix.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    mine = {"allocation": pruner.allocation, "dropped": list(pruner.dropped)}
    found: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(found, mine)
    if any(choice != found[0] for choice in found):
        raise RuntimeError(
            f"{name}: expected every rank to choose one mix of kinds and the same layers, but "
            f"they chose {found} (by rank): the model's weights or the calibration batches "
            "differed between ranks when the pruner was built. Seed every rank alike before "
            "the model is made (seed_everything, TrainingArguments(seed=...)) and give every "
            "rank the same search_batches, or pass search_allocation=."
        )


def on_rank_zero() -> bool:
    """Whether this process is rank zero (or the only one).

    Example:
        >>> on_rank_zero()
        True
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return True
    return torch.distributed.get_rank() == 0


def inform_on_rank_zero(message: str) -> None:
    """Log ``message`` at ``INFO`` on rank zero (the ``tensorplay.callbacks`` logger): the
    default way a session reports."""
    if on_rank_zero():
        logging.getLogger("tensorplay.callbacks").info(message)


class PruningSession:
    """One pruner's life in a training framework, whatever the framework.

    Args:
        config: The pruner's configuration.
        options: The adapter's options.
        name: The adapter's name, heading its messages.
        built_when: When the adapter builds the pruner, for the error of :attr:`pruner`
            before then (``"`Trainer.fit` has set it up"``).
        inform: How a message reaches the user on rank zero (the framework's logger).
        permanent_saves: Make every save of the model the permanent form
            (:mod:`~tensorplay.ao.pruning.saving.permanent_saves`): the framework's default save
            then writes a model that loads without tensorplay, and :meth:`kept_zeros` with
            :meth:`load_state_dict` bring the exact masks back.
        rollback_hint: What the user can do when a checkpoint loaded after training takes the
            model back to fewer pruned units (the framework's best-model reload), appended to
            the :class:`PruningRollbackWarning`.
        on_error: Called after :meth:`close` when a forward of the run failed in a hook of the
            session (a teacher refused): the adapter takes its own hooks off there.
    """

    def __init__(
        self,
        config: PrunerConfig,
        options: AdapterOptions,
        *,
        name: str,
        built_when: str,
        inform: Callable[[str], None] = inform_on_rank_zero,
        permanent_saves: bool = False,
        rollback_hint: str = "",
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.options = options
        self.name = name
        self._built_when = built_when
        self._inform = inform
        self._permanent_saves = permanent_saves
        self._rollback_hint = rollback_hint
        self._pruner: RunPruner | None = None
        self._saves: list[PermanentSaves] | None = None
        self._attachment: OptimizerAttachment | None = None
        self._pending: tuple[dict[str, Any], Mapping[str, Tensor] | None] | None = None
        self._report: SparsityReport | None = None  # the last counts, re-read when they change
        self._optimizers: list[Optimizer] = []
        # What shrinking removed, and the shrunk layout of the model itself (None under FSDP2,
        # where a gathered copy is shrunk: the model keeps its shapes).
        self._shrunk: tuple[ShrinkReport, ShrunkShapes | None] | None = None
        self._shrunk_model: nn.Module | None = None
        self._state_when_shrunk: dict[str, Any] = {}  # the spent pruner's last state
        self._inputs: ExampleInputs | None = None  # what the pruner's model was traced with
        self._first_forward: FirstForward | None = None
        #: The distillation from the teacher (``distill_weight > 0``).
        self.distilling = Distilling(name, on_error=self._failed)
        self._on_error = on_error

    @property
    def built(self) -> bool:
        """Whether the pruner exists."""
        return self._pruner is not None

    @property
    def pruner(self) -> RunPruner:
        """The pruner (before :meth:`build`, a ``RuntimeError``): a
        :class:`~tensorplay.ao.pruning.pruner.gradual_search.SearchedPruner` with
        ``search=True``."""
        if self._pruner is None:
            raise RuntimeError(f"`{self.name}.pruner` exists once {self._built_when}.")
        return self._pruner

    def built_for(self, model: nn.Module) -> bool:
        """Whether the pruner exists and prunes ``model``."""
        return self._pruner is not None and self._pruner.model is model

    @property
    def waiting(self) -> bool:
        """Whether the pruner waits for the inputs of the model's first training forward (see
        :meth:`build_or_wait`)."""
        return self._first_forward is not None

    def needs_inputs(self, model: nn.Module, example_inputs: ExampleInputs | None) -> bool:
        """Whether building the pruner of ``model`` needs example inputs that neither the
        options nor ``example_inputs`` give: ``structure="channel"`` on a model of no Hugging
        Face family, which is traced."""
        given = self.options.example_inputs if example_inputs is None else example_inputs
        return self.config.structure == "channel" and given is None and find_blocks(model) is None

    @changes.atomic
    def build_or_wait(
        self,
        model: nn.Module,
        example_inputs: ExampleInputs | None = None,
        *,
        broadcast: Callable[[int], int] = rank_zero_value,
        check: Callable[[RunPruner], None] | None = None,
        permanent_saves: bool | None = None,
    ) -> bool:
        """:meth:`build` the pruner now and return ``True``; or, if tracing ``model`` needs
        inputs none gave (:meth:`needs_inputs`), record the inputs of its first training
        forward and return ``False``: :meth:`build_from_first_forward` builds it then.

        Args:
            model: The model the framework trains.
            example_inputs: The framework's example inputs (the options' come first).
            broadcast: As :meth:`build`.
            check: As :meth:`build`.
            permanent_saves: As :meth:`build`.
        """
        self.check_no_distillation(model)
        if self.needs_inputs(model, example_inputs):
            self.stop_waiting()
            self._first_forward = FirstForward(model)
            return False
        self.build(
            model, example_inputs, broadcast=broadcast, check=check, permanent_saves=permanent_saves
        )
        return True

    @changes.atomic
    def build_from_first_forward(
        self,
        *,
        broadcast: Callable[[int], int] = rank_zero_value,
        check: Callable[[RunPruner], None] | None = None,
        permanent_saves: bool | None = None,
    ) -> bool:
        """If the pruner waits and the model's first training forward has given its inputs:
        build it, traced with them, and return ``True``.

        Args:
            broadcast: As :meth:`build`.
            check: As :meth:`build`.
            permanent_saves: As :meth:`build`.

        Raises:
            RuntimeError: The framework's step ended with no training forward of the model
                (the loss was computed from a submodule: ``self.net(x)``, not ``self(x)``).
        """
        first = self._first_forward
        if first is None:
            return False
        if first.inputs is None:
            self.stop_waiting()
            raise RuntimeError(
                f"{self.name}: expected a training forward of {type(first.model).__name__} (the "
                "model the callback prunes) before the first optimizer step, to take the inputs "
                "that tracing it for structure='channel' needs, but none was seen: the loss was "
                "computed without calling the model itself. Pass `example_inputs` to the "
                "callback (in Lightning, or set `example_input_array`)."
            )
        self._first_forward = None
        self.build(
            first.model, first.inputs, broadcast=broadcast, check=check,
            permanent_saves=permanent_saves,
        )  # fmt: skip
        return True

    def check_no_distillation(self, model: nn.Module) -> None:
        """With ``distill_weight`` > 0, refuse a model that has a
        :class:`~tensorplay.ao.pruning.Distillation` attached already (before anything changes).

        Raises:
            RuntimeError: Naming the model and the fix.
        """
        if self.options.distilling and attached_distillation(model) is not None:
            raise RuntimeError(
                f"{self.name}: expected no Distillation attached to {type(model).__name__} "
                f"with distill_weight={self.options.distill_weight!r} (the callback attaches "
                "its own), but one is attached: two would each add a KD term to the loss. Set "
                "distill_weight=0 to distil with yours, or detach it (`distillation.detach()`)."
            )

    def stop_waiting(self) -> None:
        """Take the first-forward hook off the model, if it is still there."""
        if self._first_forward is not None:
            self._first_forward.remove()
            self._first_forward = None

    @changes.atomic
    def build(
        self,
        model: nn.Module,
        example_inputs: ExampleInputs | None = None,
        *,
        broadcast: Callable[[int], int] = rank_zero_value,
        check: Callable[[RunPruner], None] | None = None,
        permanent_saves: bool | None = None,
    ) -> RunPruner:
        """Build the pruner of ``model`` and give every target its mask, so that a checkpoint's
        weights load into the keys the model has at every step; load a state given early.

        Args:
            model: The model the framework trains.
            example_inputs: Inputs for tracing a plain model with ``structure="channel"`` (the
                options' come first); not used with single weights.
            broadcast: Rank zero's value of an int (the seed, so random methods draw the same
                masks on every rank).
            check: Called with the new pruner before the model changes (may raise).
            permanent_saves: ``False``: not for this model, whatever the session was made
                with (a model sharded with FSDP2, whose ``DTensor`` targets they cannot hook:
                its saves keep the masks, sharded like the weights); ``None``: the session's.
        """
        check_options(self.config, self.options)  # an option may be set after construction
        if self.options.shrink_at_end and first_sharded(model) is not None:
            check_gatherable(model)  # refuses, before training, what gathering cannot copy
        seed = torch.initial_seed() if self.config.seed is None else self.config.seed
        kwargs = {**self.config.as_kwargs(), "seed": int(broadcast(int(seed)))}
        given = self.options.example_inputs
        inputs = example_inputs if given is None else given
        if self.config.structure == "element":
            inputs = None  # single weights are not traced (the framework's inputs are ignored)
        pruner: RunPruner
        if self.config.search:
            pruner = self._searched(model, kwargs)
        else:
            pruner = Pruner(model, **kwargs, example_inputs=inputs)
        self._inputs = inputs
        if check is not None:
            check(pruner)
        self._pruner = pruner
        pruner.reparametrize()
        if self._permanent_saves and permanent_saves is not False:
            self._saves = [save_permanent(part) for part in pruner_parts(pruner)]
        self._load_pending()
        return pruner

    def _searched(self, model: nn.Module, kwargs: dict[str, Any]) -> SearchedPruner:
        """The searched run's pruner: the search on the calibration batches, the layers it
        chose removed, one pruner per width. With distillation from the dense model, the
        teacher is copied first: the depth goes now, before training starts."""
        options = self.options
        if options.distilling and options.teacher is None:
            self.distilling.copy_teacher(model)
        given = {name: kwargs.pop(name) for name in BUDGETS}
        for name in ("schedule", "structure", "importance", "scope"):
            kwargs.pop(name)
        pruner = SearchedPruner(
            model, self.config.schedule, options.search_batches or (),
            structure=self.config.structure,  # type: ignore[arg-type]  # checked: a tuple
            importance=self.config.importance, forward=options.search_forward,
            search_grid=options.search_grid, search_score=options.search_score,
            allocation=options.search_allocation, **given, **kwargs,
        )  # fmt: skip
        check_one_choice(pruner, self.name)
        return pruner

    @changes.atomic
    def start(self, optimizers: Sequence[Optimizer]) -> None:
        """Training starts with ``optimizers``: attach them when the masking mode hooks
        optimizers (the adapter masks the gradients in :meth:`before_optimizer_step`), hand
        them over for state resets if asked, and take the ``rewind="init"`` snapshot of the
        weights training starts from (as loaded or broadcast)."""
        pruner = self.pruner
        self.detach()  # the optimizers of an earlier run
        self._optimizers = list(optimizers)
        holding = [optimizer for optimizer in optimizers if pruner.held_by(optimizer)]
        if self.options.reset_optimizer_state:
            pruner.optimizers = holding
        if isinstance(pruner, Pruner):  # lean masks and rewinding: a searched run has neither
            if pruner.mode.hooks_optimizers and not pruner.permanent and holding:
                self._attachment = pruner.attach(*holding, mask_gradients=False, accumulate=False)
            if self.config.rewind == "init" and pruner.last_step < 0:
                pruner.take_snapshot()
        options = self.options
        self.distilling.start(
            pruner.model,
            teacher=options.teacher,
            weight=options.distill_weight,
            temperature=options.distill_temperature,
        )

    def before_optimizer_step(self, optimizer: Optimizer | None = None) -> None:
        """Before ``optimizer`` steps (after the gradients are final): with attached
        optimizers, zero the pruned weights' gradients (lean masks zero them as autograd
        accumulates them already, so clipping never sees them: this is the guarantee); add the
        gradients of the targets ``optimizer`` holds (all without it) to a gradient score (a
        no-op for other scores)."""
        pruner = self._pruner
        if pruner is None or pruner.permanent:
            return
        if self._attachment is not None:
            pruner.mask_gradients()
        pruner.accumulate(optimizer)

    @changes.atomic
    def step(self, step: int, *, report_every: int = 1) -> int | None:
        """Take pruning step ``step`` (the framework's global step: ``k`` right after the
        ``k``-th optimizer step), unless it is the step last taken.

        Args:
            step: The step.
            report_every: Re-read the counts for :meth:`metrics` on steps that are multiples
                of it (and whenever units are pruned); they change on pruning steps only.

        Returns:
            The units newly pruned, or ``None`` if ``step`` was taken already.
        """
        pruner, options = self.pruner, self.options
        # Before the step-taken check: a teacher restored after set-up (ModelParallelStrategy)
        # is attached at the resumed run's first call, the step it was saved at.
        self.distilling.before_step(
            pruner, step, weight=options.distill_weight, temperature=options.distill_temperature
        )
        if step == pruner.last_step:
            return None
        pruned = pruner.step(step)
        if pruned > 0 or self._report is None or step % max(1, report_every) == 0:
            self._report = pruner.report()
        if pruned > 0 and self.options.verbose:
            self._inform(
                f"{self.name}: step {step}: pruned {pruned} more units, sparsity "
                f"{self._report.sparsity:.4f} (target {pruner.target_sparsity(step):.4f})."
            )
        return pruned

    def metrics(self, *, fresh: bool = False) -> dict[str, float]:
        """The stable metrics (``pruning/sparsity`` ...) of the last counts read (``fresh``:
        read now; once the model is shrunk, those read just before)."""
        if self._report is None or (fresh and self._shrunk is None):
            self._report = self.pruner.report()
        return pruning_metrics(self.pruner, self._report, self.options.log_per_tensor)

    def finish(self, sharded_dir: str | None = None) -> None:
        """Training ended: :meth:`close`, report the final sparsity, shrink the model or make
        the pruning permanent if asked. ``sharded_dir``: the adapter's folder for the shrunk
        copy of a sharded model, where the options give none."""
        self.close()
        if self._pruner is None:
            return
        if self.options.verbose and self._shrunk is None:
            self._inform(f"{self.name}: final sparsity\n{self._pruner.report()}")
        if self.options.shrink_at_end and self._shrunk is None:
            self._shrink(sharded_dir)
        elif self.options.make_permanent and not self._pruner.permanent:
            self._pruner.make_permanent()
        if self._shrunk is None:
            self._warn_masked_experts()

    def report(self) -> SparsityReport:
        """The pruner's sparsity report: read now while the pruner is live, the one read just
        before ``shrink_at_end`` once the model is shrunk (the pruner is then spent)."""
        if self._shrunk is None or self._report is None:
            self._report = self.pruner.report()
        return self._report

    @property
    def shrink_report(self) -> ShrinkReport | None:
        """What :meth:`finish` removed with ``shrink_at_end`` (``None`` before)."""
        return None if self._shrunk is None else self._shrunk[0]

    @property
    def shrunk_shapes(self) -> ShrunkShapes | None:
        """The shrunk model's layout, for its checkpoints (``None`` unless the model itself
        was shrunk)."""
        return None if self._shrunk is None else self._shrunk[1]

    @property
    def shrunk_model(self) -> nn.Module | None:
        """The shrunk model: the pruner's model, or under FSDP2 the copy shrunk on rank zero
        (``None`` on the others, and before shrinking)."""
        return self._shrunk_model

    def _shrink(self, sharded_dir: str | None) -> None:
        """Make the pruning permanent and remove the pruned units: every rank holds the same
        masks, so every rank shrinks alike (rank zero writes ``shrunk_dir`` if given). The
        optimizers the framework trained with hold the old tensors: stepping one afterwards
        raises. A sharded model is shrunk in a copy gathered on rank zero instead, written to
        ``shrunk_dir`` or else ``sharded_dir``."""
        pruner = self.pruner
        self._warn_unfinished()
        directory = self.options.shrunk_dir
        if first_sharded(pruner.model) is not None:
            self._shrink_gathered(directory or sharded_dir)
            return
        found = find_blocks(pruner.model)
        layers = found.block_names() if found is not None else []
        groups = shrink_groups(pruner, self._inputs)
        if not pruner.permanent:
            pruner.make_permanent()
        # Shrinking spends the pruner: its last counts stay the metrics, its last state the
        # checkpoints' (SpentPrunerError for anything read from it afterwards).
        self._report = pruner.report()
        self._state_when_shrunk = pruner.state_dict()
        report = shrink(pruner.model, groups=groups)
        self._shrunk = (report, ShrunkShapes.of(pruner.model, report, layers))
        self._shrunk_model = pruner.model
        for optimizer in self._optimizers:
            refuse_steps(optimizer, self.name)
        written = ""
        if directory is not None and on_rank_zero():
            written = f" (written to {write_shrunk(pruner.model, directory)})"
        if self.options.verbose:
            self._inform(f"{self.name}: shrunk the model{written}\n{report}")

    def _shrink_gathered(self, directory: str | None) -> None:
        """Under FSDP2: gather the model on rank zero, shrink the copy there and write it to
        ``directory`` (every rank takes part; the sharded model and the pruner stay)."""
        if directory is None:
            raise ValueError(
                f"Expected a folder for the shrunk model of a sharded run, but {self.name} was "
                "given shrunk_dir=None and its framework none: pass shrunk_dir."
            )
        pruner = self.pruner
        self._report = pruner.report()
        gathered = gather_shrunk(pruner.model, groups=shrink_groups(pruner, self._inputs))
        gathered.write(directory)
        self._shrunk = (gathered.report, None)
        self._shrunk_model = gathered.model
        if self.options.verbose:
            self._inform(
                f"{self.name}: gathered the sharded model on rank zero and wrote it shrunk to "
                f"{directory}\n{gathered.report}"
            )

    def _warn_masked_experts(self) -> None:
        """Masked experts that stay in the model are routed around by a hook only: say what a
        save of the model then gives, and how to remove them."""
        routers = routed_around(self.pruner.model)
        if not routers:
            return
        warnings.warn(
            f"{self.name}: training ended with experts masked but not removed (routers "
            f"{', '.join(routers)}). Only tensorplay's routing hook keeps tokens off them: a "
            "model loaded without tensorplay from a folder or checkpoint saved now still routes "
            "tokens to them (a zero expert's router logit is 0, not -inf) and computes otherwise "
            "than this one. Set shrink_at_end=True, or call tensorplay.ao.pruning.shrink(model) "
            "before saving the model for use.",
            UserWarning,
            stacklevel=3,
        )

    def _warn_unfinished(self) -> None:
        """Shrinking ends pruning: say so when the schedule had pruning steps ahead."""
        pruner = self.pruner
        reached = pruner.target_sparsity()
        ahead = pruner.schedule.latest_pruning_step(max(pruner.last_step, 0), _FAR_STEP)
        if ahead is None or pruner.schedule(ahead) <= reached:
            return
        warnings.warn(
            f"{self.name}: training ended at step {pruner.last_step}, at a target sparsity of "
            f"{reached:.2%}, before the schedule's {pruner.schedule(ahead):.2%} (step {ahead}): "
            "shrink_at_end removes the units pruned so far. Train to the schedule's last "
            "pruning step (or end the schedule sooner) to shrink the model to its final size.",
            UserWarning,
            stacklevel=3,
        )

    def close(self) -> None:
        """Take off every hook the run put on the model and its optimizers: the first-forward
        hook, the teacher's, the optimizer attachment (the masks stay: they are the model's
        pruning). On every exit of a run, an exception's included."""
        self.stop_waiting()
        self.distilling.detach()
        self.detach()

    def _failed(self) -> None:
        self.close()
        if self._on_error is not None:
            self._on_error()

    def detach(self) -> None:
        """Take the hooks off the attached optimizers."""
        if self._attachment is not None:
            self._attachment.remove()
            self._attachment = None

    def state_dict(self) -> dict[str, Any]:
        """The pruner's :meth:`~tensorplay.ao.pruning.pruner.Pruner.state_dict` (``{}`` before
        it exists; once the model is shrunk, the state the pruner had then)."""
        if self._shrunk is not None:
            return dict(self._state_when_shrunk)
        return {} if self._pruner is None else self._pruner.state_dict()

    def kept_zeros(self) -> dict[str, Tensor]:
        """With permanent saves, what the saved zeros cannot tell: per target, its kept units
        that are exactly zero (:func:`~tensorplay.ao.pruning.saving.permanent_saves.kept_zeros`);
        save
        it beside the model's weights."""
        if self._saves is None:
            return {}
        found: dict[str, Tensor] = {}
        done: set[str] = set()  # a tensor two kinds prune holds one mask: read it once
        for part in pruner_parts(self.pruner):
            found.update(kept_zeros(part, [name for name in part.targets if name not in done]))
            done.update(part.targets)
        return found

    def weights_loaded(self) -> bool:
        """Whether weights in the permanent form were loaded into the targets since the last
        :meth:`load_state_dict`."""
        return self._saves is not None and any(saves.loaded() for saves in self._saves)

    @changes.atomic
    def load_state_dict(
        self, state: Mapping[str, Any], kept_zeros: Mapping[str, Tensor] | None = None
    ) -> None:
        """Restore the pruner's state (kept until it is built if early); tensorplay 0.1's
        callback state (``{"version": 1, "pruner", "seed", "snapshot"}``) is accepted. With
        permanent saves, the targets whose weights were loaded in the permanent form get the
        masks those weights were saved with, from their zeros and ``kept_zeros`` (what
        :meth:`kept_zeros` gave when they were saved).

        A state that takes the model back to fewer pruned units than the run had reached (a
        framework loading its best checkpoint after training) is restored, with a
        :class:`PruningRollbackWarning` that gives both sparsities.
        """
        self._pending = (pruner_state(dict(state)), kept_zeros)
        if self._pruner is not None:
            self._load_pending()

    def _load_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        state, kept = pending
        pruner = self.pruner
        reached = self._reached()
        if state:
            pruner.load_state_dict(state)
        restored: set[str] = set()  # a tensor two kinds prune holds one mask: write it once
        for saves in self._saves or ():
            loaded = [name for name in saves.loaded() if name not in restored]
            if loaded:
                names = set(saves.pruner.targets)
                mine = {name: zeros for name, zeros in (kept or {}).items() if name in names}
                restore_masks(saves.pruner, mine, loaded)
                restored.update(loaded)
            saves.forget_loads()
        self._report = pruner.report()
        if reached is not None and self._report.pruned < reached[1]:
            self._warn_rollback(reached, self._report)

    def _reached(self) -> tuple[int, int, float] | None:
        """``(step, pruned units, sparsity)`` the run had reached, if it has taken a step."""
        pruner = self.pruner
        if pruner.last_step < 0:
            return None
        report = self._report if self._report is not None else pruner.report()
        return pruner.last_step, report.pruned, report.sparsity

    def _warn_rollback(self, reached: tuple[int, int, float], now: SparsityReport) -> None:
        step, _, sparsity = reached
        warnings.warn(
            f"{self.name}: a checkpoint of step {self.pruner.last_step} was loaded into the "
            f"model after the run had reached step {step}: its targets are {now.sparsity:.2%} "
            f"sparse, not the {sparsity:.2%} the run had pruned them to. The model and the "
            f"pruner are now that checkpoint's. {self._rollback_hint}".rstrip(),
            PruningRollbackWarning,
            stacklevel=2,
        )
