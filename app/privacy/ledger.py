"""The silo's privacy ledger: a file on the silo's own disk recording every release.

The ledger is the silo's source of truth for what it has spent. Several processes may serve
the same silo (a simulation engine runs silos in a pool of workers; a restarted SuperNode), so
every read-check-write happens under an exclusive file lock on ``<ledger>.lock`` and starts by
re-reading the file: an in-memory copy is never trusted. A release is checked and written to
disk in one step, :meth:`PrivacyLedger.record_release`, *before* the silo computes it; one that
would take epsilon above the budget is refused with :class:`BudgetExceededError`. A crash can
only over-count, never under-count. A silo that restarts reloads the file and continues from
what it has already spent.

File format (version 2): JSON lines, append-only. The first line is the header, written
atomically (and the directory fsynced) when the ledger is created::

    {"ledger": 2, "epsilon_budget": 3.0, "delta": 1e-05}
    {"calibration": {"key": ..., "noise_multiplier": 4.16, "block_seed": ...}}
    {"release": {"kind": "grad", "n": 229, "batch": 64, "noise_multiplier": 4.16, "count": 1,
                 "disjoint": false, "round": 1, "seq": 0, "time": 1764600000.0}}

one ``release`` line per row (in ``seq`` order) and a ``calibration`` line each time the noise plan
is stored (the last one wins). A release costs one append of its line and one fsync, under the
lock; a reader parses only the bytes appended since its last read (it keeps the file's identity,
size and last bytes: another process may have appended; a file that shrank, was replaced or was
rewritten in place is read again in full). A last line without its newline is the trace of a crash in the middle of an append:
that release never returned, so nothing was computed or sent from it, and the line is cut off
(under the lock, with a warning). Any other line that is not one of the three kinds is an error
(:class:`LedgerError`), as is a header for another budget. A version-1 ledger (one JSON object,
rewritten whole on every release) is converted to version 2 on first open, atomically.
:func:`read_ledger` reads either version without the lock, for reports and tests.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from app.filelock import append_bytes_durably, exclusive_lock, write_bytes_atomically
from app.privacy.accounting import Release, epsilon_spent

LEDGER_VERSION = 2
#: how many of the last bytes read a handle checks again before it reads on
_TAIL_BYTES = 64
#: Relative slack for floating-point noise when comparing epsilon with the budget.
BUDGET_RTOL = 1e-9

logger = logging.getLogger(__name__)


class BudgetExceededError(RuntimeError):
    """A requested release would exceed the silo's privacy budget."""


class LedgerError(RuntimeError):
    """The ledger file is unreadable or belongs to a different budget."""


@dataclass
class PrivacyLedger:
    """Budget (epsilon, delta), the calibrated noise plan, and every release made."""

    path: Path
    epsilon_budget: float
    delta: float
    releases: list[dict[str, Any]] = field(default_factory=list)
    calibration: dict[str, Any] = field(default_factory=dict)
    #: what this handle has parsed: the file's (st_dev, st_ino), the bytes read from it, and the
    #: last of them (checked again before reading on: a different file behind the same inode)
    _file_id: tuple[int, int] | None = field(default=None, repr=False, compare=False)
    _offset: int = field(default=0, repr=False, compare=False)
    _tail: bytes = field(default=b"", repr=False, compare=False)
    #: the recorded releases grouped by kind (count 1 -> total count): what the accountant composes
    _counts: Counter[Release] = field(default_factory=Counter, repr=False, compare=False)
    _grouped_cache: list[Release] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def open(cls, path: str | Path, epsilon_budget: float, delta: float) -> PrivacyLedger:
        """Load the ledger at ``path`` or create an empty one. An existing ledger written for a
        different budget is an error: a silo's budget cannot be changed after spending."""
        ledger = cls(Path(path), float(epsilon_budget), float(delta))
        with ledger._locked():
            if ledger.path.exists():
                ledger._reload()
            else:
                ledger._create()
        return ledger

    def _reload(self) -> None:
        """Bring this handle up to date with the file (caller holds the lock): parse the lines
        appended since the last read, or the whole file if it was replaced or shrank."""
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                file_id = (st.st_dev, st.st_ino)
                data = b""
                if file_id == self._file_id and st.st_size >= self._offset:
                    fh.seek(self._offset - len(self._tail))
                    data = fh.read()
                    if data.startswith(self._tail):  # the bytes it has read are still there
                        data = data[len(self._tail):]
                        if not data:
                            return
                    else:
                        self._file_id = None
                if file_id != self._file_id or st.st_size < self._offset:
                    self._file_id, self._offset, self._tail = None, 0, b""
                    fh.seek(0)
                    data = fh.read()
        except OSError as exc:
            raise LedgerError(f"privacy ledger {self.path} is unreadable: {exc}") from exc
        if self._file_id is None:  # a full read
            if _is_version_1(data):
                self._migrate_version_1(data)
                return
            header, releases, calibration, used = _parse(self.path, data, first=True)
            self._check_budget(_decode_float(header["epsilon_budget"]), float(header["delta"]))
            self.releases, self.calibration, self._counts, self._grouped_cache = [], calibration or {}, Counter(), None
        else:
            _, releases, calibration, used = _parse(self.path, data, first=False)
            if calibration is not None:
                self.calibration = calibration
        self._add_rows(releases)
        if used < len(data):  # a torn last line: its release never returned; cut it off
            logger.warning("privacy ledger %s: dropping an incomplete last line (%d bytes) left by an interrupted "
                           "write", self.path, len(data) - used)
            os.truncate(self.path, self._offset + used)
        self._file_id, self._offset = file_id, self._offset + used
        self._tail = (self._tail + data[:used])[-_TAIL_BYTES:]

    def _check_budget(self, stored_eps: float, stored_delta: float) -> None:
        same_eps = stored_eps == self.epsilon_budget or math.isclose(stored_eps, self.epsilon_budget)
        if not same_eps or not math.isclose(stored_delta, self.delta):
            raise LedgerError(
                f"privacy ledger {self.path} was written for budget (epsilon={stored_eps}, delta={stored_delta}) "
                f"but this run asks for (epsilon={self.epsilon_budget}, delta={self.delta}); "
                "use a new state dir or ledger scope"
            )

    def _create(self) -> None:
        """A new ledger: its header line, written atomically (caller holds the lock)."""
        self._replace_file([], {})

    def _migrate_version_1(self, data: bytes) -> None:
        """Convert a version-1 ledger (one JSON object) to version 2, atomically."""
        try:
            doc = json.loads(data)
            stored_eps, stored_delta = _decode_float(doc["epsilon_budget"]), float(doc["delta"])
            releases = [dict(r) for r in doc["releases"]]
            calibration = dict(doc.get("calibration", {}))
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"privacy ledger {self.path} is unreadable: {exc}") from exc
        self._check_budget(stored_eps, stored_delta)
        logger.info("privacy ledger %s: converting version 1 (%d releases) to version %d", self.path, len(releases),
                    LEDGER_VERSION)
        self._replace_file(releases, calibration)

    def _replace_file(self, releases: list[dict[str, Any]], calibration: dict[str, Any]) -> None:
        lines = [_line({"ledger": LEDGER_VERSION, "epsilon_budget": _encode_float(self.epsilon_budget),
                        "delta": self.delta})]
        if calibration:
            lines.append(_line({"calibration": calibration}))
        lines += [_line({"release": row}) for row in releases]
        data = b"".join(lines)
        write_bytes_atomically(self.path, data, sync_dir=True)
        st = os.stat(self.path)
        self.releases, self.calibration, self._counts, self._grouped_cache = [], dict(calibration), Counter(), None
        self._add_rows(releases)
        self._file_id, self._offset, self._tail = (st.st_dev, st.st_ino), len(data), data[-_TAIL_BYTES:]

    def _add_rows(self, rows: list[dict[str, Any]]) -> None:
        self._grouped_cache = None
        for row in rows:
            r = _release(row)
            self._counts[replace(r, count=1)] += r.count
        self.releases.extend(rows)

    def _append(self, entries: list[dict[str, Any]]) -> None:
        """Append ``entries`` as lines, durably (caller holds the lock and has just reloaded)."""
        data = b"".join(_line(e) for e in entries)
        try:
            end = append_bytes_durably(self.path, data)
        except OSError as exc:
            self._file_id = None  # read it again in full next time (it may hold a torn line)
            raise LedgerError(f"privacy ledger {self.path} could not be written: {exc}") from exc
        if end != self._offset + len(data):  # someone wrote without the lock: trust nothing read
            self._file_id = None
        self._offset, self._tail = end, (self._tail + data)[-_TAIL_BYTES:]

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return exclusive_lock(_lock_path(self.path))

    # -- accounting ---------------------------------------------------------------------
    def recorded(self) -> list[Release]:
        """The recorded releases as accountant events."""
        return [_release(r) for r in self.releases]

    def _grouped(self) -> list[Release]:
        """The recorded releases, identical ones merged into one with their total count: the
        same composition as :meth:`recorded` (epsilon_spent merges them the same way), without
        a pass over the whole history per question."""
        if self._grouped_cache is None:
            self._grouped_cache = [replace(r, count=c) for r, c in self._counts.items() if c > 0]
        return list(self._grouped_cache)

    def spent(self) -> float:
        """Epsilon spent so far at the ledger's delta (0 when nothing was released)."""
        with self._locked():
            self._reload()
        return epsilon_spent(self._grouped(), self.delta)

    def _check_loaded(self, new: list[Release], exclusive_round: int | None = None) -> float:
        if exclusive_round is not None:
            kinds = {r.kind for r in new}
            if any(row["kind"] in kinds and int(row.get("round", -1)) == exclusive_round for row in self.releases):
                raise BudgetExceededError(f"release refused: round {exclusive_round}'s block of records was already "
                                          f"released ({', '.join(sorted(kinds))}); each block may be released once")
        try:
            after = epsilon_spent(self._grouped() + list(new), self.delta)
        except ValueError as exc:  # e.g. more disjoint releases than disjoint blocks
            raise BudgetExceededError(f"release refused: {exc}") from exc
        if not math.isinf(self.epsilon_budget) and after > self.epsilon_budget * (1 + BUDGET_RTOL):
            kinds = ", ".join(f"{r.count}x {r.kind} (K={r.batch} of n={r.n}, z={r.noise_multiplier:.4g})" for r in new)
            raise BudgetExceededError(
                f"privacy budget exceeded: budget epsilon={self.epsilon_budget:g} at delta={self.delta:.3g}, "
                f"spent {epsilon_spent(self._grouped(), self.delta):.4f}, this request ({kinds}) would bring it to {after:.4f}"
            )
        return after

    def record(self, new: list[Release], *, round_: int, extra: dict[str, Any] | None = None,
               exclusive: bool = False) -> float:
        """Check, then append ``new`` to the file (durably, under the lock). Returns epsilon
        spent after. ``exclusive``: refuse if ``new``'s kind was already released in ``round_``."""
        return self.record_release(new, round_=round_, extra=extra, exclusive=exclusive)[0]

    def record_release(self, new: list[Release], *, round_: int, extra: dict[str, Any] | None = None,
                       exclusive: bool = False) -> tuple[float, int]:
        """:meth:`record`, also returning the release's sequence number: the number of rows the
        ledger held before it. Rows are only ever appended under the lock, so every release of
        this ledger gets its own number, whatever round the server says it is, even when
        several processes serve the silo; the silo keys its noise and batch draws to it
        (a release's randomness never repeats). The rows are on disk (appended and fsynced)
        when this returns."""
        with self._locked():
            self._reload()
            after = self._check_loaded(new, round_ if exclusive else None)
            seq = len(self.releases)
            stamp = time.time()
            rows = []
            for i, r in enumerate(new):
                row = _row(r) | {"round": int(round_), "seq": seq + i, "time": stamp}
                if extra:
                    row |= extra
                rows.append(row)
            self._append([{"release": row} for row in rows])
            self._add_rows(rows)
        return after, seq

    def set_calibration(self, calibration: dict[str, Any]) -> None:
        """Store the noise plan so a restarted silo keeps the same noise multiplier."""
        with self._locked():
            self._reload()
            self._append([{"calibration": dict(calibration)}])
            self.calibration = dict(calibration)


def read_ledger(path: str | Path) -> dict[str, Any]:
    """A ledger file's contents (either version), read without the lock and without changing
    the file: ``version``, ``epsilon_budget``, ``delta``, ``calibration`` and ``releases``. An
    incomplete last line (an append in progress, or a crash's) is left out."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LedgerError(f"privacy ledger {path} is unreadable: {exc}") from exc
    if _is_version_1(data):
        try:
            doc = json.loads(data)
            return {"version": 1, "epsilon_budget": _decode_float(doc["epsilon_budget"]), "delta": float(doc["delta"]),
                    "calibration": dict(doc.get("calibration", {})), "releases": list(doc["releases"])}
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"privacy ledger {path} is unreadable: {exc}") from exc
    header, releases, calibration, _ = _parse(path, data, first=True)
    return {"version": int(header["ledger"]), "epsilon_budget": _decode_float(header["epsilon_budget"]),
            "delta": float(header["delta"]), "calibration": calibration or {}, "releases": releases}


def _line(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def _is_version_1(data: bytes) -> bool:
    """Version 1 is one JSON object (a whole-file JSON document); version 2 starts with a
    one-line header ``{"ledger": 2, ...}``. Anything else is read as version 1 and fails there."""
    first = data.split(b"\n", 1)[0]
    try:
        head = json.loads(first)
    except ValueError:
        return True
    return not (isinstance(head, dict) and "ledger" in head)


def _parse(path: Path, data: bytes, *, first: bool
           ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None, int]:
    """Parse complete lines of ``data`` (a whole version-2 file if ``first``, else what was
    appended since the last read): (header, release rows, last calibration or None, bytes
    used). Bytes after the last newline (a torn append) are not used."""
    used = data.rfind(b"\n") + 1
    lines = data[:used].split(b"\n")[:-1]
    header: dict[str, Any] = {}
    releases: list[dict[str, Any]] = []
    calibration: dict[str, Any] | None = None
    for i, raw in enumerate(lines):
        try:
            entry = json.loads(raw)
            if not isinstance(entry, dict) or len(entry) != 1 and not (first and i == 0):
                raise ValueError(f"not a ledger entry: {raw[:80]!r}")
            if first and i == 0:
                if entry.get("ledger") != LEDGER_VERSION:
                    raise ValueError(f"no version-{LEDGER_VERSION} ledger header: {raw[:80]!r}")
                header = {"ledger": entry["ledger"], "epsilon_budget": entry["epsilon_budget"], "delta": entry["delta"]}
            elif "release" in entry:
                row = entry["release"]
                _release(row)  # a row the accountant can read
                releases.append(row)
            elif "calibration" in entry and isinstance(entry["calibration"], dict):
                calibration = entry["calibration"]
            else:
                raise ValueError(f"not a ledger entry: {raw[:80]!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"privacy ledger {path} is unreadable: line {i + 1} of the part read: {exc}") from exc
    if first and not header:
        raise LedgerError(f"privacy ledger {path} is unreadable: no complete header line")
    return header, releases, calibration, used


def _release(r: dict[str, Any]) -> Release:
    return Release(r["kind"], int(r["n"]), int(r["batch"]), float(r["noise_multiplier"]), int(r.get("count", 1)),
                   bool(r.get("disjoint", False)), str(r.get("mechanism", "gaussian")), int(r.get("trials", 0)),
                   int(r.get("levels", 0)), float(r.get("p", 0.0)), int(r.get("dim", 0)),
                   str(r.get("amplification", "none")))


_RELEASE_FIELDS = tuple(f.name for f in fields(Release))
_BINOMIAL_FIELDS = ("mechanism", "trials", "levels", "p", "dim")


def _row(r: Release) -> dict[str, Any]:
    """A release as a ledger row (its fields in order, as ``asdict`` gives them: they are plain
    values); a Gaussian one without the binomial fields (unused there), and ``amplification``
    only where one is claimed (rows without it read as "none")."""
    return {name: getattr(r, name) for name in _RELEASE_FIELDS if (r.binomial or name not in _BINOMIAL_FIELDS)
            and not (name == "amplification" and r.amplification == "none")}


@functools.lru_cache(maxsize=1024)
def _lock_path(path: Path) -> Path:
    return path.with_suffix(path.suffix + ".lock")


def _encode_float(x: float) -> float | str:
    return "inf" if math.isinf(x) else x


def _decode_float(x: float | str) -> float:
    return math.inf if x == "inf" else float(x)
