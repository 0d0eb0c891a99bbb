"""Every error posttrain raises for its user: each carries a one-line message.

Entry points (``examples/run_*.py``) catch :class:`PosttrainError`, print ``error: <message>``
on one line and exit with its ``exit_code`` (2: bad input, 1: the run failed), so bad input
never ends in a traceback or a silent pass. Raised inside a Ray worker, these reach the
driver as themselves (``RayWorkerGroup`` and the vLLM driver unwrap Ray's task error).
"""


class PosttrainError(Exception):
    """Base class: the message is the whole, one-line explanation for the user. ``exit_code``:
    what the entry point exits with (2: bad input)."""

    exit_code = 2


class ConfigError(PosttrainError):
    """A config key is unknown, or a value has the wrong type or range."""


class DataError(PosttrainError):
    """A data file is missing or malformed (the message names the file and line)."""


class WorkerStartError(PosttrainError):
    """A worker's constructor raised (a model it cannot load, a device it does not have, ...)."""


class EngineStartError(PosttrainError):
    """The vLLM engine did not start (bad model directory, not enough memory, ...)."""


class RayStartError(PosttrainError):
    """Ray's local node did not start, on every attempt (a busy machine). Not bad input: exit 1."""

    exit_code = 1


class RefitProbeError(PosttrainError):
    """The engine's logprobs of the probe sequences differ from the trainer's beyond the bound."""

    exit_code = 1


class StaleWeightsError(PosttrainError, RuntimeError):
    """A generation engine is not on the weights the trainer says it is: a refit that did not
    arrive, reached some engines only, or an engine labelling its output with another version.
    Not bad input: the entry points exit 1. (A ``RuntimeError`` too, as these were before.)"""

    exit_code = 1


class WorkerDiedError(PosttrainError):
    """A Ray worker process died during a call (killed, out of memory, a crash in native code).
    Not bad input: the entry points exit 1. The newest complete checkpoint stays usable."""

    exit_code = 1


class BufferTimeoutError(PosttrainError):
    """A rollout buffer's ``put`` found no room, or its ``claim`` not enough samples, within its
    timeout (a stalled producer or trainer). Not bad input: the entry points exit 1."""

    exit_code = 1


class RolloutTagError(PosttrainError, ValueError):
    """A rollout sample's tags are wrong: a tag missing or not an int, a ``sample_id`` put
    twice, a group put in pieces or mixing weight versions, a sample newer than the trainer.
    A bug of the producer, not bad input: the entry points exit 1. (A ``ValueError`` too.)"""

    exit_code = 1


class ProducerError(PosttrainError):
    """The asynchronous rollout producer failed with an error that is not a PosttrainError
    (its type and first line are kept). Not bad input: exit 1."""

    exit_code = 1
