"""Structured units: channels, heads and layers, found from the model, masked and removed.

A structured unit is the same index range in several tensors (:mod:`.unit_groups`); the dependency
analysis finds the groups of units a model has; a pruner ranks one key per unit; shrinking
removes the pruned units physically.
"""
