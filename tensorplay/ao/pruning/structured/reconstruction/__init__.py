"""Reconstruction: re-solving the consumers of pruned units on calibration data (one-shot,
without training): the ridge solve, the consumers, the calibration driver."""

from tensorplay.ao.pruning.structured.reconstruction.consumers import (
    RECONSTRUCTED_KINDS,
    Consumer,
    consumers_for,
    find_consumers,
    kept_inputs,
    masks_of,
)
from tensorplay.ao.pruning.structured.reconstruction.driver import (
    DEFAULT_DAMPING,
    Solved,
    reconstruct,
)
from tensorplay.ao.pruning.structured.reconstruction.ridge import check_damping, ridge_solve

__all__ = [
    # the solve
    "ridge_solve",
    "check_damping",
    # the consumers
    "RECONSTRUCTED_KINDS",
    "Consumer",
    "consumers_for",
    "find_consumers",
    "kept_inputs",
    "masks_of",
    # the driver
    "DEFAULT_DAMPING",
    "Solved",
    "reconstruct",
]
