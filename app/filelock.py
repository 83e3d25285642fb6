"""One advisory file lock for every read-check-write that several processes may do at once
(a sweep's results.csv, a silo's privacy ledger, the shuffler's aggregated exchanges), one
atomic JSON write for the files such a step rewrites, and one durable append for the files it
only grows (the ledger).

    with exclusive_lock(path.with_suffix(".lock")):
        ...  # re-read, check, write

``flock(LOCK_EX)`` on a separate lock file: it blocks until no other process holds the lock, and
the kernel releases it if the holder dies. POSIX only (``fcntl``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def exclusive_lock(lock_path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created, with its parent directory, if missing)."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def write_bytes_atomically(path: str | Path, data: bytes, *, sync_dir: bool = False, sync: bool = True) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the new one, never a
    part: a temporary file in the same directory, flushed and fsynced, then renamed over ``path``
    (the temporary file is removed if anything fails). ``sync_dir``: also fsync the directory,
    so the rename itself survives a power loss. ``sync`` False: no fsync at all (still atomic
    for every reader and across a process crash; durable only once the OS writes it back, or
    someone calls ``os.sync()``: a simulation's virtual silos, app/privacy/ledger/handle.py)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync_dir and sync:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_json_atomically(path: str | Path, payload: Any, *, indent: int | None = None) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (:func:`write_bytes_atomically`)."""
    write_bytes_atomically(path, json.dumps(payload, indent=indent).encode())


def append_bytes_durably(path: str | Path, data: bytes, *, sync: bool = True) -> int:
    """Append ``data`` to the existing file ``path`` and fsync it: when this returns, the bytes
    (and the file's new size) are on disk (``sync`` False: in the OS's page cache, which a
    process crash does not lose; on disk at the next ``os.sync()`` or writeback). Returns the
    file's size after the append. The caller
    holds the lock that serialises appends, so the bytes land contiguously at the end; a crash
    part-way leaves a prefix of ``data`` (a reader under the lock can recognise and cut it)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)
