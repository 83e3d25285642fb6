"""The silo's handle on its privacy ledger, :class:`PrivacyLedger`: every read-check-write under the
ledger's file lock, a release checked against the budget and written before it is computed. The
file format, the high-water mark and what a mismatch means: app/privacy/ledger/__init__.py."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from app.filelock import append_bytes_durably, exclusive_lock, write_bytes_atomically
from app.privacy.accounting import Release, epsilon_spent
from app.privacy.ledger.chain import (LEDGER_VERSION, Chain, LedgerError, canonical, chain_hash, encode_float,
                                      epsilon_of, genesis, release_of_row, row_of_release)
from app.privacy.ledger.inspection import Inspection, inspect, judge
from app.privacy.ledger.mark import mark_path_for, read_mark, write_mark
from app.privacy.ledger.witness import (ahead, key_id, key_path_for, load_or_create_key, make_witness,
                                        read_witness_file, verified, witness_path_for, witness_problem,
                                        write_witness_file)

#: how many of the last bytes read a handle checks again before it reads on
TAIL_BYTES = 64
#: Relative slack for floating-point noise when comparing epsilon with the budget.
BUDGET_RTOL = 1e-9

logger = logging.getLogger(__package__)  # app.privacy.ledger, the package's


class BudgetExceededError(RuntimeError):
    """A requested release would exceed the silo's privacy budget."""


@dataclass
class PrivacyLedger:
    """Budget (epsilon, delta), the calibrated noise plan, and every release made."""

    path: Path
    epsilon_budget: float
    delta: float
    releases: list[dict[str, Any]] = field(default_factory=list)
    calibration: dict[str, Any] = field(default_factory=dict)
    #: the adoptions recorded in the chain (a legacy ledger's conversion, an operator's adopt)
    adoptions: list[dict[str, Any]] = field(default_factory=list)
    mark_path: Path | None = None
    #: fsync the mark after every write (False: written in place, not synced; see the module doc)
    mark_sync: bool = False
    #: fsync every entry as it is appended (a deployed silo, a silo with a privacy cap). False:
    #: a simulation's virtual silo, whose entries are written at once (a process crash loses
    #: nothing) and reach the disk at the server's ``os.sync()`` after each exchange, before it
    #: writes its witnesses of them (WitnessStore.flush, app/privacy/ledger/witness.py) and its
    #: checkpoint: a resumed simulation finds ledgers that match its checkpoint
    sync: bool = True
    #: the ledger key (app/privacy/ledger/witness.py): chains a new ledger, MACs its witnesses
    key: bytes | None = field(default=None, repr=False, compare=False)
    #: where the ledger's witness is kept on this node (a witness found ahead; with node config
    #: ledger-witness-dir, also the current one after every release)
    witness_path: Path | None = None
    #: write the current witness to witness_path after every release (ledger-witness-dir is set)
    witness_copy: bool = False
    #: the key this ledger's chain uses (None: a ledger chained before keys)
    _ck: bytes | None = field(default=None, repr=False, compare=False)
    #: the hash after each entry
    _heads: list[str] = field(default_factory=list, repr=False, compare=False)
    #: the chain: the ledger's id, the entries read and the last one's hash
    _id: str = field(default="", repr=False, compare=False)
    _entries: int = field(default=0, repr=False, compare=False)
    _head: str = field(default="", repr=False, compare=False)
    _last_kind: str = field(default="", repr=False, compare=False)
    _mark: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    #: what this handle has parsed: the file's (st_dev, st_ino), the bytes read from it, the
    #: last of them (checked again before reading on) and its mtime then
    _file_id: tuple[int, int] | None = field(default=None, repr=False, compare=False)
    _offset: int = field(default=0, repr=False, compare=False)
    _tail: bytes = field(default=b"", repr=False, compare=False)
    _mtime: int = field(default=0, repr=False, compare=False)
    #: the recorded releases grouped by kind (count 1 -> total count): what the accountant composes
    _counts: Counter[Release] = field(default_factory=Counter, repr=False, compare=False)
    _grouped_cache: list[Release] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def open(cls, path: str | Path, epsilon_budget: float, delta: float, *,
             mark_dir: str | Path | None = None, key_file: str | Path | None = None,
             witness_dir: str | Path | None = None, sync: bool = True) -> PrivacyLedger:
        """Load the ledger at ``path`` or create an empty one, and check it against its
        high-water mark (in ``mark_dir``, default ``ledger-marks`` beside it) and the witness
        kept on this node (``witness_dir``, default beside the mark). An existing ledger written
        for a different budget is an error: a silo's budget cannot be changed after spending. So
        is any mismatch with the mark or the witness (:class:`LedgerError`). ``key_file``: the
        ledger key (default ``ledger.key`` beside the ledger; created when missing)."""
        path = Path(path)
        try:
            key = load_or_create_key(key_path_for(path, key_file))
        except (OSError, ValueError) as exc:
            raise LedgerError(f"privacy ledger {path}: its key cannot be read or created ({exc})") from exc
        mark_path = mark_path_for(path, mark_dir)
        ledger = cls(path, float(epsilon_budget), float(delta), mark_path=mark_path, key=key,
                     witness_path=witness_path_for(mark_path, witness_dir), witness_copy=witness_dir is not None,
                     sync=sync)
        with ledger._locked():
            ledger._reload()
        return ledger

    # -- reading ------------------------------------------------------------------------
    def _reload(self) -> None:
        """Bring this handle up to date with the file and check it against the mark (caller
        holds the lock): parse the lines appended since the last read, or the whole file if it
        was replaced, shrank, or was rewritten in place. On any mismatch the handle forgets
        what it read (the next call reads the whole file again) and raises LedgerError."""
        try:
            self._reload_checked()
        except BaseException:
            self._file_id = None
            raise

    def _reload_checked(self) -> None:
        assert self.mark_path is not None
        mark = read_mark(self.mark_path)
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            fh = None
        except OSError as exc:
            raise LedgerError(f"privacy ledger {self.path} is unreadable: {exc}") from exc
        if fh is None:
            self._file_id = None
            self._settle(inspect(self.path, self.mark_path, data=None, mark=mark, key=self.key,
                                 witnesses=self._local_witnesses()), mark)
            return
        with fh:
            try:
                st = os.fstat(fh.fileno())
                file_id = (st.st_dev, st.st_ino)
                unchanged = (file_id == self._file_id and st.st_size >= self._offset
                             and not (st.st_size == self._offset and st.st_mtime_ns != self._mtime)
                             and mark is not None and mark.get("id") == self._id
                             and int(mark.get("entries", -1)) >= self._entries)
                if unchanged:
                    fh.seek(self._offset - len(self._tail))
                    data = fh.read()
                    unchanged = data.startswith(self._tail)  # the bytes it has read are still there
                if not unchanged:
                    fh.seek(0)
                    full = fh.read()
            except OSError as exc:
                raise LedgerError(f"privacy ledger {self.path} is unreadable: {exc}") from exc
        self._mtime = st.st_mtime_ns  # (a dropped torn line, a conversion: updated there)
        if not unchanged:
            self._file_id = file_id  # (reset if this raises; a conversion sets its new file's)
            self._settle(inspect(self.path, self.mark_path, data=full, mark=mark, key=self.key), mark)
        else:
            self._read_on(data[len(self._tail):], mark)
        self._check_witnesses(self._local_witnesses())

    def _read_on(self, data: bytes, mark: dict[str, Any] | None) -> None:
        """Parse what other processes appended since this handle's last read (``data``),
        continuing the chain, and check it against the mark."""
        assert mark is not None and self.mark_path is not None
        used = data.rfind(b"\n") + 1
        want = int(mark["entries"])
        chain = Chain(self.path, self._head, self._entries, len(self.releases), want, self._ck)
        if want == self._entries:
            chain.head_at_want = self._head
        rows, calibration, adopts, last = chain.parse(data[:used].split(b"\n")[:-1])
        torn = len(data) - used
        problem = judge(self.path, self.mark_path, ledger_id=self._id, entries=chain.entries,
                        head_at_mark=chain.head_at_want, torn=torn > 0, last_kind=last or self._last_kind, mark=mark,
                        eps_here=lambda: epsilon_of(self._grouped_list(rows), self.delta))
        if problem is not None:
            raise LedgerError(problem)
        self._add_rows(rows)
        if calibration is not None:
            self.calibration = calibration
        self.adoptions.extend(adopts)
        self._entries, self._head, self._last_kind = chain.entries, chain.head, last or self._last_kind
        self._heads.extend(chain.heads)
        if torn:
            self._drop_torn(self._offset + used, torn)
        self._offset += used
        self._tail = (self._tail + data[:used])[-TAIL_BYTES:]
        self._mark = mark
        if want < self._entries:
            self._roll_forward(want)

    def _grouped_list(self, extra_rows: list[dict[str, Any]]) -> list[Release]:
        return self._grouped() + [release_of_row(r) for r in extra_rows]

    def _settle(self, insp: Inspection, mark: dict[str, Any] | None) -> None:
        """Take a whole-file inspection into this handle and do what it says (create, convert,
        drop a torn last line, roll the mark forward), or raise its problem."""
        if insp.problem is not None:
            raise LedgerError(insp.problem)
        if insp.action == "create":
            self._create(mark)
            return
        self._check_budget(insp.epsilon_budget, insp.delta)
        if insp.action == "migrate":
            self._migrate(insp, mark)
            return
        self.releases, self.calibration, self._counts, self._grouped_cache = [], dict(insp.calibration), Counter(), None
        self._add_rows(insp.releases)
        self.adoptions = list(insp.adoptions)
        self._id, self._entries, self._head, self._last_kind = insp.id, insp.entries, insp.head, insp.last_kind
        self._heads = list(insp.heads)
        self._ck = self._header_key(insp.data)
        self._mark = mark
        if insp.torn:
            self._drop_torn(insp.used, insp.torn)
        self._offset, self._tail = insp.used, insp.data[:insp.used][-TAIL_BYTES:]
        if mark is None:  # a new ledger whose mark write was interrupted, or an interrupted adoption
            logger.warning("privacy ledger %s: writing its missing high-water mark %s (%s)", self.path, self.mark_path,
                           "no entries yet" if insp.entries == 0 else "the last entry is an adoption")
            self._write_mark(self._eps())
        elif int(mark["entries"]) < insp.entries:
            self._roll_forward(int(mark["entries"]))

    def _roll_forward(self, was: int) -> None:
        logger.warning("privacy ledger %s: its high-water mark was %d entr%s behind the file (a crash or power loss "
                       "between the append and the mark's write); the rows chain from the mark's head and record more "
                       "spending, not less: moving the mark forward", self.path, self._entries - was,
                       "y" if self._entries - was == 1 else "ies")
        self._write_mark(self._eps())

    def _drop_torn(self, keep: int, torn: int) -> None:
        logger.warning("privacy ledger %s: dropping an incomplete last line (%d bytes) left by an interrupted write; "
                       "its high-water mark does not record it", self.path, torn)
        os.truncate(self.path, keep)
        self._mtime = os.stat(self.path).st_mtime_ns

    def _check_budget(self, stored_eps: float, stored_delta: float) -> None:
        same_eps = stored_eps == self.epsilon_budget or math.isclose(stored_eps, self.epsilon_budget)
        if not same_eps or not math.isclose(stored_delta, self.delta):
            raise LedgerError(
                f"privacy ledger {self.path} was written for budget (epsilon={stored_eps}, delta={stored_delta}) "
                f"but this run asks for (epsilon={self.epsilon_budget}, delta={self.delta}); "
                "use a new state dir or ledger scope"
            )

    # -- writing ------------------------------------------------------------------------
    def _create(self, old_mark: dict[str, Any] | None) -> None:
        """A new ledger: its header line, written atomically, then its mark (caller holds the lock)."""
        self._replace_file([], {}, [], old_mark)

    def _migrate(self, insp: Inspection, mark: dict[str, Any] | None) -> None:
        """Convert a version-1 or -2 ledger to version 3, atomically: the same rows and
        calibration, chained, then an ``adopt`` entry saying so; then its mark."""
        rows = insp.releases
        logger.warning("privacy ledger %s: converting version %d (%d releases, no hash chain) to version %d, adopting "
                       "it as it is", self.path, insp.version, len(rows), LEDGER_VERSION)
        eps = epsilon_of([release_of_row(r) for r in rows], self.delta)
        adopt = {"reason": f"a version-{insp.version} ledger (before hash chaining) adopted as it was on first open",
                 "from_version": insp.version, "time": time.time(),
                 "ledger": {"entries": len(rows), "releases": len(rows), "eps_spent": eps}, "mark": None}
        self._replace_file(rows, insp.calibration, [adopt], mark)

    def _replace_file(self, releases: list[dict[str, Any]], calibration: dict[str, Any],
                      adopts: list[dict[str, Any]], old_mark: dict[str, Any] | None) -> None:
        header = {"ledger": LEDGER_VERSION, "epsilon_budget": encode_float(self.epsilon_budget), "delta": self.delta,
                  "id": secrets.token_hex(16)}
        if self.key is not None:  # a keyed chain: rewriting it needs the key
            header["key"] = key_id(self.key)
        self._ck = self.key
        head_line = canonical(header)
        self._id, self._head, self._entries, self._last_kind = header["id"], genesis(head_line, self._ck), 0, ""
        self._heads = []
        entries = ([{"calibration": dict(calibration)}] if calibration else []) + [{"release": r} for r in releases]
        entries += [{"adopt": a} for a in adopts]
        data = head_line + b"\n" + self._chained(entries)
        write_bytes_atomically(self.path, data, sync_dir=True, sync=self.sync)
        st = os.stat(self.path)
        self.releases, self.calibration, self._counts, self._grouped_cache = [], dict(calibration), Counter(), None
        self.adoptions = list(adopts)
        self._add_rows(releases)
        self._file_id, self._offset, self._tail = (st.st_dev, st.st_ino), len(data), data[-TAIL_BYTES:]
        self._mtime = st.st_mtime_ns
        self._mark = old_mark
        self._write_mark(self._eps(), fresh=True)

    def _chained(self, entries: list[dict[str, Any]]) -> bytes:
        """``entries`` as lines chained from this handle's head (which moves on)."""
        out = []
        for e in entries:
            (kind,) = e
            self._head = chain_hash(self._head, canonical(e), self._ck)
            self._heads.append(self._head)
            self._entries += 1
            self._last_kind = kind
            out.append(canonical(e | {"hash": self._head}) + b"\n")
        return b"".join(out)

    def _add_rows(self, rows: list[dict[str, Any]]) -> None:
        self._grouped_cache = None
        for row in rows:
            r = release_of_row(row)
            self._counts[replace(r, count=1)] += r.count
        self.releases.extend(rows)

    def _append(self, entries: list[dict[str, Any]]) -> None:
        """Append ``entries`` as chained lines, durably (caller holds the lock and has just reloaded)."""
        head, count, last = self._head, self._entries, self._last_kind
        data = self._chained(entries)
        try:
            end = append_bytes_durably(self.path, data, sync=self.sync)
            st = os.stat(self.path)
        except OSError as exc:
            self._file_id = None  # read it again in full next time (it may hold a torn line)
            self._head, self._entries, self._last_kind = head, count, last
            del self._heads[count:]
            raise LedgerError(f"privacy ledger {self.path} could not be written: {exc}") from exc
        if end != self._offset + len(data):  # someone wrote without the lock: trust nothing read
            self._file_id = None
        self._offset, self._tail, self._mtime = end, (self._tail + data)[-TAIL_BYTES:], st.st_mtime_ns

    def _write_mark(self, eps: float | None, *, fresh: bool = False) -> None:
        """Record the chain's position in the mark (after the entries are on disk)."""
        assert self.mark_path is not None
        gen = int(self._mark["gen"]) + 1 if self._mark else 1
        mark = {"mark": 1, "gen": gen, "id": self._id, "entries": self._entries, "releases": len(self.releases),
                "head": self._head, "eps_spent": None if eps is None or math.isnan(eps) else encode_float(eps),
                "time": time.time()}
        try:
            write_mark(self.mark_path, mark, fresh=fresh or self._mark is None, sync=self.mark_sync,
                       durable_create=self.sync)
        except (OSError, ValueError) as exc:
            raise LedgerError(f"privacy ledger {self.path}: its high-water mark {self.mark_path} could not be "
                              f"written ({exc}); the entry is recorded, the mark will be moved forward on the next "
                              "read") from exc
        self._mark = mark

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return exclusive_lock(lock_path(self.path))

    # -- the witness (app/privacy/ledger/witness.py) --------------------------------------------
    def _header_key(self, data: bytes) -> bytes | None:
        """The key the chain in ``data`` (a version-3 file read in full) uses."""
        return self.key if b'"key":' in data.split(b"\n", 1)[0] else None

    def _local_witnesses(self) -> list[str]:
        text = read_witness_file(self.witness_path) if self.witness_path is not None else None
        return [text] if text else []

    def _head_at(self, k: int) -> str | None:
        return self._heads[k - 1] if 0 < k <= len(self._heads) else None

    def _check_witnesses(self, texts: list[str]) -> None:
        """LedgerError when a witness of this ledger in ``texts`` is ahead of it (caller holds
        the lock and has just reloaded); a verified one that is ahead is kept on this node."""
        if self.key is None:
            return
        for text in texts:
            problem = witness_problem(text, self.key, ledger=self.path.name, ledger_id=self._id,
                                      entries=self._entries, head_at=self._head_at, adoptions=self.adoptions,
                                      eps_here=self._eps)
            if problem is None:
                continue
            w = verified(self.key, text)
            if w is not None and self.witness_path is not None:
                held = verified(self.key, read_witness_file(self.witness_path))
                if held != w and ahead(w, held):
                    try:
                        write_witness_file(self.witness_path, text)
                    except OSError as exc:
                        logger.warning("privacy ledger %s: could not keep its witness in %s: %s", self.path,
                                       self.witness_path, exc)
            raise LedgerError(problem)

    def _witness(self) -> str:
        assert self.key is not None
        eps = self._mark.get("eps_spent") if self._mark else None
        return make_witness(self.key, ledger=self.path.name, ledger_id=self._id, entries=self._entries,
                            releases=len(self.releases), eps_spent=None if eps is None else float(eps),
                            head=self._head, epoch=len(self.adoptions))

    def _copy_witness(self) -> None:
        assert self.witness_path is not None
        try:
            write_witness_file(self.witness_path, self._witness())
        except OSError as exc:
            raise LedgerError(f"privacy ledger {self.path}: its witness {self.witness_path} (node config "
                              f"ledger-witness-dir) could not be written ({exc}); the entry is recorded") from exc

    def check_witnesses(self, texts: list[str]) -> str:
        """Check the witnesses another party holds (``texts``: the server's, with an instruction)
        against the ledger, and return the ledger's own, current witness. LedgerError when one of
        them is ahead of the ledger (a restored or wiped state dir, a rewritten history)."""
        with self._locked():
            self._reload()
            self._check_witnesses(list(texts))
            return self._witness()

    # -- accounting ---------------------------------------------------------------------
    def recorded(self) -> list[Release]:
        """The recorded releases as accountant events."""
        return [release_of_row(r) for r in self.releases]

    def _grouped(self) -> list[Release]:
        """The recorded releases, identical ones merged into one with their total count: the
        same composition as :meth:`recorded` (epsilon_spent merges them the same way), without
        a pass over the whole history per question."""
        if self._grouped_cache is None:
            self._grouped_cache = [replace(r, count=c) for r, c in self._counts.items() if c > 0]
        return list(self._grouped_cache)

    def _eps(self) -> float | None:
        return epsilon_of(self._grouped(), self.delta)

    def spent_as_read(self) -> float:
        """Epsilon spent as this handle last read or wrote the ledger, without reading it again:
        for a caller that has just reloaded it (witnessed_answer's check, before every answer).
        Never more than the file records: the handle only moves forward with the file."""
        return epsilon_spent(self._grouped(), self.delta)

    def witness_as_read(self) -> str:
        """The ledger's witness as this handle last read or wrote it, without reading it again:
        never ahead of the file (a witness behind the ledger is what any later copy of it is);
        the next :meth:`check_witnesses` reads and checks everything again."""
        return self._witness()

    def spent(self) -> float:
        """Epsilon spent so far at the ledger's delta (0 when nothing was released)."""
        with self._locked():
            self._reload()
        return self.spent_as_read()

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
        when this returns, and the mark records them."""
        with self._locked():
            self._reload()
            after = self._check_loaded(new, round_ if exclusive else None)
            seq = len(self.releases)
            stamp = time.time()
            rows = []
            for i, r in enumerate(new):
                row = row_of_release(r) | {"round": int(round_), "seq": seq + i, "time": stamp}
                if extra:
                    row |= extra
                rows.append(row)
            self._append([{"release": row} for row in rows])
            self._add_rows(rows)
            self._write_mark(after)
            if self.witness_copy:
                self._copy_witness()
        return after, seq

    def set_calibration(self, calibration: dict[str, Any]) -> None:
        """Store the noise plan so a restarted silo keeps the same noise multiplier."""
        with self._locked():
            self._reload()
            self._append([{"calibration": dict(calibration)}])
            self.calibration = dict(calibration)
            self._write_mark(self._mark.get("eps_spent") if self._mark else self._eps())


@functools.lru_cache(maxsize=1024)
def lock_path(path: Path) -> Path:
    """The lock file of the ledger at ``path``: ``<ledger>.lock``."""
    return path.with_suffix(path.suffix + ".lock")
