"""What a pruner configuration must be under FSDP2, whichever framework shards the model.

Both adapters refuse the same two settings on a model sharded with ``fully_shard``: a masking
mode that holds no ``DTensor`` (the reparametrization), and rewinding (its snapshot of sharded
weights is not in the framework's checkpoints). :func:`check_fsdp2_config` says so once; each
adapter names where the model is sharded.

Example:
    >>> from tensorplay.ao.pruning.pruner.config import PrunerConfig
    >>> from tensorplay.ao.pruning.pruner.schedules import OneShotSchedule
    >>> check_fsdp2_config(PrunerConfig(OneShotSchedule(0.5), masking="inplace"), "FSDP2")
    >>> check_fsdp2_config(PrunerConfig(OneShotSchedule(0.5)), "FSDP2")
    Traceback (most recent call last):
    ...
    ValueError: Expected `masking='inplace'` under FSDP2 (the reparametrization cannot hold ...
"""

from __future__ import annotations

from tensorplay.ao.pruning.masking import masking_mode
from tensorplay.ao.pruning.pruner.config import PrunerConfig

__all__ = ["check_fsdp2_config"]


def check_fsdp2_config(config: PrunerConfig, where: str) -> None:
    """Refuse a masking mode that holds no ``DTensor`` and rewinding, under ``where`` (the
    strategy or set-up that shards the model, as the message names it).

    Raises:
        ValueError: ``search=True`` (a searched run holds its masks in the forward);
            ``masking`` other than ``"inplace"``; ``rewind`` other than ``"none"``.
    """
    if config.search:
        raise ValueError(
            f"Expected search=False under {where}, but got search=True: a searched run keeps "
            "the layers it removes out of training by masks in the forward, which sharded "
            "(DTensor) parameters cannot hold. Search and prune once on a full copy "
            "(prune_one_shot(..., search=True)), shrink it, and train the shrunk model "
            f"under {where}."
        )
    if not masking_mode(config.masking).holds_dtensors:
        raise ValueError(
            f"Expected `masking='inplace'` under {where} (the reparametrization cannot hold "
            f"DTensor parameters), but got masking={config.masking!r}."
        )
    if config.rewind != "none":
        raise ValueError(
            f"Expected `rewind='none'` under {where} (the snapshot of sharded weights is not "
            f"saved in its checkpoints), but got rewind={config.rewind!r}."
        )
