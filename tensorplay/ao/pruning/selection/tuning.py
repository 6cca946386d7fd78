"""The selection's tuning constants, each with the reason for its value.

Every module of the selection reads these through this module (``tuning.CPU_CHUNK``), at call
time, so a test can shrink them all in one place to reach every path with small inputs.
"""

from __future__ import annotations

__all__ = [
    "CHUNKS_PER_THREAD",
    "CPU_CHUNK",
    "DEVICE_CHUNK",
    "GATHER",
    "MAX_BAND_FRACTION",
    "MIN_BAND",
    "RANK_BLOCK",
    "ROWS",
    "SAMPLE",
    "SAMPLE_SEED",
    "SIGMAS",
    "THRESHOLDS_PER_PASS",
    "TORCH_GRAIN",
    "band_cap",
]

# Units per chunk: the three chunk buffers of both threads (12 MB) stay in the CPU's last-level
# cache, and each torch call's fixed cost (a few microseconds) is spread over enough units;
# 2**17 to 2**20 measured, 2**19 fastest on 2 cores. On an accelerator larger chunks amortise
# kernel launches and the few host synchronisations.
CPU_CHUNK = 1 << 19
DEVICE_CHUNK = 1 << 24
# torch splits an elementwise op over its intra-op threads only above this many elements
# (``at::internal::GRAIN_SIZE``): a pass whose every op is smaller runs on one thread anyway.
TORCH_GRAIN = 32768
# CPU chunks per thread of a pass: below 4 chunks a thread's start costs more than it saves.
CHUNKS_PER_THREAD = 4
# Sample size of the band guess: the band is 9 standard deviations of a quantile estimated
# from this many keys wide (about 0.9% of the units at k = n/2); the true quantile falls
# outside with probability ~1e-5, which costs a counting pass, never exactness.
SAMPLE = 1 << 18
SIGMAS = 4.5
SAMPLE_SEED = 0x7E5
# Most candidates gathered at once (value + position: 12 bytes each) as a fraction of the units.
MAX_BAND_FRACTION = 1 / 48
MIN_BAND = 1 << 19
# Thresholds counted per refining pass: the interval narrows 32-fold per pass.
THRESHOLDS_PER_PASS = 31
# Sharded: candidates gathered on every rank once counting collectives have narrowed them
# (16 bytes each, value and order: a gather receives at most 64 KiB per rank).
GATHER = 1 << 12
# Candidates read at once when ranking a band's keys (ranks.py): a few MiB of temporaries, and
# few large ops rather than one per piece.
RANK_BLOCK = 1 << 20
# Rows of the column prefilter when extracting candidate positions: a column (every
# ``n / ROWS``-th unit) is scanned only if it holds a candidate. 16 measured fastest for bands
# of 0.05-1%.
ROWS = 16


def band_cap(total: int) -> int:
    """The most candidates one pass may gather among ``total`` units.

    Args:
        total: the number of units of the selection.

    Returns:
        ``MIN_BAND`` or ``MAX_BAND_FRACTION`` of the units, whichever is larger.

    Example:
        >>> band_cap(48 << 20) == 1 << 20
        True
    """
    return max(MIN_BAND, int(total * MAX_BAND_FRACTION))
