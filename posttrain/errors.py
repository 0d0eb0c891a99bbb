"""Errors that carry a one-line, user-facing message.

Entry points (``examples/run_*.py``) catch :class:`PosttrainError`, print ``error: <message>``
on one line and exit with status 2, so bad input never ends in a traceback or a silent pass.
"""


class PosttrainError(Exception):
    """Base class: the message is the whole, one-line explanation for the user. ``exit_code``:
    what the entry point exits with (2: bad input)."""

    exit_code = 2


class ConfigError(PosttrainError):
    """A config key is unknown, or a value has the wrong type or range."""


class DataError(PosttrainError):
    """A data file is missing or malformed (the message names the file and line)."""


class WorkerDiedError(PosttrainError):
    """A Ray worker process died during a call (killed, out of memory, a crash in native code).
    Not bad input: the entry points exit 1. The newest complete checkpoint stays usable."""

    exit_code = 1
