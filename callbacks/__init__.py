"""Lightning callbacks for tensorplay, imported as ``tensorplay.callbacks``.

Requires the ``lightning`` extra: ``pip install "tensorplay[lightning]"``.
"""

from tensorplay.callbacks._loading import PrunableMixin
from tensorplay.callbacks.pruning import GradualPruning

__all__ = [
    # training
    "GradualPruning",
    # loading
    "PrunableMixin",
]
