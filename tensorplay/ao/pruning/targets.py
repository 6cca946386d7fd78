"""Choosing what to prune: parameters by module type and name pattern, and the pruning method.

Targets are named by their fully qualified name in the model, ``"encoder.fc1.weight"``, the same
key the parameter has in ``model.state_dict()`` before pruning. Names are plain data: they go in a
config file or a checkpoint and are turned into ``(module, name)`` pairs with
:func:`resolve_parameters` when a model is at hand. A tensor that is already pruned is still found
under its own name (its parameter lives on as ``<name>_orig``).

Example:
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> select_parameters(model)
    ['0.weight', '2.weight']
    >>> select_parameters(model, names=("weight", "bias"), exclude=[r"^2\\."])
    ['0.weight', '0.bias']
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from torch import nn

from tensorplay.ao.pruning import methods as _methods
from tensorplay.ao.pruning.base import BasePruningMethod
from tensorplay.ao.pruning.schedules import _import_object

__all__ = ["DEFAULT_MODULE_TYPES", "resolve_method", "resolve_parameters", "select_parameters"]

DEFAULT_MODULE_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _as_tuple(name: str, value: object) -> tuple[object, ...]:
    if isinstance(value, (str, type)):
        return (value,)
    if not isinstance(value, Sequence):
        raise TypeError(f"Expected `{name}` to be a sequence, but got {value!r}.")
    return tuple(value)


def _module_matcher(module_types: Sequence[type[nn.Module] | str]) -> list[type | str]:
    """Classes stay classes, import paths become classes, bare class names stay strings."""
    matchers: list[type | str] = []
    for entry in _as_tuple("module_types", module_types):
        if isinstance(entry, str) and "." in entry:
            entry = _import_object(entry)
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


def _owned_parameter(module: nn.Module, name: str) -> nn.Parameter | None:
    """The parameter behind ``module.<name>``: itself, or ``<name>_orig`` if pruned."""
    param = module._parameters.get(name)
    if param is not None:
        return param
    if name + "_mask" in module._buffers:
        return module._parameters.get(name + "_orig")
    return None


def _owner(model: nn.Module, fq_name: str, expected: str) -> tuple[nn.Module, str]:
    """The module that ``fq_name`` (``"net.0.weight"``) lives in, and the tensor's own name.

    Raises:
        ValueError: naming ``expected``, if the model has no such module.
    """
    module_name, _, name = fq_name.rpartition(".")
    try:
        return model.get_submodule(module_name), name
    except AttributeError as error:
        raise ValueError(
            f"Expected {expected}, but the model has no module {module_name!r}."
        ) from error


def select_parameters(
    model: nn.Module,
    *,
    module_types: Sequence[type[nn.Module] | str] = DEFAULT_MODULE_TYPES,
    names: Sequence[str] = ("weight",),
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
) -> list[str]:
    """Fully qualified names of the parameters to prune, in module order.

    A parameter is selected when its module is an instance of one of ``module_types``, its name
    inside the module is in ``names``, its fully qualified name matches some ``include`` regex
    (``re.search``; ``None`` matches all) and no ``exclude`` regex. A parameter reached through
    several modules (tied weights) is listed once, under its first name.

    Args:
        model: The model to search.
        module_types: Module classes, class names (``"Linear"``, matched against the class and
            its bases) or import paths (``"torch.nn.Linear"``).
        names: Parameter names inside a module.
        include: Regexes; keep names that match at least one.
        exclude: Regexes; drop names that match any.

    Returns:
        Names such as ``"net.0.weight"``.

    Raises:
        ValueError: Nothing matched (the message lists the filters) or an invalid regex.
        TypeError: A ``module_types`` entry that is not a module class, name or import path.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(16, 10))
        >>> select_parameters(model, module_types=["Conv2d"])
        ['0.weight']
    """
    matchers = _module_matcher(module_types)
    wanted = [str(n) for n in _as_tuple("names", names)]
    included = _compile("include", include)
    excluded = _compile("exclude", exclude)
    seen: set[int] = set()
    selected: list[str] = []
    for module_name, module in model.named_modules():
        if not _matches_type(module, matchers):
            continue
        for name in wanted:
            param = _owned_parameter(module, name)
            fq_name = f"{module_name}.{name}" if module_name else name
            if param is None or id(param) in seen:
                continue
            if included is not None and not any(p.search(fq_name) for p in included):
                continue
            if excluded is not None and any(p.search(fq_name) for p in excluded):
                continue
            seen.add(id(param))
            selected.append(fq_name)
    if not selected:
        raise ValueError(
            "Expected the selection to match at least one parameter, but none matched "
            f"module_types={[getattr(m, '__name__', m) for m in matchers]}, names={wanted}, "
            f"include={include!r}, exclude={exclude!r}."
        )
    return selected


def resolve_parameters(model: nn.Module, names: Sequence[str]) -> list[tuple[nn.Module, str]]:
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
    pairs: list[tuple[nn.Module, str]] = []
    seen: set[str] = set()
    for fq_name in names:
        if not isinstance(fq_name, str):
            raise TypeError(f"Expected `names` to hold str, but got {fq_name!r}.")
        if fq_name in seen:
            raise ValueError(f"Expected `names` to be unique, but {fq_name!r} is repeated.")
        seen.add(fq_name)
        module, name = _owner(model, fq_name, f"{fq_name!r} to name a parameter")
        if _owned_parameter(module, name) is None:
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
        The :class:`~tensorplay.ao.pruning.base.BasePruningMethod` subclass.

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
            cls = _import_object(method)
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


def _method_name(cls: type[BasePruningMethod]) -> str:
    """The name :func:`resolve_method` takes back: snake case if built in, else an import path."""
    snake = _snake_case(cls.__name__)
    if _builtin_methods().get(snake) is cls:
        return snake
    return f"{cls.__module__}.{cls.__qualname__}"
