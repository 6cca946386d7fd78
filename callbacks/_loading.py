"""Loading pruned checkpoints into a fresh ``LightningModule``, strictly.

:class:`PrunableMixin` rebuilds the reparametrization before Lightning loads a checkpoint's
weights. (The state of tensorplay 0.1's callback is read by :mod:`tensorplay.callbacks._state`,
re-exported here.)
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.core.hooks import CheckpointHooks
from torch import nn
from typing_extensions import override

from tensorplay.ao.pruning.checkpoint import restore_pruning

from ._state import pruner_state, schedule_key, state_key_fields

__all__ = ["PrunableMixin", "pruner_state", "schedule_key", "state_key_fields"]


class PrunableMixin(CheckpointHooks):
    """Rebuild the pruning reparametrization before Lightning loads a checkpoint's weights.

    A pruned checkpoint stores ``<name>_orig`` and ``<name>_mask`` where a fresh model has
    ``<name>``. Lightning calls ``on_load_checkpoint`` just before it loads the weights, both in
    ``LightningModule.load_from_checkpoint`` and in ``Trainer.fit/validate/test(ckpt_path=...)``;
    this mixin puts the reparametrization in place there, so loading stays strict. Put it first
    among the bases; a subclass that overrides ``on_load_checkpoint`` calls ``super()``.
    Under ``ModelParallelStrategy`` the strategy loads a distributed checkpoint's weights before
    this hook, into the tensors the model has: the pruned weights (zero) load, the masks do not.

    Example:
        >>> import lightning.pytorch as pl
        >>> import torch
        >>> from torch import nn
        >>> class Net(PrunableMixin, pl.LightningModule):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.fc = nn.Linear(4, 2)
        >>> net = Net()
        >>> checkpoint = {"state_dict": {"fc.weight_orig": torch.ones(2, 4),
        ...     "fc.weight_mask": torch.ones(2, 4), "fc.bias": torch.zeros(2)}}
        >>> net.on_load_checkpoint(checkpoint)
        >>> net.load_state_dict(checkpoint["state_dict"], strict=True)
        <All keys matched successfully>
    """

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Reparametrize every tensor the checkpoint's ``state_dict`` holds pruned.

        Args:
            checkpoint: the loaded checkpoint.

        Raises:
            TypeError: if the class using the mixin is not an :class:`~torch.nn.Module`.
        """
        if not isinstance(self, nn.Module):
            raise TypeError(
                f"Expected `PrunableMixin` on a torch.nn.Module, but got {type(self).__name__}."
            )
        if "state_dict" in checkpoint:  # absent from a distributed checkpoint's metadata
            restore_pruning(self, checkpoint["state_dict"])
        super().on_load_checkpoint(checkpoint)
