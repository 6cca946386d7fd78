"""Every change tensorplay makes to a user's model, from one owner that can undo it.

:mod:`~tensorplay.ao.pruning.edits.changes` makes each change (a hook, a buffer, a parameter
replaced, an attribute set, values written in place) and, inside a
:func:`~tensorplay.ao.pruning.edits.changes.transaction`, records how to undo it: a refusal
anywhere in a transaction leaves the model exactly as it was.
:mod:`~tensorplay.ao.pruning.edits.spent` records what :func:`~tensorplay.ao.pruning.shrink`
changed, so a pruner built before knows it is spent.
"""

from tensorplay.ao.pruning.edits.changes import (
    ChangeRecord,
    atomic,
    held_references,
    hook,
    is_registered,
    keep_values,
    on_undo,
    pop_buffer,
    register_buffer,
    replace_data,
    set_attribute,
    touch,
    transaction,
    trial,
)

__all__ = [
    "ChangeRecord",
    "atomic",
    "held_references",
    "hook",
    "is_registered",
    "keep_values",
    "on_undo",
    "pop_buffer",
    "register_buffer",
    "replace_data",
    "set_attribute",
    "touch",
    "transaction",
    "trial",
]
