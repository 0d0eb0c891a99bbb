"""Checkpoint directories: written atomically, found again after a crash, pruned safely.

A training checkpoint is ``<checkpoint.dir>/step_<N>/`` with a ``COMPLETE`` marker written
last. It is built in a temporary sibling and renamed into place, so a crash mid-save leaves
the previous checkpoints as they were; a ``step_<N>`` without the marker (copied by hand,
written by another tool) is never resumed from and never deleted.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from posttrain.errors import ConfigError

COMPLETE = "COMPLETE"
_STEP_DIR = re.compile(r"^step_(\d+)$")


@contextlib.contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces ``target`` in one rename.

    An existing ``target`` is moved aside first and deleted only after the new one is in
    place. On an exception the temporary directory is removed and ``target`` is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.rename(target, old)
    os.rename(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def step_dirs(root: Path) -> dict[int, Path]:
    """``step -> directory`` of every ``step_<N>`` directory in ``root`` (complete or not)."""
    if not root.is_dir():
        return {}
    found = {}
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found[int(match.group(1))] = child
    return found


def is_complete(path: Path) -> bool:
    return (path / COMPLETE).is_file()


def latest_complete(root: Path) -> Path | None:
    """The complete checkpoint of the highest step in ``root``, or None. Each incomplete
    ``step_<N>`` newer than it is reported on stderr (one line each) and left alone."""
    for _step, path in sorted(step_dirs(root).items(), reverse=True):
        if is_complete(path):
            return path
        print(f"warning: ignoring incomplete checkpoint {path} (no {COMPLETE} marker)", file=sys.stderr)
    return None


def save_step(root: Path, step: int, write: Callable[[Path], None], keep_last: int) -> Path:
    """Write checkpoint ``step`` with ``write(tmp_dir)``, mark it complete, rename it into
    place, then delete complete checkpoints older than the ``keep_last`` newest.

    Returns:
        The checkpoint's directory ``root/step_<step>``.
    """
    target = Path(root) / f"step_{step}"
    with atomic_dir(target) as tmp:
        write(tmp)
        (tmp / COMPLETE).write_text(f"{step}\n")
    complete = sorted(s for s, p in step_dirs(Path(root)).items() if is_complete(p))
    for old in complete[:-keep_last]:
        shutil.rmtree(Path(root) / f"step_{old}", ignore_errors=True)
    return target


def check_written_by(path: Path | str, layout: str, saved: int, current: int) -> None:
    """Refuse to resume from a checkpoint written by another number of ranks than this run has.

    Either way round a rank would restore state of another layout: with fewer ranks than the
    checkpoint, some saved state is never read; with more, some rank has none of its own.

    Args:
        path: the checkpoint, for the message.
        layout: the config key (or keys) that set the rank count, for the message.
        saved, current: the rank count the checkpoint was written with, and this run's.

    Raises:
        ConfigError: ``saved != current``; one line naming the checkpoint, the key and both counts.
    """
    if saved != current:
        raise ConfigError(f"checkpoint '{path}' was written with {layout}={saved}; this run has {current} "
                          "(resume with the same size)")
