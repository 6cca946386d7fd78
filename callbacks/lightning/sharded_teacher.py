"""The teacher of a model sharded with FSDP2, saved in Lightning's distributed checkpoint.

Lightning's ``ModelParallelStrategy`` writes a callback's state on rank zero only, which holds
one shard of a sharded teacher; its model state goes to a distributed checkpoint
(``torch.distributed.checkpoint``), where every rank writes its own shards. The callback adds
the teacher's sharded state there, under :data:`TEACHER_PREFIX`, and a resumed run loads it
back, shard by shard, into a fresh copy sharded like the student. Loading the model ignores
these entries (Lightning loads the model's own keys only).

Example:
    >>> state: dict[str, object] = {}
    >>> add_teacher(state, __import__("torch").nn.Linear(2, 1))
    >>> sorted(state)
    ['_tensorplay_distill_teacher.bias', '_tensorplay_distill_teacher.weight']
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["TEACHER_PREFIX", "add_teacher", "teacher_loader"]

#: The prefix of the teacher's entries in the checkpoint's model state.
TEACHER_PREFIX = "_tensorplay_distill_teacher."
_SAVED_UNDER = "state_dict."  # where Lightning puts the model state in its distributed checkpoint


def add_teacher(model_state: dict[str, Any], teacher: nn.Module) -> None:
    """Add the teacher's state (its ``DTensor`` s sharded) to the checkpoint's model state.

    Example:
        >>> from torch import nn
        >>> state: dict[str, object] = {"w": 1}
        >>> add_teacher(state, nn.Linear(1, 1, bias=False))
        >>> list(state)
        ['w', '_tensorplay_distill_teacher.weight']
    """
    model_state.update((TEACHER_PREFIX + key, value) for key, value in teacher.state_dict().items())


def teacher_loader(path: str | Path | None) -> Callable[[nn.Module], None] | None:
    """A function that loads the teacher saved in the distributed checkpoint at ``path`` into a
    copy sharded like it (a collective), or ``None`` where ``path`` holds no teacher (not a
    distributed checkpoint, or one saved without it).

    Example:
        >>> teacher_loader(None) is None, teacher_loader("no-such-folder") is None
        (True, True)
    """
    if path is None or not Path(path).is_dir():
        return None
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    saved = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    if not any(key.startswith(_SAVED_UNDER + TEACHER_PREFIX) for key in saved):
        return None

    def load(teacher: nn.Module) -> None:
        import torch.distributed.checkpoint as dcp

        state = {"state_dict": {TEACHER_PREFIX + k: v for k, v in teacher.state_dict().items()}}
        dcp.load(state, checkpoint_id=str(path))  # type: ignore[attr-defined]  # in place

    return load
