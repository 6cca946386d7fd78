"""Structured pruning: channels, heads, layers and experts as units, and their removal.

* :mod:`~tensorplay.ao.pruning.structured.dependency`: the dependency graph, found from the model
  (Hugging Face families by one small module each, other models by tracing);
* :mod:`~tensorplay.ao.pruning.structured.units`: what one unit is, as a scope ranks it (single
  weights too), parameter budgets, experts;
* :mod:`~tensorplay.ao.pruning.structured.shrinking`: removing pruned units physically;
* :mod:`~tensorplay.ao.pruning.structured.reconstruction`: re-solving the consumers of pruned
  units on calibration data.
"""
