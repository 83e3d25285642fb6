"""The pre-flight's noise plan, remembered between launches (app/launch.py ``print_noise_plan``).

The plan's lines (app/noise_plan.py ``preflight_lines``) are a pure function of what the noise
plan reads of the run (``NoiseRun``, whose repr names every field), the silos' sizes, the model's
parameter count d, the words for where the sizes come from, the code that computes them and the
libraries it calls. Computing them costs little (~40 ms); importing dp-accounting for the
calibration costs ~0.8-1 s of CPU (scipy's signal, stats and optimize), most of the launcher's
pre-flight. So the lines are stored under ``$FLWR_HOME/silofl-noise-plans/<key>.json`` with

    key = sha256(format, repr(run), sizes, d, sizes_from,
                 sha256 of every app/**/*.py (path and bytes), Python's version, the machine's
                 architecture, the installed versions of dp-accounting, numpy, scipy and absl-py)

and a launch whose key is stored prints the stored lines: the same lines the computation would
print (any edit under app/ or any other library version is another key). A plan that fails to
compute raises as before and stores nothing; a stored file that cannot be read is computed again.
At most :data:`MAX_ENTRIES` plans are kept (the least recently written go first).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

APP_DIR = Path(__file__).resolve().parent
#: the folder under FLWR_HOME
CACHE_DIR = "silofl-noise-plans"
#: bump when the stored form or the key's recipe changes
FORMAT = 1
MAX_ENTRIES = 256
LIBRARIES = ("dp-accounting", "numpy", "scipy", "absl-py")


def code_fingerprint(app_dir: Path = APP_DIR) -> str:
    """sha256 over every ``*.py`` under ``app_dir`` (relative path and bytes, sorted by path)."""
    h = hashlib.sha256()
    for path in sorted(app_dir.rglob("*.py")):
        h.update(str(path.relative_to(app_dir)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def _library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return versions


def plan_key(run: Any, sizes: Sequence[int] | None, dim: int, sizes_from: str) -> str:
    """The cache key of the module docstring."""
    what = {"format": FORMAT, "run": repr(run), "sizes": None if sizes is None else [int(n) for n in sizes],
            "dim": int(dim), "sizes_from": sizes_from, "code": code_fingerprint(), "python": sys.version, "machine": platform.machine(),
            "libraries": _library_versions()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _read(path: Path) -> list[str] | None:
    try:
        lines = json.loads(path.read_text())["lines"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return lines if isinstance(lines, list) and all(isinstance(x, str) for x in lines) else None


def _write(folder: Path, path: Path, lines: list[str]) -> None:
    """Atomically (a temporary file renamed), then drop the oldest beyond MAX_ENTRIES; a folder that
    cannot be written only costs the next launch the computation."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, prefix=".tmp-", suffix=".json", delete=False) as fh:
            json.dump({"lines": lines}, fh)
        os.replace(fh.name, path)
        entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for old in entries[:-MAX_ENTRIES]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def noise_plan_lines(run: Any, sizes: Sequence[int] | None, dim: int, sizes_from: str, home: Path,
                     compute: Callable[[], list[str]]) -> list[str]:
    """The lines stored under ``home`` for this plan's key, else ``compute()`` (stored on success)."""
    folder = home / CACHE_DIR
    path = folder / f"{plan_key(run, sizes, dim, sizes_from)}.json"
    lines = _read(path)
    if lines is None:
        lines = compute()
        _write(folder, path, lines)
    return lines
