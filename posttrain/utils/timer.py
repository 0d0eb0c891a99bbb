"""Wall-clock timing of the named phases of a step (``with timer.time("generation"):``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class Timer:
    """Collects phase durations (seconds) until :meth:`pop` hands them over and resets."""

    def __init__(self) -> None:
        self._durations: dict[str, float] = {}

    @contextlib.contextmanager
    def time(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self._durations[name] = self._durations.get(name, 0.0) + time.perf_counter() - start

    def peek(self, name: str) -> float:
        """Seconds recorded for ``name`` since the last :meth:`pop` (0 if none)."""
        return self._durations.get(name, 0.0)

    def pop(self, prefix: str = "timing/") -> dict[str, float]:
        """Durations so far as ``{prefix + name: seconds}``, then reset."""
        out = {prefix + k: v for k, v in self._durations.items()}
        self._durations = {}
        return out
