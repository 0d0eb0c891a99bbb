"""Ctrl-C and SIGTERM stop a run at the next step boundary, with a checkpoint, not mid-step.

``graceful_stop()`` (installed by the entry points) turns the first SIGINT / SIGTERM into a
request: the training loop finishes the step in flight, writes a checkpoint of it (when
periodic checkpoints are on) and raises :class:`StopRequested`; the entry point prints one
line and exits 128 + the signal number (130 / 143). A second signal aborts at once
(``KeyboardInterrupt``). Stopping between steps keeps the checkpoint consistent: a worker
interrupted mid-call would go on changing the weights behind a checkpoint of the step before.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType

from posttrain.errors import PosttrainError

_requested: int | None = None  # the signal number of a pending stop request
_handler = None  # graceful_stop's handler while its block runs
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(PosttrainError):
    """The run stopped at a step boundary on a signal. ``signum``: which one; ``step``: the
    last finished step; ``checkpoint``: the checkpoint written for it (or None)."""

    def __init__(self, signum: int, step: int, checkpoint: str | None):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        saved = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint (checkpoint.save_period is 0)"
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}: {saved}")


def stop_requested() -> int | None:
    """The signal number of a pending stop request, or None."""
    return _requested


@contextlib.contextmanager
def graceful_stop() -> Iterator[None]:
    """Within this block, SIGINT and SIGTERM request a stop at the next step boundary (the
    second one aborts). Previous handlers come back afterwards."""
    global _requested

    def handle(signum: int, frame: FrameType | None) -> None:
        global _requested
        if _requested is not None:
            raise KeyboardInterrupt
        _requested = signum
        print(f"{signal.Signals(signum).name}: stopping after the current step (again to abort)",
              file=sys.stderr, flush=True)

    global _handler
    previous = {sig: signal.signal(sig, handle) for sig in _SIGNALS}
    _requested, _handler = None, handle
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _requested, _handler = None, None


def rearm() -> None:
    """Put graceful_stop's handlers back if something replaced them (``ray.init`` installs a
    SIGTERM handler that dumps a crash report and aborts). No-op outside graceful_stop."""
    if _handler is not None:
        for sig in _SIGNALS:
            signal.signal(sig, _handler)
