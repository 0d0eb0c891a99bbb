"""Memory readings, in GiB."""

from __future__ import annotations

import resource
import sys


def peak_rss_gib() -> float:
    """Peak resident set size of the calling process so far, GiB (``getrusage`` ru_maxrss)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / (1024**3 if sys.platform == "darwin" else 1024**2)
