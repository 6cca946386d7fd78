"""Distillation from a frozen teacher, and the teacher's copies (dense, or sharded like FSDP2).

:mod:`~tensorplay.ao.pruning.distillation.distill` holds the KD term and :class:`Distillation`;
:mod:`~tensorplay.ao.pruning.distillation.dense_copy` and
:mod:`~tensorplay.ao.pruning.distillation.sharded_copy` make the default teacher.
"""

from tensorplay.ao.pruning.distillation.distill import Distillation, attached_distillation, kd_loss

__all__ = ["Distillation", "attached_distillation", "kd_loss"]
