"""Choosing what to prune: parameters by module type and name pattern, and the pruning method.

Targets are named by their fully qualified name in the model, ``"encoder.fc1.weight"``, the same
key the parameter has in ``model.state_dict()`` before pruning. Names are plain data: they go in a
config file or a checkpoint and are turned into ``(module, name)`` pairs with
:func:`resolve_parameters` when a model is at hand. A tensor that is already pruned is still found
under its own name (its parameter lives on as ``<name>_orig``).

The default selection is every weight a user would call a linear or convolution weight
(:data:`DEFAULT_MODULE_TYPES` with :data:`DEFAULT_NAMES`): ``nn.Linear`` and its subclasses,
``nn.Bilinear``, ``nn.Conv1d/2d/3d``, ``nn.ConvTranspose1d/2d/3d``, the input projections of
``nn.MultiheadAttention`` and Hugging Face's ``Conv1D`` (GPT-2's projections), recognised by class
name so that the core never imports ``transformers``. Embeddings, normalization layers and biases
are left out unless asked for.

Example:
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> select_parameters(model)
    ['0.weight', '2.weight']
    >>> select_parameters(model, names=("weight", "bias"), exclude=[r"^2\\."])
    ['0.weight', '0.bias']
    >>> select_parameters(model, keep_dense=["last"])
    ['0.weight']
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from torch import nn

from tensorplay.ao.pruning.frames import user_stacklevel
from tensorplay.ao.pruning.imports import import_object
from tensorplay.ao.pruning.pair import Pair
from tensorplay.ao.pruning.parity import methods as _methods
from tensorplay.ao.pruning.parity.aliases import TiedParameter, parameter_groups
from tensorplay.ao.pruning.parity.base import BasePruningMethod
from tensorplay.ao.pruning.parity.reparametrization import parameter_of

__all__ = [
    "DEFAULT_MODULE_TYPES",
    "DEFAULT_NAMES",
    "KEEP_DENSE",
    "KeepDense",
    "SelectionWarning",
    "check_exclusive",
    "check_selection_args",
    "method_name",
    "owner",
    "resolve_method",
    "resolve_parameters",
    "select_parameters",
]

ModuleType = type[nn.Module] | str
KeepDense = Literal["embeddings", "first", "last"]

#: The module classes whose weights are pruned by default. ``nn.Linear`` matches its subclasses
#: too (``NonDynamicallyQuantizableLinear``, the output projection of ``nn.MultiheadAttention``;
#: ``LazyLinear`` once initialized), and so do the convolutions (``LazyConv2d``...). ``"Conv1D"``
#: is Hugging Face's ``transformers.pytorch_utils.Conv1D`` (GPT-2, its weight is ``(in, out)``),
#: matched by class name; torch's ``nn.Conv1d`` is a different class. ``nn.Bilinear`` is a dense
#: layer whose whole computation is its weight, like ``nn.Linear``, so it is pruned too.
#: ``nn.MultiheadAttention`` holds its query/key/value projections as ``in_proj_weight`` (or
#: ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight`` when the key and value sizes differ),
#: which :data:`DEFAULT_NAMES` lists: they are the same linear maps that GPT-2's ``c_attn`` and
#: BERT's ``query``/``key``/``value`` hold, so leaving them out would prune a third of every
#: ``nn.TransformerEncoderLayer``'s attention less than the same layer written with ``nn.Linear``.
DEFAULT_MODULE_TYPES: tuple[ModuleType, ...] = (
    nn.Linear,
    nn.Bilinear,
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.MultiheadAttention,
    "Conv1D",
)

#: The parameter names selected by default in those modules: ``weight``, and the input projection
#: weights of ``nn.MultiheadAttention`` (no other module of :data:`DEFAULT_MODULE_TYPES` has them).
DEFAULT_NAMES: tuple[str, ...] = (
    "weight",
    "in_proj_weight",
    "q_proj_weight",
    "k_proj_weight",
    "v_proj_weight",
)

#: The allowed entries of ``keep_dense``.
KEEP_DENSE: tuple[str, ...] = ("embeddings", "first", "last")

_EMBEDDINGS: tuple[type[nn.Module], ...] = (nn.Embedding, nn.EmbeddingBag)
# The warning's thresholds: a selection under half of the weight tensors' parameters, next to a
# left-out module class holding a quarter of them, is a default that missed the model's layers.
_LOW_COVERAGE = 0.5
_LARGE_SHARE = 0.25


class SelectionWarning(UserWarning):
    """A selection that looks wrong for the model (see :func:`select_parameters`).

    Example:
        >>> import warnings
        >>> from torch import nn
        >>> model = nn.Sequential(nn.LSTM(8, 64), nn.Linear(64, 2))
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", SelectionWarning)  # silence it where intended
        ...     select_parameters(model)
        ['1.weight']
    """


def _as_tuple(name: str, value: object) -> tuple[object, ...]:
    if isinstance(value, (str, type)):
        return (value,)
    if not isinstance(value, Sequence):
        raise TypeError(f"Expected `{name}` to be a sequence, but got {value!r}.")
    return tuple(value)


def _module_matcher(module_types: Sequence[ModuleType]) -> list[type | str]:
    """Classes stay classes, import paths become classes, bare class names stay strings."""
    matchers: list[type | str] = []
    for entry in _as_tuple("module_types", module_types):
        if isinstance(entry, str) and "." in entry:
            entry = import_object(entry)
        if (isinstance(entry, type) and issubclass(entry, nn.Module)) or (
            isinstance(entry, str) and entry.isidentifier()
        ):
            matchers.append(entry)
        else:
            raise TypeError(
                "Expected `module_types` to hold nn.Module subclasses, class names or import "
                f"paths, but got {entry!r}."
            )
    return matchers


def _matches_type(module: nn.Module, matchers: list[type | str]) -> bool:
    mro_names = {cls.__name__ for cls in type(module).__mro__}
    return any(m in mro_names if isinstance(m, str) else isinstance(module, m) for m in matchers)


def _compile(name: str, patterns: Sequence[str] | None) -> list[re.Pattern[str]] | None:
    if patterns is None:
        return None
    compiled = []
    for pattern in _as_tuple(name, patterns):
        if not isinstance(pattern, str):
            raise TypeError(f"Expected `{name}` to hold regex strings, but got {pattern!r}.")
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            raise ValueError(
                f"Expected `{name}` to hold valid regexes, but got {pattern!r}: {error}."
            ) from error
    return compiled


def _names(names: Sequence[str]) -> tuple[str, ...]:
    wanted = _as_tuple("names", names)
    if not wanted:
        raise ValueError("Expected `names` to hold at least one parameter name, but got none.")
    for name in wanted:
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"Expected `names` to hold parameter names, but got {name!r}.")
    return wanted  # type: ignore[return-value]


def _keep_dense(keep_dense: Sequence[str]) -> tuple[str, ...]:
    entries = _as_tuple("keep_dense", keep_dense)
    for entry in entries:
        if entry not in KEEP_DENSE:
            raise ValueError(
                f"Expected `keep_dense` to hold entries of {KEEP_DENSE}, but got {entry!r}."
            )
    return tuple(dict.fromkeys(entries))  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Selection:
    """Validated selection arguments: every check of :func:`select_parameters` that needs no model.

    The Lightning callback builds one in its constructor, so a bad YAML value fails there with the
    same message as in the core.
    """

    matchers: tuple[type | str, ...]
    names: tuple[str, ...]
    include: tuple[re.Pattern[str], ...] | None
    exclude: tuple[re.Pattern[str], ...] | None
    keep_dense: tuple[str, ...]

    @classmethod
    def parse(
        cls,
        module_types: Sequence[ModuleType] = DEFAULT_MODULE_TYPES,
        names: Sequence[str] = DEFAULT_NAMES,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        keep_dense: Sequence[KeepDense] = (),
    ) -> _Selection:
        included = _compile("include", include)
        excluded = _compile("exclude", exclude)
        return cls(
            tuple(_module_matcher(module_types)),
            _names(names),
            None if included is None else tuple(included),
            None if excluded is None else tuple(excluded),
            _keep_dense(keep_dense),
        )

    def matches_type(self, module: nn.Module) -> bool:
        return _matches_type(module, list(self.matchers))

    def matches_name(self, fq_name: str) -> bool:
        if self.include is not None and not any(p.search(fq_name) for p in self.include):
            return False
        return self.exclude is None or not any(p.search(fq_name) for p in self.exclude)

    def describe(self) -> str:
        return (
            f"module_types={[getattr(m, '__name__', m) for m in self.matchers]}, "
            f"names={list(self.names)}, "
            f"include={None if self.include is None else [p.pattern for p in self.include]}, "
            f"exclude={None if self.exclude is None else [p.pattern for p in self.exclude]}, "
            f"keep_dense={list(self.keep_dense)}"
        )


def check_exclusive(
    parameters: object,
    *,
    module_types: object = None,
    names: object = None,
    include: object = None,
    exclude: object = None,
    keep_dense: object = (),
) -> None:
    """Refuse ``parameters`` given together with any selection filter.

    Raises:
        ValueError: Naming the filters that were given.

    Example:
        >>> check_exclusive(["0.weight"], include=["fc"])
        Traceback (most recent call last):
        ...
        ValueError: Expected either `parameters` or the selection filters ...
    """
    given = {
        key: value
        for key, value in (
            ("module_types", module_types),
            ("names", names),
            ("include", include),
            ("exclude", exclude),
        )
        if value is not None
    }
    if keep_dense:
        given["keep_dense"] = keep_dense
    if parameters is not None and given:
        listed = ", ".join(f"{key}={value!r}" for key, value in given.items())
        raise ValueError(
            "Expected either `parameters` or the selection filters (`module_types`, `names`, "
            f"`include`, `exclude`, `keep_dense`), but got parameters={parameters!r} with {listed}."
        )


def check_selection_args(
    parameters: object,
    *,
    module_types: Sequence[ModuleType] | None = None,
    names: Sequence[str] | None = None,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    keep_dense: Sequence[str] = (),
) -> None:
    """Every check of the selection arguments that needs no model (``None`` is the default).

    Raises:
        ValueError: or TypeError, with the messages of :func:`select_parameters`.

    Example:
        >>> check_selection_args(None, keep_dense=["middle"])
        Traceback (most recent call last):
        ...
        ValueError: Expected `keep_dense` to hold ...
    """
    check_exclusive(
        parameters,
        module_types=module_types,
        names=names,
        include=include,
        exclude=exclude,
        keep_dense=keep_dense,
    )
    if parameters is None:
        _Selection.parse(
            DEFAULT_MODULE_TYPES if module_types is None else module_types,
            DEFAULT_NAMES if names is None else names,
            include,
            exclude,
            keep_dense,  # type: ignore[arg-type]
        )


def owner(model: nn.Module, fq_name: str, expected: str) -> Pair:
    """The module that ``fq_name`` (``"net.0.weight"``) lives in, and the tensor's own name.

    Raises:
        ValueError: naming ``expected``, if the model has no such module.

    Example:
        >>> owner(nn.Sequential(nn.Linear(2, 2)), "0.weight", "a tensor")
        (Linear(in_features=2, out_features=2, bias=True), 'weight')
    """
    module_name, _, name = fq_name.rpartition(".")
    try:
        return model.get_submodule(module_name), name
    except AttributeError as error:
        raise ValueError(
            f"Expected {expected}, but the model has no module {module_name!r}."
        ) from error


@dataclass(frozen=True)
class _Match:
    """A ``(module, name)`` that passes every filter but ``keep_dense``."""

    fq_name: str
    module: nn.Module
    param: nn.Parameter


def _matches(model: nn.Module, groups: list[TiedParameter], selection: _Selection) -> list[_Match]:
    """Every matching ``(module, name)``, in module order, aliases of one parameter included."""
    held = {(id(module), name): group.parameter for group in groups for module, name in group.pairs}
    found: list[_Match] = []
    for module_name, module in model.named_modules():
        if not selection.matches_type(module):
            continue
        for name in selection.names:
            param = held.get((id(module), name))
            fq_name = f"{module_name}.{name}" if module_name else name
            if param is not None and selection.matches_name(fq_name):
                found.append(_Match(fq_name, module, param))
    return found


def _is_embedding(group: TiedParameter) -> bool:
    return any(isinstance(module, _EMBEDDINGS) for module, _ in group.pairs)


def _kept_dense(
    groups: list[TiedParameter], matches: list[_Match], keep_dense: tuple[str, ...]
) -> set[int]:
    """Ids of the parameters ``keep_dense`` leaves out, each entry judged on all matches."""
    dropped: set[int] = set()
    if "embeddings" in keep_dense:
        embedded = {id(group.parameter) for group in groups if _is_embedding(group)}
        dropped.update(id(m.param) for m in matches if id(m.param) in embedded)
    modules = list({id(m.module): m.module for m in matches}.values())
    ends = {"first": modules[:1], "last": modules[-1:]}
    for entry, chosen in ends.items():
        if entry in keep_dense:
            dropped.update(id(m.param) for m in matches if any(m.module is c for c in chosen))
    return dropped


def _check_initialized(selected: list[_Match]) -> None:
    for match in selected:
        if isinstance(match.param, nn.parameter.UninitializedParameter):
            raise ValueError(
                f"Expected initialized parameters, but ({type(match.module).__name__}, "
                f"{match.fq_name.rpartition('.')[2]!r}) at {match.fq_name!r} is uninitialized "
                "(a lazy module): run one forward pass before selecting."
            )


def select_parameters(
    model: nn.Module,
    *,
    module_types: Sequence[ModuleType] = DEFAULT_MODULE_TYPES,
    names: Sequence[str] = DEFAULT_NAMES,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    keep_dense: Sequence[KeepDense] = (),
) -> list[str]:
    """Fully qualified names of the parameters to prune, in module order.

    A parameter is a *candidate* when its module is an instance of one of ``module_types``, its
    name inside the module is in ``names``, its fully qualified name matches some ``include``
    regex (``re.search``; ``None`` matches all) and no ``exclude`` regex. A parameter reached
    through several modules (tied weights) is listed once, under its first candidate name.

    ``keep_dense`` then leaves out, as papers usually do (each entry judged on all candidates,
    and the union dropped):

    * ``"embeddings"``: every candidate held by an ``nn.Embedding`` or ``nn.EmbeddingBag``, or
      tied to one (GPT-2's ``lm_head.weight`` *is* ``transformer.wte.weight``, so it is dropped);
    * ``"first"``: the candidates of the first module, in registration order
      (``model.named_modules()``), that holds a candidate: the first layer of most models;
    * ``"last"``: those of the last such module: the output head of most models.

    Registration order is the order of the ``__init__`` assignments, which is the forward order
    for most models but not all; check with ``select_parameters(model)``.

    The selection warns (:class:`SelectionWarning`) when it looks wrong for the model: when all of
    it is embedding weights (or tied to them) while a module class left out by ``module_types`` or
    ``names`` holds weights, or when it covers under half of the floating-point parameters in
    tensors of 2 or more dimensions while such a class holds a quarter or more. Embeddings, and
    parameters dropped by ``include``, ``exclude`` or ``keep_dense``, count as deliberately left
    out. The warning names the class, its tensors and parameters, and the entry that would select
    it.

    Args:
        model: The model to search.
        module_types: Module classes, class names (``"Linear"``, matched against the class and
            its bases) or import paths (``"torch.nn.Linear"``); default
            :data:`DEFAULT_MODULE_TYPES`.
        names: Parameter names inside a module; default :data:`DEFAULT_NAMES` (``weight`` and
            the attention input projections).
        include: Regexes; keep names that match at least one.
        exclude: Regexes; drop names that match any.
        keep_dense: Any of ``"embeddings"``, ``"first"``, ``"last"``.

    Returns:
        Names such as ``"net.0.weight"``.

    Raises:
        ValueError: Nothing left to select (the message lists the filters), an invalid regex, an
            unknown ``keep_dense`` entry, no ``names``, or an uninitialized (lazy) parameter.
        TypeError: A ``module_types`` entry that is not a module class, name or import path, or
            a ``names`` entry that is not a parameter name.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(16, 2))
        >>> select_parameters(model, module_types=["Conv2d"])
        ['0.weight']
        >>> select_parameters(model, keep_dense=["first", "last"])
        Traceback (most recent call last):
        ...
        ValueError: Expected the selection to match at least one parameter, but none matched module_types=['Linear', 'Bilinear', 'Conv1d', 'Conv2d', 'Conv3d', 'ConvTranspose1d', 'ConvTranspose2d', 'ConvTranspose3d', 'MultiheadAttention', 'Conv1D'], names=['weight', 'in_proj_weight', 'q_proj_weight', 'k_proj_weight', 'v_proj_weight'], include=None, exclude=None, keep_dense=['first', 'last'].
    """  # noqa: E501
    selection = _Selection.parse(module_types, names, include, exclude, keep_dense)
    return _select(model, selection, parameter_groups(model))


def _select(model: nn.Module, selection: _Selection, groups: list[TiedParameter]) -> list[str]:
    """The names ``selection`` selects, ``groups`` being the model's parameters
    (:func:`~tensorplay.ao.pruning.parity.aliases.parameter_groups`)."""
    matches = _matches(model, groups, selection)
    dropped = _kept_dense(groups, matches, selection.keep_dense)
    seen: set[int] = set(dropped)
    selected: list[_Match] = []
    for match in matches:
        if id(match.param) not in seen:
            seen.add(id(match.param))
            selected.append(match)
    if not selected:
        raise ValueError(
            "Expected the selection to match at least one parameter, but none matched "
            f"{selection.describe()}."
        )
    _check_initialized(selected)
    _warn_if_suspicious(groups, selection, {id(m.param) for m in selected}, dropped)
    return [match.fq_name for match in selected]


@dataclass
class _LeftOut:
    """One module class whose weights the type or name filter left out."""

    cls: str
    type_matched: bool
    tensors: int = 0
    numel: int = 0
    names: dict[str, None] = field(default_factory=dict)


def _warn_if_suspicious(
    groups: list[TiedParameter], selection: _Selection, selected: set[int], dropped: set[int]
) -> None:
    """Warn when the selection misses the model's layers; see :func:`select_parameters`."""
    total = chosen = 0
    only_embeddings = True
    left_out: dict[str, _LeftOut] = {}
    for group in groups:
        param = group.parameter
        if (
            isinstance(param, nn.parameter.UninitializedParameter)
            or not param.is_floating_point()
            or param.dim() < 2
        ):
            continue
        total += param.numel()
        if id(param) in selected:
            chosen += param.numel()
            only_embeddings = only_embeddings and _is_embedding(group)
            continue
        if id(param) in dropped or _is_embedding(group) or _deliberate(group, selection):
            continue
        module, name = group.pairs[0]
        cls = type(module).__name__
        entry = left_out.setdefault(cls, _LeftOut(cls, selection.matches_type(module)))
        entry.tensors += 1
        entry.numel += param.numel()
        entry.names[name] = None
    only_embeddings = only_embeddings and chosen > 0
    if not left_out or total == 0:
        return
    ranked = sorted(left_out.values(), key=lambda e: -e.numel)
    low = chosen / total < _LOW_COVERAGE and ranked[0].numel / total >= _LARGE_SHARE
    if not (only_embeddings or low):
        return
    reason = ", all of it embedding weights or tied to them" if only_embeddings else ""
    classes = "; ".join(_describe_left_out(entry, selection) for entry in ranked[:3])
    warnings.warn(
        f"The selection looks incomplete: it holds {chosen:,} of the model's {total:,} "
        f"floating-point parameters in tensors of 2 or more dimensions "
        f"({chosen / total:.1%}){reason}, while `module_types`/`names` leave out "
        f"{classes}. Pass `module_types`/`names` (or `parameters`) to choose, or "
        "silence this with warnings.filterwarnings('ignore', category=SelectionWarning).",
        SelectionWarning,
        stacklevel=user_stacklevel(),
    )


def _deliberate(group: TiedParameter, selection: _Selection) -> bool:
    """Whether the type and name filters matched the group, so include/exclude left it out."""
    return any(
        selection.matches_type(module) and name in selection.names for module, name in group.pairs
    )


def _describe_left_out(entry: _LeftOut, selection: _Selection) -> str:
    new_names = [name for name in entry.names if name not in selection.names]
    hints = [] if entry.type_matched else [f"add {entry.cls!r} to `module_types`"]
    if new_names:
        hints.append(f"add {', '.join(map(repr, new_names))} to `names`")
    tensors = f"{entry.tensors} tensor{'s' if entry.tensors > 1 else ''}"
    return f"{entry.cls}: {tensors}, {entry.numel:,} parameters ({' and '.join(hints)})"


def resolve_parameters(model: nn.Module, names: Sequence[str]) -> list[Pair]:
    """Turn fully qualified names into the ``(module, name)`` pairs the pruning API takes.

    Args:
        model: The model holding the parameters.
        names: Names such as ``"net.0.weight"``; a pruned tensor is named without ``_orig``.

    Returns:
        One pair per name, in order.

    Raises:
        ValueError: No names, a repeated name, or a name that is not a parameter of the model
            (the message names it).

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> [(type(m).__name__, n) for m, n in resolve_parameters(model, ["0.weight"])]
        [('Linear', 'weight')]
    """
    names = list(_as_tuple("names", names))  # type: ignore[arg-type]
    if not names:
        raise ValueError("Expected `names` to name at least one parameter, but got none.")
    pairs: list[Pair] = []
    seen: set[str] = set()
    for fq_name in names:
        if not isinstance(fq_name, str):
            raise TypeError(f"Expected `names` to hold str, but got {fq_name!r}.")
        if fq_name in seen:
            raise ValueError(f"Expected `names` to be unique, but {fq_name!r} is repeated.")
        seen.add(fq_name)
        module, name = owner(model, fq_name, f"{fq_name!r} to name a parameter")
        if parameter_of(module, name) is None:
            raise ValueError(
                f"Expected {fq_name!r} to name a parameter, but ({type(module).__name__}, "
                f"{name!r}) is not a parameter of module {fq_name.rpartition('.')[0]!r}."
            )
        pairs.append((module, name))
    return pairs


def _snake_case(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _builtin_methods() -> dict[str, type[BasePruningMethod]]:
    found: dict[str, type[BasePruningMethod]] = {}
    for attr in _methods.__all__:
        obj = getattr(_methods, attr)
        if isinstance(obj, type) and issubclass(obj, BasePruningMethod):
            found[obj.__name__] = obj
            found[_snake_case(obj.__name__)] = obj
    return found


def resolve_method(method: str | type[BasePruningMethod]) -> type[BasePruningMethod]:
    """The unstructured pruning method named by ``method``.

    Args:
        method: A class, a built-in name in snake case (``"l1_unstructured"``) or class case
            (``"L1Unstructured"``), or an import path (``"my_pkg.scores.MyMethod"``).

    Returns:
        The :class:`~tensorplay.ao.pruning.parity.base.BasePruningMethod` subclass.

    Raises:
        ValueError: An unknown name or a method that is not unstructured (structured methods
            cannot rank units across tensors).
        TypeError: ``method`` is neither a string nor a pruning-method class.

    Example:
        >>> resolve_method("l1_unstructured").__name__
        'L1Unstructured'
        >>> resolve_method("ln_structured")
        Traceback (most recent call last):
        ...
        ValueError: Expected `method` to be an unstructured pruning method, but got 'ln_structured' (PRUNING_TYPE 'structured'); structured methods cannot prune globally.
    """  # noqa: E501
    cls: object = method
    if isinstance(method, str):
        builtins = _builtin_methods()
        if method in builtins:
            cls = builtins[method]
        elif "." in method:
            cls = import_object(method)
        else:
            known = sorted(
                name
                for name, found in builtins.items()
                if name.islower() and found.PRUNING_TYPE == "unstructured"
            )
            raise ValueError(
                f"Expected `method` to be one of {known}, a class name or an import path, "
                f"but got {method!r}."
            )
    if not (isinstance(cls, type) and issubclass(cls, BasePruningMethod)):
        raise TypeError(
            f"Expected `method` to name a BasePruningMethod subclass, but got {method!r}."
        )
    kind = getattr(cls, "PRUNING_TYPE", None)
    if kind != "unstructured":
        raise ValueError(
            f"Expected `method` to be an unstructured pruning method, but got {method!r} "
            f"(PRUNING_TYPE {kind!r}); structured methods cannot prune globally."
        )
    return cls


def method_name(cls: type[BasePruningMethod]) -> str:
    """The name :func:`resolve_method` takes back: snake case if built in, else an import path.

    Example:
        >>> from tensorplay.ao.pruning import RandomUnstructured
        >>> method_name(RandomUnstructured)
        'random_unstructured'
    """
    snake = _snake_case(cls.__name__)
    if _builtin_methods().get(snake) is cls:
        return snake
    return f"{cls.__module__}.{cls.__qualname__}"
