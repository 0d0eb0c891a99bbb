"""A directory cache keyed by content: build an expensive artifact once, verify it on every use.

An entry is ``<root>/<key>/`` where ``key`` is a hash of everything that determines the
artifact (its config, the code that builds it, library versions: :func:`fingerprint`). Next
to the artifact's files the entry holds ``cache_manifest.json``: the key, the SHA-256 of every
file, and what the builder reported (``info``). Building happens in a temporary sibling that is
renamed into place only after the manifest is written, under a file lock per key, so
concurrent users (pytest-xdist workers, two CI jobs on one disk) build once and never see half
an entry.

An entry is used only when it verifies (:func:`verify`): the manifest exists and names this
key, and every file it lists exists with its recorded hash and no other file was added. A
partial, corrupt or stale entry is rebuilt, never trusted, with one line saying why.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

MANIFEST = "cache_manifest.json"
LOCK_TIMEOUT_S = 3600.0  # a builder holding the lock longer than this is taken to be stuck


@dataclass(frozen=True)
class CacheEntry:
    """A verified entry: ``path`` (its directory), ``key``, ``built`` (True when this call built
    it, False when it was reused) and ``info`` (what the builder returned when it was built)."""

    path: Path
    key: str
    built: bool
    info: dict[str, Any]


class CacheError(RuntimeError):
    """The cache cannot be used: its lock was held past ``LOCK_TIMEOUT_S``, or a builder wrote nothing."""


def fingerprint(parts: Mapping[str, Any]) -> str:
    """A 20-hex-digit SHA-256 of ``parts`` as canonical JSON (sorted keys; values must be JSON).

    Raises:
        TypeError: a value is not JSON-serializable.
    """
    payload = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def source_digest(root: Path, exclude: Iterable[str] = ()) -> str:
    """SHA-256 of every ``*.py`` file under ``root`` (relative path and bytes, in path order),
    skipping files under the ``exclude`` subdirectories (relative to ``root``). Any edit to
    such a file, a comment included, changes the digest."""
    skip = tuple(Path(e).parts for e in exclude)
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(rel.parts[: len(s)] == s for s in skip) or "__pycache__" in rel.parts:
            continue
        digest.update(rel.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _file_hashes(directory: Path) -> dict[str, str]:
    hashes = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel != MANIFEST:
            hashes[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def verify(entry: Path, key: str) -> str | None:
    """Why the entry at ``entry`` cannot be trusted for ``key``, or None when it can.

    Reasons: no manifest (a partial build), an unreadable manifest, a manifest for another key
    (stale), a listed file missing or changed (corrupt), a file the manifest does not list.
    """
    try:
        manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "no manifest (a partial build)"
    except (OSError, ValueError) as e:
        return f"unreadable manifest ({e.__class__.__name__})"
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return f"manifest is for key {manifest.get('key') if isinstance(manifest, dict) else None!r}, not {key!r}"
    recorded: dict[str, str] = manifest.get("files", {})
    actual = _file_hashes(entry)
    for name, sha in sorted(recorded.items()):
        if name not in actual:
            return f"{name} is missing"
        if actual[name] != sha:
            return f"{name} changed (sha256 {actual[name][:12]}, recorded {sha[:12]})"
    extra = sorted(set(actual) - set(recorded))
    return f"{extra[0]} is not in the manifest" if extra else None


def get_or_build(root: Path, key: str, build: Callable[[Path], dict[str, Any]],
                 log: Callable[[str], None] = print) -> CacheEntry:
    """The verified entry ``root/key``, built now by ``build(directory)`` when it is missing or
    does not verify.

    ``build`` writes the artifact's files into the (empty, temporary) directory it is given and
    returns JSON-serializable ``info`` kept in the manifest. Only one process builds a key at a
    time; the others wait for it and then reuse its entry.

    Raises:
        CacheError: another process held the key's lock for more than ``LOCK_TIMEOUT_S``, or
            ``build`` wrote no file. Whatever ``build`` raises propagates (nothing is cached).
    """
    root.mkdir(parents=True, exist_ok=True)
    target = root / key
    lock = FileLock(str(root / f".{key}.lock"))
    try:
        lock.acquire(timeout=LOCK_TIMEOUT_S)
    except Timeout:
        raise CacheError(f"cache entry {target}: its lock {lock.lock_file} was held for over "
                         f"{LOCK_TIMEOUT_S:.0f} s; remove the lock if no build is running") from None
    try:
        if target.exists():
            reason = verify(target, key)
            if reason is None:
                manifest = json.loads((target / MANIFEST).read_text(encoding="utf-8"))
                return CacheEntry(target, key, built=False, info=manifest.get("info", {}))
            log(f"cache entry {target}: {reason}; rebuilding it")
            shutil.rmtree(target)
        return _build(root, target, key, build)
    finally:
        lock.release()


def _build(root: Path, target: Path, key: str, build: Callable[[Path], dict[str, Any]]) -> CacheEntry:
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=root))
    try:
        info = build(tmp)
        files = _file_hashes(tmp)
        if not files:
            raise CacheError(f"cache entry {target}: the builder wrote no file")
        manifest = {"key": key, "files": files, "info": info}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.rename(tmp, target)  # the entry appears whole or not at all
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return CacheEntry(target, key, built=True, info=info)
