"""A sweep's ``results.csv``: the job id, the file (appended under a lock), and which finished
row already holds a job's federation (settings that do not act left out)."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.config import SCHEMA, inert_options
from app.filelock import append_bytes_durably, exclusive_lock, write_bytes_atomically
from app.results import complete_csv_rows, csv_line
from app.run_health import FINISHED

RESULT_FIELDS = ["job", "status", "error", "test_error", "test_accuracy", "best_test_error", "val_error",
                 "train_loss", "grad_mapping_norm", "eps_max_spent", "eps_per_silo", "uploads_G", "rounds_done",
                 "retries", "selected", "grid_points", "wall_s", "overhead_s", "run_dir"]


def job_key(flat: Mapping[str, Any], sweep: Mapping[str, Any]) -> str:
    """A stable id for a job: its run config and its tuning settings."""
    blob = json.dumps({"run": dict(sorted(flat.items())), "tuning": sweep.get("tuning"),
                       "grid": sweep.get("grid") if sweep.get("tuning") == "grid" else None,
                       "validation-fraction": sweep.get("validation-fraction") if sweep.get("tuning") == "grid" else None},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ResultsFile:
    """``results.csv`` of one sweep, appended under a file lock (jobs may run concurrently)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fields = RESULT_FIELDS + sorted(SCHEMA)

    def rows(self) -> list[dict[str, str]]:
        """The complete rows (a last row cut by a kill or a full disk is not one)."""
        if not self.path.exists():
            return []
        return complete_csv_rows(self.path)

    def completed(self, job: str) -> bool:
        """Whether ``job`` has a row of a run that ran to its end (healthy or not)."""
        return any(r["job"] == job and r["status"] in FINISHED for r in self.rows())

    def append(self, row: Mapping[str, Any]) -> None:
        """One row, as one line in one write, flushed and fsynced. A last row cut by a kill or a
        full disk (the file does not end in a newline) is first moved to ``results.csv.partial``
        (its job counts as not run, and runs again on resume): before, the next row was glued onto
        it, so that job was lost and the cut row read as finished with the other job's columns.
        A file written by a version with other options (another header) is first rewritten under
        the union of both headers, so no column shifts under the wrong name."""
        with exclusive_lock(self.path.with_suffix(".lock")):
            self._cut_partial_row()
            new = not self.path.exists() or self.path.stat().st_size == 0
            if not new:
                with self.path.open(newline="") as fh:
                    header = next(csv.reader(fh), [])
                if header != self.fields:  # the whole file is read (and rewritten) only then
                    old = self.rows()
                    fields = self.fields + [f for f in header if f not in self.fields]
                    text = csv_line(fields, dict(zip(fields, fields))) + "".join(csv_line(fields, r) for r in old)
                    write_bytes_atomically(self.path, text.encode())
                    self.fields = fields
            line = csv_line(self.fields, {k: _cell(v) for k, v in row.items()})
            if new:
                line = csv_line(self.fields, dict(zip(self.fields, self.fields))) + line
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.touch()
            append_bytes_durably(self.path, line.encode())

    def _cut_partial_row(self) -> None:
        """Under the lock: a file that does not end in a newline ends in a cut row; its bytes go
        to ``<name>.partial`` (kept, appended, for a look) and the file is cut back to its last
        newline, with one line on stderr."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("r+b") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) == b"\n":
                return
            fh.seek(0)
            data = fh.read()  # a cut row is rare: the whole file is read only then
            keep = data.rfind(b"\n") + 1
            partial = self.path.with_name(self.path.name + ".partial")
            with partial.open("ab") as out:
                out.write(data[keep:] + b"\n")
                out.flush()
                os.fsync(out.fileno())
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
        print(f"[sweep] {self.path} ended in a cut row ({len(data) - keep} bytes: a killed job or a full disk); "
              f"moved to {partial.name}, and that job runs again", file=sys.stderr)


def _cell(v: Any) -> Any:
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    if v is None:
        return ""
    return v


def acting_settings(flat: Mapping[str, Any]) -> dict[str, str]:
    """The settings as results.csv holds them (strings), less those that do not act, as each
    option declares it (app.config.inert_options: the other ``privacy.*`` keys when privacy.mode
    is off, ``sketch.*`` without a sketch, an algorithm's own knobs under another algorithm; not
    ``attack.*`` without an attack: attack.fraction is also Krum's f). Two jobs with the same
    acting settings run the same federation."""
    out = {k: str(_cell(flat[k])) for k in SCHEMA if k in flat}
    inert = inert_options(out)
    return {k: v for k, v in out.items() if k not in inert}


def same_federation(results: ResultsFile, flat: Mapping[str, Any], sweep: Mapping[str, Any]) -> dict[str, str] | None:
    """A finished row of this sweep whose federation is this job's (:func:`acting_settings`
    equal; fixed tuning only), e.g. privacy=off jobs of a sweep over ε: it need not run again."""
    if str(sweep.get("tuning", "fixed")) != "fixed":
        return None
    mine = acting_settings(flat)
    for r in results.rows():
        if r["status"] in FINISHED and r.get("grid_points") in ("", "1") and acting_settings(r) == mine:
            return r
    return None
