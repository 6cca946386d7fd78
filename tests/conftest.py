"""Every multi-process test runs on one pytest-xdist worker, one at a time.

Each picks a free local port for its process group (or lets Lightning, Accelerate or torchrun
pick one) and then starts its processes; two of them starting at once on two workers could be
handed the same port, and a rank then joins the other test's group (seen as an intermittent
"Gloo connectFullMesh failed ... Connection refused"). ``@pytest.mark.distributed`` puts a test
in the ``distributed`` xdist group, which ``--dist loadgroup`` (``pyproject.toml``) runs on a
single worker.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put every ``distributed`` test in the one xdist group."""
    for item in items:
        if item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.xdist_group("distributed"))
