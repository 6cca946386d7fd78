"""The metrics both adapters log, by their stable names.

``pruning/sparsity`` (of all targets, as the weights hold it), ``pruning/target_sparsity`` (the
schedule's, at the last step), ``pruning/pruned`` (cumulative units) and, on request,
``pruning/sparsity/<module>.<name>`` per target.
"""

from __future__ import annotations

from tensorplay.ao.pruning.pruner import Pruner
from tensorplay.ao.pruning.stats import SparsityReport

__all__ = ["pruning_metrics"]


def pruning_metrics(pruner: Pruner, report: SparsityReport, per_tensor: bool) -> dict[str, float]:
    """The metrics of ``report`` (the pruner's last :meth:`~Pruner.report`), per tensor first.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.schedules import OneShotSchedule
        >>> pruner = Pruner(nn.Linear(4, 2), OneShotSchedule(0.25))
        >>> _ = pruner.step()
        >>> pruning_metrics(pruner, pruner.report(), per_tensor=True)
        {'pruning/sparsity/weight': 0.25, 'pruning/sparsity': 0.25,
         'pruning/target_sparsity': 0.25, 'pruning/pruned': 2.0}
    """
    # Masks are identical on every rank (same weights after the gradients' all-reduce, same seed
    # for random methods), so these values need no reduction across ranks.
    rows = report.rows if per_tensor else ()
    metrics = {f"pruning/sparsity/{row.name}": row.sparsity for row in rows}
    metrics["pruning/sparsity"] = report.sparsity
    metrics["pruning/target_sparsity"] = pruner.target_sparsity()
    metrics["pruning/pruned"] = float(report.pruned)
    return metrics
