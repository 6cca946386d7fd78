"""The Hugging Face ``Trainer`` adapter: :class:`GradualPruningCallback`.

Importing it imports ``transformers`` only (the ``transformers`` extra), never Lightning.
"""

from .gradual_pruning_callback import GradualPruningCallback

__all__ = ["GradualPruningCallback"]
