"""tensorplay: PyTorch-native model pruning.

The core lives in :mod:`tensorplay.ao.pruning` and depends on ``torch`` alone; the Lightning
integration is :mod:`tensorplay.callbacks` (install the ``lightning`` extra).
"""

from tensorplay import moved

__version__ = "0.1.0"

moved.install()
