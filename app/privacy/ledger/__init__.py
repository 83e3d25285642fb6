"""The silo's privacy ledger: a file on the silo's own disk recording every release, chained by
hashes, and a high-water mark kept in a second place, so that losing part of it is noticed.

The ledger is the silo's source of truth for what it has spent. Several processes may serve
the same silo (a simulation engine runs silos in a pool of workers; a restarted SuperNode), so
every read-check-write happens under an exclusive file lock on ``<ledger>.lock`` and starts by
re-reading the file: an in-memory copy is never trusted. A release is checked and written to
disk in one step, :meth:`PrivacyLedger.record_release`, *before* the silo computes it; one that
would take epsilon above the budget is refused with :class:`BudgetExceededError`. A crash can
only over-count, never under-count. A silo that restarts reloads the file and continues from
what it has already spent.

File format (version 3): JSON lines, append-only, each line canonical JSON (sorted keys, no
spaces). The first line is the header, written atomically (and the directory fsynced) when the
ledger is created; ``id`` is random, so a ledger created again is a different ledger::

    {"delta":1e-05,"epsilon_budget":3.0,"id":"9f0c...","ledger":3}
    {"calibration":{"key":...,"noise_multiplier":4.16,"block_seed":...},"hash":"..."}
    {"hash":"...","release":{"kind":"grad","n":229,"batch":64,"noise_multiplier":4.16,"count":1,
                             "disjoint":false,"round":1,"seq":0,"time":1764600000.0}}
    {"adopt":{"reason":...,"time":...,"ledger":{...},"mark":{...}},"hash":"..."}

Every line after the header is an *entry* (a release, a calibration, an adoption) chained to the
one before it: ``hash_k = HMAC-SHA256(key, hash_{k-1} + "\\n" + canonical JSON of the entry without
its hash)``, ``hash_0 = HMAC-SHA256(key, "silofl-ledger-3\\n" + the header line)``, with the node's
ledger key (node config ``ledger-key-file``, default ``<state-dir>/ledger.key``; the header's
``key`` names it). A ledger written before keys (no ``key`` in its header) is chained, read and
appended to with plain SHA-256, as it was. The ledger's *witness* (its position, MAC'd with the
key), which the silo deposits with the server and checks against the server's copy before every
release, is app/privacy/ledger/witness.py. A release costs one append
of its line and one fsync, under the lock, then one in-place write of the high-water mark (a
simulation's virtual silo skips the fsync: PrivacyLedger.sync, docs/privacy.md).

The high-water mark (``<mark-dir>/<ledger file name>.mark``; node config ``ledger-mark-dir``,
default ``<state-dir>/ledger-marks``) records the ledger's ``id``, its number of ``entries``, the
``head`` (the last entry's hash), ``releases`` and ``eps_spent``. It is two fixed 512-byte slots
(4 KiB apart), each canonical JSON with its own SHA-256 ``check``, written alternately in place (a torn slot is
ignored; the other, older one is read). Order: the row is appended and fsynced, then the mark is
written. The mark is not fsynced per release (it costs as much as the append again): a process
crash loses nothing from the page cache, and a power loss can only leave the mark *behind* the
file; rows beyond the mark that chain from its head record more spending, never less, and the
mark is rolled forward to them. Every full read checks the file against the mark; a mismatch
is a :class:`LedgerError` and the silo refuses everything, with the reason:

* the ledger is missing while the mark records entries; the mark is missing while the ledger has
  entries (unless the last entry is an adoption whose mark write was interrupted);
* the ledger is another one than the mark's (``id``), e.g. recreated or replaced by a copy;
* the mark records more entries than the file holds (truncated, rows deleted, cut in a line);
* a line does not match its hash (edited, or a row before it removed), or the entry at the mark's
  position has another hash than the mark's ``head`` (the history was rewritten and re-hashed).

Only a truncated *last* line may be dropped (the trace of a crash in the middle of an append: that
release never returned, so nothing was computed or sent from it), and only when the mark does not
record it as complete; it is cut off under the lock, with a warning. A version-1 or version-2
ledger (before hash chaining) is adopted once when no mark exists: rewritten as version 3,
atomically, its rows unchanged, with an ``adopt`` entry saying so; a legacy file next to a mark is
refused (an old copy put in place of a chained ledger). The operator's tools are in app/ledger.py
(``python -m app.ledger verify|show|adopt``; docs/privacy.md, "When the ledger does not verify").
:func:`read_ledger` reads any version without the lock (and checks a version-3 file's chain).

Modules: :mod:`.handle` (:class:`PrivacyLedger`, the silo's locked handle on its ledger),
:mod:`.chain` (the file format: rows, hashes, parsing), :mod:`.mark` (the high-water mark),
:mod:`.witness` (the ledger key and witness), :mod:`.inspection` (a whole-file check of a ledger
against its mark), :mod:`.adoption` (the operator's adopt). This module is the public API:
``from app.privacy.ledger import PrivacyLedger, BudgetExceededError, LedgerError, ...``; the
modules' other names are imported from where they live.
"""

from __future__ import annotations

from app.privacy.ledger.adoption import adopt
from app.privacy.ledger.chain import LEDGER_VERSION, RECOVERY, LedgerError, read_ledger
from app.privacy.ledger.handle import BUDGET_RTOL, BudgetExceededError, PrivacyLedger
from app.privacy.ledger.inspection import Inspection, inspect
from app.privacy.ledger.mark import MARK_DIR, MARK_SLOT, MARK_STRIDE, mark_path_for, read_mark, write_mark

__all__ = [
    "BUDGET_RTOL", "LEDGER_VERSION", "MARK_DIR", "MARK_SLOT", "MARK_STRIDE", "RECOVERY", "BudgetExceededError",
    "Inspection", "LedgerError", "PrivacyLedger", "adopt", "inspect", "mark_path_for", "read_ledger", "read_mark",
    "write_mark",
]
