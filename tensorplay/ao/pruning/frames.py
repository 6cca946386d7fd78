"""Where a warning should point: the user's line, not tensorplay's own.

Example:
    >>> import warnings
    >>> def warn_here() -> None:
    ...     warnings.warn("look here", UserWarning, stacklevel=user_stacklevel())
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_here()
    >>> caught[0].filename == warn_here.__code__.co_filename  # not a tensorplay file
    True
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["user_stacklevel"]

# tensorplay/ and, in a checkout, callbacks/ beside it (installed, it is tensorplay/callbacks/).
_OWN_ROOT = Path(__file__).resolve().parents[3]
_OWN_PREFIXES = tuple(f"{_OWN_ROOT / package}/" for package in ("tensorplay", "callbacks"))


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` in the calling function that names the first
    frame outside tensorplay (and its Lightning callbacks): the user's call.

    Example:
        >>> user_stacklevel() >= 1
        True
    """
    frame = sys._getframe(1)  # the function about to warn: stacklevel 1
    level = 1
    while frame.f_back is not None and _is_own(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level


def _is_own(filename: str) -> bool:
    return str(Path(filename).resolve()).startswith(_OWN_PREFIXES)
