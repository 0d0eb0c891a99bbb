"""GSM8K-format JSONL: one ``{"question": ..., "answer": ...}`` object per line.

The ``answer`` field is a worked solution whose last line is ``#### <final answer>``, e.g.
``"Natalia sold 48/2 = <<48/2=24>>24 clips in May. ...\\n#### 72"``. Final answers may carry
thousands commas (``#### 1,080``), which are removed.
"""

import json
import re
from pathlib import Path

from posttrain.data.types import MathProblem
from posttrain.errors import ConfigError, DataError

ANSWER_MARKER = "#### "
_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?", re.ASCII)


def load_gsm8k(path: str | Path, limit: int | None = None) -> list[MathProblem]:
    """Load GSM8K-format problems from a JSONL file, in file order.

    Blank lines are skipped. ``question`` is the prompt text, ``answer`` the number after the
    last ``"#### "`` with thousands commas removed (``"1,250"`` -> ``"1250"``), ``solution``
    the full ``answer`` text.

    Args:
        path: the ``.jsonl`` file.
        limit: read at most this many problems (``None``: all).

    Returns:
        The problems, at most ``limit`` of them.

    Raises:
        DataError: if the file is missing or has no problems, or a line is not valid UTF-8 /
            JSON, is not an object, lacks a string ``question`` or ``answer``, or its answer
            has no ``"#### "`` marker followed by a number; the message names ``path:lineno``.
        ConfigError: if ``limit`` is below 1.
    """
    path = Path(path)
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be at least 1 or None, got {limit!r}")
    if not path.is_file():
        raise DataError(f"GSM8K file not found: {path}")
    problems: list[MathProblem] = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if limit is not None and len(problems) >= limit:
                break
            if raw.strip():
                problems.append(_parse_line(raw, f"{path}:{lineno}"))
    if not problems:
        raise DataError(f"GSM8K file has no problems: {path}")
    return problems


def _parse_line(raw: bytes, where: str) -> MathProblem:
    """Parse one non-blank JSONL line; ``where`` is ``path:lineno`` for error messages."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise DataError(f"{where}: line is not valid UTF-8") from None
    except json.JSONDecodeError as e:
        raise DataError(
            f"{where}: malformed JSON ({e.msg} at column {e.colno})"
        ) from None
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for field in ("question", "answer"):
        if not isinstance(record.get(field), str):
            problem = "missing" if field not in record else "not a string"
            raise DataError(f"{where}: field {field!r} is {problem}")
    solution = record["answer"]
    if ANSWER_MARKER not in solution:
        raise DataError(
            f"{where}: answer has no {ANSWER_MARKER.strip()!r} final-answer marker"
        )
    final = (
        solution.rpartition(ANSWER_MARKER)[2].strip().replace(",", "").removeprefix("+")
    )
    if not _NUMBER.fullmatch(final):
        raise DataError(
            f"{where}: final answer {final[:40]!r} after '####' is not a number"
        )
    return MathProblem(question=record["question"], answer=final, solution=solution)
