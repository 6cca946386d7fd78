"""The metrics both adapters log, by their stable names.

``pruning/sparsity`` (of all targets, as the weights hold it), ``pruning/target_sparsity`` (the
schedule's, at the last step), ``pruning/pruned`` (cumulative units) and, on request,
``pruning/sparsity/<module>.<name>`` per target. With several pruning callbacks in one
trainer, each logs under ``pruning/<i>/`` instead (``i``: its place among them), so that no
series overwrites another's.
"""

from __future__ import annotations

from tensorplay.ao.pruning.masking.stats import SparsityReport
from tensorplay.ao.pruning.pruner.gradual_search import RunPruner

__all__ = ["PREFIX", "metric_prefix", "pruning_metrics", "with_prefix"]

PREFIX = "pruning/"


def pruning_metrics(
    pruner: RunPruner, report: SparsityReport, per_tensor: bool
) -> dict[str, float]:
    """The metrics of ``report`` (the pruner's last :meth:`~Pruner.report`), per tensor first.

    Example:
        >>> from torch import nn
        >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
        >>> from tensorplay.ao.pruning import Pruner
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


def metric_prefix(index: int, count: int) -> str:
    """The prefix of the metrics of the ``index``-th of ``count`` pruning callbacks of one
    trainer: ``pruning/`` for a single one (the stable names), else ``pruning/<index>/``.

    Example:
        >>> metric_prefix(0, 1), metric_prefix(1, 2)
        ('pruning/', 'pruning/1/')
    """
    return PREFIX if count < 2 else f"{PREFIX}{index}/"


def with_prefix(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """``metrics`` (named ``pruning/...``) named ``<prefix>...``.

    Example:
        >>> with_prefix({"pruning/sparsity": 0.5}, "pruning/1/")
        {'pruning/1/sparsity': 0.5}
    """
    return {prefix + name.removeprefix(PREFIX): value for name, value in metrics.items()}
