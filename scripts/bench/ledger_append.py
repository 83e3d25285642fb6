"""Per-release cost of the privacy ledger's durable write (issue 23, section 1).

    python -m scripts.bench.ledger_append [--releases 300] [--dir DIR]

Raw I/O, one release = the bytes a release writes, made durable as each scheme does:

* ``append+fsync`` (the ledger before hash chaining): one JSON line appended, one fsync;
* ``chained, mark in place``: the chained line appended + fsync, then the high-water mark's slot
  rewritten in place without a sync (what app/privacy/ledger/ does);
* ``chained, mark fdatasync``: the same with the mark's slot fdatasynced (two syncs);
* ``chained, mark atomic``: the mark replaced whole (tmp file + fsync + rename + dir fsync);
* ``sqlite WAL FULL``: one INSERT in a transaction (journal_mode=WAL, synchronous=FULL);
* ``sqlite WAL FULL + mark db``: the same plus an UPDATE of a mark row in a second database
  (the equal-safety SQLite design: the mark in a second place);

and end to end, :meth:`PrivacyLedger.record_release` (lock, re-read, mark check, accounting,
append, mark) as the module under PYTHONPATH does it. Prints median / mean / p90 in ms per
release. Run it on the disk the state dir lives on (``--dir``): fsync costs are the disk's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

ROW = {"kind": "grad", "n": 229, "batch": 64, "noise_multiplier": 4.16, "count": 1, "disjoint": False, "round": 1,
       "seq": 0, "time": 1764600000.0}


def _append_fsync(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _line(i: int, head: str) -> tuple[bytes, str]:
    body = {"release": ROW | {"seq": i, "round": i + 1}}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    head = hashlib.sha256(head.encode() + b"\n" + canon).hexdigest()
    return json.dumps(body | {"hash": head}, sort_keys=True, separators=(",", ":")).encode() + b"\n", head


def _schemes(where: Path) -> dict[str, tuple[int, Callable[[int], None]]]:
    """name -> (syncs per release, one release as a function of its index)."""
    plain, chained = where / "plain.jsonl", where / "chained.jsonl"
    marks = {name: where / f"{name}.mark" for name in ("inplace", "sync", "atomic")}
    for p in (plain, chained):
        p.write_bytes(b'{"ledger":3}\n')
    for p in marks.values():
        p.write_bytes(b" " * 8192)
    state = {"head": "genesis"}

    def mark_slot(i: int) -> bytes:
        return json.dumps({"entries": i + 1, "head": state["head"], "eps_spent": 0.5}).encode().ljust(511) + b"\n"

    def plain_release(i: int) -> None:
        _append_fsync(plain, json.dumps({"release": ROW | {"seq": i}}, separators=(",", ":")).encode() + b"\n")

    def chained_release(i: int, mark: str) -> None:
        line, state["head"] = _line(i, state["head"])
        _append_fsync(chained, line)
        slot = mark_slot(i)
        if mark == "atomic":
            fd, tmp = tempfile.mkstemp(dir=where)
            os.write(fd, slot)
            os.fsync(fd)
            os.close(fd)
            os.replace(tmp, marks["atomic"])
            dfd = os.open(where, os.O_RDONLY)
            os.fsync(dfd)
            os.close(dfd)
            return
        fd = os.open(marks[mark], os.O_WRONLY)
        try:
            os.pwrite(fd, slot, 4096 * (i % 2))
            if mark == "sync":
                os.fdatasync(fd)
        finally:
            os.close(fd)

    def sqlite_db(name: str) -> sqlite3.Connection:
        db = sqlite3.connect(where / name, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    ledger_db, mark_db = sqlite_db("ledger.db"), sqlite_db("mark.db")
    ledger_db.execute("CREATE TABLE releases (seq INTEGER PRIMARY KEY, row TEXT, hash TEXT)")
    mark_db.execute("CREATE TABLE mark (id INTEGER PRIMARY KEY, entries INTEGER, head TEXT)")
    mark_db.execute("INSERT INTO mark VALUES (1, 0, '')")

    def sqlite_release(i: int, with_mark: bool) -> None:
        row = json.dumps(ROW | {"seq": i})
        head = hashlib.sha256(row.encode()).hexdigest()
        ledger_db.execute("BEGIN IMMEDIATE")
        ledger_db.execute("INSERT INTO releases VALUES (?, ?, ?)", (i if not with_mark else i + 10**6, row, head))
        ledger_db.execute("COMMIT")
        if with_mark:
            mark_db.execute("BEGIN IMMEDIATE")
            mark_db.execute("UPDATE mark SET entries = ?, head = ? WHERE id = 1", (i + 1, head))
            mark_db.execute("COMMIT")

    return {
        "append+fsync (before)": (1, plain_release),
        "chained, mark in place (now)": (1, lambda i: chained_release(i, "inplace")),
        "chained, mark fdatasync": (2, lambda i: chained_release(i, "sync")),
        "chained, mark atomic replace": (3, lambda i: chained_release(i, "atomic")),
        "sqlite WAL FULL": (1, lambda i: sqlite_release(i, False)),
        "sqlite WAL FULL + mark db": (2, lambda i: sqlite_release(i, True)),
    }


def _end_to_end(where: Path, releases: int, mark_sync: bool | None) -> list[float]:
    from app.privacy.accounting import Release
    from app.privacy.ledger import PrivacyLedger

    path = where / f"e2e-{mark_sync}.json"
    ledger = PrivacyLedger.open(path, float("inf"), 1e-5)
    if mark_sync is not None:
        ledger.mark_sync = mark_sync
    times = []
    for i in range(releases):
        t = time.perf_counter()
        ledger.record_release([Release("grad", 229, 64, 4.16)], round_=i + 1)
        times.append(time.perf_counter() - t)
    return times


def _stats(times: list[float]) -> tuple[float, float, float]:
    ms = sorted(1e3 * t for t in times)
    return statistics.median(ms), statistics.fmean(ms), ms[int(0.9 * (len(ms) - 1))]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--releases", type=int, default=300)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir in the cwd)")
    args = parser.parse_args(argv)
    base = args.dir or Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(dir=base, prefix=".ledger-bench-") as tmp:
        where = Path(tmp)
        schemes = _schemes(where)
        for rep in range(2):  # interleaved twice, so that a disk's slow moment is not one scheme's
            for name, (syncs, fn) in schemes.items():
                for i in range(5):  # warm-up
                    fn(10**7 + rep * 100 + i)
                times = []
                for i in range(args.releases // 2):
                    t = time.perf_counter()
                    fn(rep * 10**5 + i)
                    times.append(time.perf_counter() - t)
                rows.append({"scheme": name, "syncs": syncs, "times": times})
        from app.privacy import ledger as module

        variants = [None] if not hasattr(module.PrivacyLedger, "mark_sync") else [False, True]
        for sync in variants:
            name = ("record_release (this tree)" if sync is None else
                    f"record_release, mark {'fdatasync' if sync else 'in place'}")
            rows.append({"scheme": name, "syncs": "-", "times": _end_to_end(where, args.releases, sync)})
    merged: dict[str, dict] = {}
    for r in rows:
        m = merged.setdefault(r["scheme"], {"scheme": r["scheme"], "syncs": r["syncs"], "times": []})
        m["times"] += r["times"]
    print(f"{'scheme':34s} {'syncs':>5s} {'median ms':>10s} {'mean ms':>8s} {'p90 ms':>7s}   ({args.releases} releases, "
          f"{base})")
    out = []
    for m in merged.values():
        med, mean, p90 = _stats(m["times"])
        print(f"{m['scheme']:34s} {m['syncs']!s:>5s} {med:10.3f} {mean:8.3f} {p90:7.3f}")
        out.append({"scheme": m["scheme"], "syncs": m["syncs"], "median_ms": med, "mean_ms": mean, "p90_ms": p90})
    return out


if __name__ == "__main__":
    main()
