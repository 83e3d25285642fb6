"""One advisory file lock for every read-check-write that several processes may do at once
(a sweep's results.csv, a silo's privacy ledger).

    with exclusive_lock(path.with_suffix(".lock")):
        ...  # re-read, check, write

``flock(LOCK_EX)`` on a separate lock file: it blocks until no other process holds the lock, and
the kernel releases it if the holder dies. POSIX only (``fcntl``).
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


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
