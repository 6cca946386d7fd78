"""The Lightning strategies ``GradualPruning`` refuses, and callbacks that would share tensors.

Which strategy a masking mode can serve is the mode's to say
(:attr:`~tensorplay.ao.pruning.masking.mode.MaskingMode.holds_dtensors`); these checks only
read it, so the callback never names a mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

from tensorplay.ao.pruning.pruner.config import PrunerConfig
from tensorplay.ao.pruning.pruner.gradual_search import RunPruner, pruner_parts

from ..core.fsdp2_config import check_fsdp2_config

if TYPE_CHECKING:
    from ..core.lifecycle import AdapterOptions

__all__ = ["check_disjoint", "check_distilled_strategy", "check_shrinkable", "check_strategy"]


def check_strategy(
    strategy: object, config: PrunerConfig, options: AdapterOptions | None = None
) -> None:
    """Refuse the strategies whose parameters the pruner cannot mask.

    Lightning's ``FSDPStrategy`` (FSDP1) flattens the parameters into per-rank slices of a
    ``FlatParameter`` that carry no layout of their own and shards no buffers, so a mask could
    be neither placed nor saved sharded. ``ModelParallelStrategy`` (FSDP2) needs a mode that
    holds ``DTensor`` targets, and no rewinding: the snapshot is not in distributed checkpoints.

    Raises:
        ValueError: Under ``FSDPStrategy``; under ``ModelParallelStrategy`` with a mode that
            holds no ``DTensor`` or with rewinding.
    """
    if isinstance(strategy, FSDPStrategy):
        raise ValueError(
            "Expected a strategy whose parameters keep their shape, but got Lightning's "
            "`FSDPStrategy` (FSDP1): it flattens them into one `FlatParameter` per unit and "
            "gives each rank an unshaped slice, and it shards no buffers, so a mask can be "
            "neither placed nor saved sharded. Use `ModelParallelStrategy` with `fully_shard` "
            "in `configure_model` (FSDP2) and `masking='inplace'`, or DDP."
        )
    if options is not None and options.distilling:
        check_distilled_strategy(strategy, options)
    if not isinstance(strategy, ModelParallelStrategy):
        return
    check_fsdp2_config(config, "`ModelParallelStrategy`")


def check_shrinkable(strategy: object) -> None:
    """Refuse ``shrink_at_end`` under DeepSpeed (its partitioned parameters cannot be gathered
    into a copy of the model) and under the strategies that train in worker processes and hand
    the weights back to the main process's model (``ddp_spawn``, ``ddp_fork``,
    ``ddp_notebook``): that model keeps its full widths, so the shrunk weights cannot load.
    Under ``ModelParallelStrategy`` (FSDP2) the model is gathered on rank zero and the shrunk
    copy written to a folder.

    Raises:
        ValueError: Under ``DeepSpeedStrategy``, or a strategy launched in worker processes.
    """
    if isinstance(strategy, DeepSpeedStrategy):
        raise ValueError(
            "Expected DDP, `ModelParallelStrategy` (FSDP2) or one device with "
            f"`shrink_at_end=True`, but got {type(strategy).__name__}: its partitioned "
            "parameters cannot be gathered into a copy of the model to shrink. Train with "
            "shrink_at_end=False, then shrink a full copy of the trained model with "
            "tensorplay.ao.pruning.shrink."
        )
    if isinstance(getattr(strategy, "launcher", None), _MultiProcessingLauncher):
        raise ValueError(
            "Expected a strategy that trains the model of this process with "
            "`shrink_at_end=True` (strategy='ddp' or one device), but got one launched in "
            f"worker processes ({type(strategy).__name__} with start method "
            f"{getattr(strategy, '_start_method', '?')!r}): they hand the trained weights back "
            "to this process's model, which keeps its full widths. Use strategy='ddp', or "
            "shrink_at_end=False and shrink the returned model with tensorplay.ao.pruning.shrink."
        )


def check_distilled_strategy(strategy: object, options: AdapterOptions) -> None:
    """Refuse distillation under DeepSpeed: its default teacher would be a plain copy of the
    model it partitions, and the term is added to the loss its engine back-propagates. Under
    ``ModelParallelStrategy`` (FSDP2) the teacher is copied shard by shard, sharded like the
    model (:func:`~tensorplay.ao.pruning.distillation.sharded_copy.sharded_copy`).

    Raises:
        ValueError: ``distill_weight`` > 0 under ``DeepSpeedStrategy``.
    """
    if isinstance(strategy, DeepSpeedStrategy):
        raise ValueError(
            "Expected DDP, `ModelParallelStrategy` (FSDP2) or one device with `distill_weight` > "
            f"0, but got distill_weight={options.distill_weight!r} under "
            f"`{type(strategy).__name__}`, whose partitioned model the teacher cannot be copied "
            "from. Set distill_weight=0, or train under DDP or FSDP2."
        )


def check_disjoint(pruner: RunPruner, index: int, others: Sequence[tuple[int, RunPruner]]) -> None:
    """Refuse a pruner whose tensors the pruner of another ``GradualPruning`` already prunes,
    naming both callbacks by their index in ``trainer.callbacks`` and every shared tensor.

    Args:
        pruner: The pruner just built.
        index: Its callback's index in ``trainer.callbacks``.
        others: ``(index, pruner)`` of the other ``GradualPruning`` callbacks already built.

    Raises:
        ValueError: Two callbacks select a tensor in common.
    """
    for other_index, other in others:
        shared = sorted(
            {
                name
                for mine in pruner_parts(pruner)
                for theirs in pruner_parts(other)
                for name in mine.shared_targets(theirs)
            }
        )
        if shared:
            raise ValueError(
                "Expected GradualPruning callbacks to prune disjoint tensors, but "
                f"trainer.callbacks[{index}] and trainer.callbacks[{other_index}] "
                f"both select {shared}. Give each callback its own `parameters`, or "
                "`include`/`exclude` patterns that do not overlap."
            )
