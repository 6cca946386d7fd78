"""Import paths: the object a dotted path names, and the path that names an object.

Schedules (``class_path`` and a :class:`~tensorplay.ao.pruning.pruner.schedules.CallableSchedule`'s
function), pruning methods and module types may be written as import paths in configs; these
two functions turn a path into its object and back.

Example:
    >>> import math
    >>> import_object("math.sqrt") is math.sqrt, import_path(math.sqrt)
    (True, 'math.sqrt')
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["import_object", "import_path"]


def import_object(path: str) -> Any:
    """Import ``pkg.mod.Name`` (or ``pkg.mod.Class.attr``).

    Args:
        path: A dotted path: a module, then attributes.

    Raises:
        ValueError: No importable module prefix, or a missing attribute.

    Example:
        >>> import_object("collections.OrderedDict").__name__
        'OrderedDict'
        >>> import_object("no_such_package.Name")
        Traceback (most recent call last):
        ...
        ValueError: Expected an import path such as 'pkg.module.Name', but got 'no_such_package.Name'.
    """  # noqa: E501
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        return obj
    raise ValueError(f"Expected an import path such as 'pkg.module.Name', but got {path!r}.")


def import_path(obj: object) -> str | None:
    """``module.qualname`` of ``obj`` if importing it gives ``obj`` back, else ``None``.

    A lambda, a nested function or anything defined in ``__main__`` has no such path.

    Example:
        >>> import collections
        >>> import_path(collections.OrderedDict), import_path(lambda step: 0.5)
        ('collections.OrderedDict', None)
    """
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    path = f"{module}.{qualname}"
    try:
        found = import_object(path)
    except ValueError:
        return None
    return path if found is obj else None
