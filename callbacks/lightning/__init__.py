"""The Lightning adapter: :class:`GradualPruning`, and loading its checkpoints strictly."""

from .gradual_pruning import GradualPruning
from .loading import PrunableMixin

__all__ = ["GradualPruning", "PrunableMixin"]
