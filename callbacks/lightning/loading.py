"""Loading pruned checkpoints into a fresh ``LightningModule``, strictly.

:class:`PrunableMixin` rebuilds the reparametrization, and the layout of a model shrunk at the
end of training, before Lightning loads a checkpoint's weights. (The state of tensorplay 0.1's
callback is read by :mod:`tensorplay.callbacks.core.state_keys`, re-exported here.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.core.hooks import CheckpointHooks
from torch import Tensor, nn
from typing_extensions import override

from tensorplay.ao.pruning.masking.restore import restore_pruning
from tensorplay.ao.pruning.structured.dependency.unit_groups import shapes_of
from tensorplay.ao.pruning.structured.shrinking.reshape import ShrunkShapes, reshape

from ..core.state_keys import pruner_state, schedule_key, state_key_fields

__all__ = ["SHRUNK_KEY", "PrunableMixin", "pruner_state", "schedule_key", "state_key_fields"]

SHRUNK_KEY = "tensorplay_shrunk"
"""The key of a Lightning checkpoint holding the layout of a model shrunk at the end of
training (:class:`~tensorplay.ao.pruning.structured.shrinking.reshape.ShrunkShapes` as plain
data)."""


class PrunableMixin(CheckpointHooks):
    """Rebuild the pruning reparametrization before Lightning loads a checkpoint's weights.

    A pruned checkpoint stores ``<name>_orig`` and ``<name>_mask`` where a fresh model has
    ``<name>``. Lightning calls ``on_load_checkpoint`` just before it loads the weights, both in
    ``LightningModule.load_from_checkpoint`` and in ``Trainer.fit/validate/test(ckpt_path=...)``;
    this mixin puts the reparametrization in place there, so loading stays strict. Put it first
    among the bases; a subclass that overrides ``on_load_checkpoint`` calls ``super()``.
    Under ``ModelParallelStrategy`` the strategy loads a distributed checkpoint's weights before
    this hook, into the tensors the model has: the pruned weights (zero) load, the masks do not.

    A checkpoint saved after ``GradualPruning(shrink_at_end=True)`` shrank the model records
    the shrunk layout (under ``"tensorplay_shrunk"``): the fresh model is shrunk to it first
    (:func:`~tensorplay.ao.pruning.structured.shrinking.reshape.reshape`: blocks removed, parameters
    cut, a Hugging Face config updated), and the checkpoint's weights fill it. A checkpoint of the
    model before shrinking loaded into the shrunk model is refused with an error that says so.

    Example:
        >>> import lightning.pytorch as pl
        >>> import torch
        >>> from torch import Tensor, nn
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
        if SHRUNK_KEY in checkpoint:
            reshape(self, ShrunkShapes.from_dict(checkpoint[SHRUNK_KEY]))
        if "state_dict" in checkpoint:  # absent from a distributed checkpoint's metadata
            _check_not_larger(self, checkpoint["state_dict"])
            restore_pruning(self, checkpoint["state_dict"])
        super().on_load_checkpoint(checkpoint)


def _check_not_larger(module: nn.Module, state_dict: Mapping[str, Any]) -> None:
    """Refuse a checkpoint whose tensors are larger than the module's: one saved before the
    module was shrunk (``trainer.test(ckpt_path="best")`` after ``shrink_at_end``)."""
    shapes = shapes_of(module)
    for key, value in state_dict.items():
        name = key.removesuffix("_orig")
        shape = shapes.get(name)
        if shape is None or not isinstance(value, Tensor) or value.shape == shape:
            continue
        if value.dim() == len(shape) and all(
            a >= b for a, b in zip(value.shape, shape, strict=True)
        ):
            raise ValueError(
                f"Expected a checkpoint of {type(module).__name__} as it is now, but its "
                f"{name!r} is {tuple(value.shape)} where the model's is {tuple(shape)}: the "
                "checkpoint was saved before the model was shrunk (shrink_at_end). Load it into "
                "a freshly built model (`load_from_checkpoint`), or use the shrunk model as "
                "training left it."
            )
