"""A reproduction script's CSV (runs.csv, selections.csv): its rows read back, one row appended;
shared by the scripts."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def append_row(csv_path: Path, row: Mapping[str, Any], fields: Sequence[str]) -> None:
    """Append ``row`` to ``csv_path`` under an exclusive lock (app/filelock.py), so processes running
    other parts of a grid into the same directory can share the file: the header (``fields``)
    first when the file is new or empty, else the file's own columns (a CSV written before a column
    existed keeps its layout; keys outside the columns are left out)."""
    from app.filelock import exclusive_lock

    with exclusive_lock(csv_path.with_name(csv_path.name + ".lock")):
        new = not csv_path.exists() or csv_path.stat().st_size == 0
        columns = list(fields)
        if not new:
            with csv_path.open() as fh:
                columns = next(csv.reader(fh), None) or columns
        with csv_path.open("a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow(row)


def read_rows(csv_path: Path) -> list[dict[str, str]]:
    """Every row of ``csv_path`` (empty when it does not exist)."""
    if not csv_path.exists():
        return []
    with csv_path.open() as fh:
        return list(csv.DictReader(fh))
