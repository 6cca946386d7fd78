"""Importance scores: what a pruning step ranks units by, beyond the weights alone.

* :mod:`~tensorplay.ao.pruning.importance.magnitude`: ``"magnitude"`` (default), the weights;
* :mod:`~tensorplay.ao.pruning.importance.movement`: ``"movement"`` (Sanh et al. 2020),
  ``-sum_t w_t * g_t``, never reset;
* :mod:`~tensorplay.ao.pruning.importance.taylor`: ``"taylor"`` (Molchanov et al. 2019),
  ``sum_t |w_t * g_t|``, reset after each pruning step;
* :mod:`~tensorplay.ao.pruning.importance.wanda`: ``"wanda"`` (Sun et al. 2023),
  ``|W| * ||X_j||_2`` from forward hooks, reset after each pruning step;
* :mod:`~tensorplay.ao.pruning.importance.activation`: ``"activation"`` (Muralidharan et al.
  2024, Minitron), the mean over the samples of the L2 norm of the activation each channel or
  head produces, from forward hooks on the layers that read them (``structure="channel"`` or
  ``"head"`` only), reset after each pruning step;
* :mod:`~tensorplay.ao.pruning.importance.expert_routing`: ``"reap"`` (Lasby et al. 2025), the
  router-weighted mean norm of an expert's output, and ``"frequency"``, the share of tokens
  routed to it, from forward hooks on the experts (``structure="expert"`` only);
* :mod:`~tensorplay.ao.pruning.importance.score`: the protocol the pruner asks;
  :mod:`~tensorplay.ao.pruning.importance.registry`: the scores by name (a new score is one
  file and one line there).

Example:
    >>> make_importance("movement").needs_gradients
    True
"""

from tensorplay.ao.pruning.importance.registry import (
    ACCUMULATOR_DTYPES,
    IMPORTANCES,
    make_importance,
)
from tensorplay.ao.pruning.importance.score import Importance

__all__ = ["ACCUMULATOR_DTYPES", "IMPORTANCES", "Importance", "make_importance"]
