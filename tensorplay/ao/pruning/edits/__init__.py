"""Every change tensorplay makes to a user's model, from one owner.

The shrink record (:mod:`~tensorplay.ao.pruning.edits.spent`): which tensors
:func:`~tensorplay.ao.pruning.shrink` changed, so that a pruner built before knows it is spent.
"""
