"""Run outputs: ``outputs/<run>/rounds.jsonl`` (one object per round) and ``summary.json``.

Non-finite floats are written as the strings "inf", "-inf", "nan" so that every file is
strict JSON (e.g. eps_spent = "inf" for a non-private run).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any


def jsonable(obj: Any) -> Any:
    """Replace non-finite floats by strings, recursively."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


class RunRecorder:
    """Appends round rows and writes the summary of one run."""

    def __init__(self, out_dir: str | Path, keep: list[dict[str, Any]] | None = None) -> None:
        """A fresh rounds.jsonl, or (``keep``: a resumed run) one holding exactly those rows."""
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.rounds_path = self.out_dir / "rounds.jsonl"
        self.summary_path = self.out_dir / "summary.json"
        self.rounds_path.write_text("".join(json.dumps(jsonable(r), allow_nan=False) + "\n" for r in keep or []))

    def round(self, row: dict[str, Any]) -> None:
        with self.rounds_path.open("a") as fh:
            fh.write(json.dumps(jsonable(row), allow_nan=False) + "\n")

    def summary(self, summary: dict[str, Any]) -> None:
        tmp = self.summary_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(jsonable(summary), indent=2, allow_nan=False))
        tmp.replace(self.summary_path)


def load_rounds(path: str | Path) -> list[dict[str, Any]]:
    """Read rounds.jsonl back."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def complete_csv_rows(path: str | Path) -> list[dict[str, str]]:
    """A CSV's rows (results.csv), less a last row cut by a kill or a full disk: the text after
    the file's last newline is not a row (a complete row always ends in one; a row is one line,
    see :func:`csv_line`), so a cut row never reads as a finished job with empty columns."""
    text = Path(path).read_bytes().decode("utf-8", errors="replace")
    return list(csv.DictReader(io.StringIO(text[: text.rfind("\n") + 1], newline="")))


def csv_line(fields: list[str], row: dict[str, Any]) -> str:
    """One CSV row as one line ending in ``\\r\\n`` (fields outside ``fields`` left out; line
    breaks inside a value written as spaces, so that a row's end is its file's only kind of line
    end and a cut row is recognisable as the text after the last one)."""
    buf = io.StringIO(newline="")
    clean = {k: (" ".join(v.splitlines()) if isinstance(v, str) else v) for k, v in row.items()}
    csv.DictWriter(buf, fieldnames=fields, restval="", extrasaction="ignore").writerow(clean)
    return buf.getvalue()


def run_name(settings: Any, suffix: int) -> str:
    """A run's folder name under outputs/: ``run-name`` when set, else the UTC time stamp,
    algorithm, dataset, epsilon, seed and a five-digit suffix (the Flower run id's last digits).
    Here, not in the ServerApp, so the launcher names a run without importing torch."""
    from datetime import datetime, timezone

    if settings.run_name:
        return settings.run_name
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    eps = "inf" if not settings.privacy.enabled else f"{settings.privacy.epsilon:g}"
    return f"{stamp}-{settings.algorithm}-{settings.dataset}-eps{eps}-seed{settings.seed}-{suffix % 100000:05d}"
