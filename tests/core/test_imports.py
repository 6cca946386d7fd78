"""Import paths: an object from its path, and the path of an object."""

from __future__ import annotations

import collections
import math

import pytest

from tensorplay.ao.pruning.imports import import_object, import_path
from tensorplay.ao.pruning.pruner.schedules import CubicSchedule


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("math.sqrt", math.sqrt, id="function"),
        pytest.param(
            "collections.OrderedDict.fromkeys", collections.OrderedDict.fromkeys, id="attr"
        ),
        pytest.param(
            "tensorplay.ao.pruning.pruner.schedules.CubicSchedule", CubicSchedule, id="class"
        ),
    ],
)
def test_import_object(path: str, expected: object) -> None:
    assert import_object(path) == expected


@pytest.mark.parametrize("path", ["no_such_package.Name", "math.no_such_name", "math"])
def test_import_object_names_the_path_it_cannot_import(path: str) -> None:
    with pytest.raises(ValueError, match=f"but got '{path}'"):
        import_object(path)


def nested() -> object:
    def inner() -> None:
        pass

    return inner


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(math.sqrt, "math.sqrt", id="function"),
        pytest.param(
            CubicSchedule, "tensorplay.ao.pruning.pruner.schedules.CubicSchedule", id="class"
        ),
        pytest.param(lambda: None, None, id="lambda"),
        pytest.param(nested(), None, id="nested"),
        pytest.param(3, None, id="no-name"),
    ],
)
def test_import_path(obj: object, expected: str | None) -> None:
    assert import_path(obj) == expected
