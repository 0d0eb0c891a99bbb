"""Ctrl-C and SIGTERM stop a run at the next step boundary, with a checkpoint, not mid-step.

``graceful_stop()`` (installed by the entry points) turns the first SIGINT / SIGTERM into a
request: the training loop finishes the step in flight, writes a checkpoint of it (when
periodic checkpoints are on) and raises :class:`StopRequested`; the entry point prints one
line and exits 128 + the signal number (130 / 143). A second signal, at least
``SAME_INTERRUPT_S`` after the first, aborts at once (``KeyboardInterrupt``). Stopping between
steps keeps the checkpoint consistent: a worker interrupted mid-call would go on changing the
weights behind a checkpoint of the step before.

One interrupt often arrives twice. A terminal's Ctrl-C, or a ``kill`` of the process group (CI
runners, SLURM's ``scancel``), reaches every process of the group: the run and its launcher.
A launcher that passes signals on to its child then sends a copy: ``uv run`` forwards a SIGINT
0.20 s later when its stdin is not a terminal (uv 0.13.9; 3 of 3 runs at 0.20 s) and a SIGTERM
at once, and the functional scripts pass both on to their job. A copy of the same signal within
``SAME_INTERRUPT_S`` of the first is therefore the same request, not the second press that aborts.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from types import FrameType

from posttrain.errors import PosttrainError

_requested: int | None = None  # the signal number of a pending stop request
_requested_at = 0.0  # time.monotonic() of that request
# A copy of the request's signal this soon after it is the same interrupt (see the module's doc): 5x
# the 0.2 s after which `uv run` forwards a SIGINT, and shorter than a person's deliberate second press.
SAME_INTERRUPT_S = 1.0
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
    """Within this block, SIGINT and SIGTERM request a stop at the next step boundary; another
    signal aborts, unless it is the same signal within ``SAME_INTERRUPT_S`` (a launcher's copy of
    it). Previous handlers come back afterwards."""
    global _requested

    def handle(signum: int, frame: FrameType | None) -> None:
        global _requested, _requested_at
        now = time.monotonic()
        if _requested is not None:
            if signum == _requested and now - _requested_at < SAME_INTERRUPT_S:
                return  # the launcher's copy of the interrupt already requested
            raise KeyboardInterrupt
        _requested, _requested_at = signum, now
        print(f"{signal.Signals(signum).name}: stopping after the current step (again, a second later, to abort)",
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


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Within this block SIGINT and SIGTERM are ignored: the run is already stopping (shutting Ray
    down, printing its last line), and a late copy of the signal must not turn a clean stop into
    a traceback. Previous handlers come back afterwards."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def rearm() -> None:
    """Put graceful_stop's handlers back if something replaced them (``ray.init`` installs a
    SIGTERM handler that dumps a crash report and aborts). No-op outside graceful_stop."""
    if _handler is not None:
        for sig in _SIGNALS:
            signal.signal(sig, _handler)
