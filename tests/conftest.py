"""Multi-process tests: one xdist worker, one at a time, and a rerun when the port was taken.

Each picks a free local port for its process group (or lets Lightning, Accelerate or torchrun
pick one) and then starts its processes; two of them starting at once on two workers could be
handed the same port, and a rank then joins the other test's group (seen as an intermittent
"Gloo connectFullMesh failed ... Connection refused"). ``@pytest.mark.distributed`` puts a test
in the ``distributed`` xdist group, which ``--dist loadgroup`` (``pyproject.toml``) runs on a
single worker.

A port found free can still be taken by any other process on the machine before rank 0 listens
on it (``EADDRINUSE``): the launchers this suite owns meet through a file instead
(``tests/core/gloo.py``), and a ``distributed`` test that fails only because its port was taken
(Lightning's ``ddp_spawn``, torchrun) is run again, up to :data:`PORT_RETRIES` times, with a
fresh port. Any other failure fails at once.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

PORT_RETRIES = 2
# What a rank says when the port picked for its group was taken by another process.
PORT_TAKEN = ("EADDRINUSE", "address already in use")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put every ``distributed`` test in the one xdist group."""
    for item in items:
        if item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.xdist_group("distributed"))


def port_taken(error: BaseException) -> bool:
    """Whether ``error`` (a rank's, as its launcher re-raises it) says its port was taken."""
    text = str(error).lower()
    return any(sign.lower() in text for sign in PORT_TAKEN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Run a ``distributed`` test again when its only failure is a port taken meanwhile."""
    try:
        return (yield)
    except Exception as error:
        if item.get_closest_marker("distributed") is None or not port_taken(error):
            raise
        for attempt in range(PORT_RETRIES):
            try:
                item.runtest()
                return None
            except Exception as again:
                if attempt == PORT_RETRIES - 1 or not port_taken(again):
                    raise
        raise
