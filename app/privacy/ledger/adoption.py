"""The operator's adoption of a ledger that no longer matches its high-water mark
(``python -m app.ledger adopt``): the decision is written into the chain."""

from __future__ import annotations

import os
import time
from pathlib import Path

from app.filelock import exclusive_lock
from app.privacy.ledger.chain import (LedgerError, epsilon_of, format_epsilon, parse_legacy, parse_v3,
                                      release_of_row)
from app.privacy.ledger.handle import TAIL_BYTES, PrivacyLedger, lock_path
from app.privacy.ledger.inspection import inspect
from app.privacy.ledger.mark import mark_path_for, read_mark
from app.privacy.ledger.witness import (key_path_for, load_or_create_key, read_witness_file, summary, verified,
                                        witness_path_for)


def adopt(path: str | Path, mark_dir: str | Path | None = None, *, reason: str, accept_loss: bool = False,
          key_file: str | Path | None = None, witness_dir: str | Path | None = None) -> str:
    """Make the ledger at ``path`` the silo's record again after a mismatch with its mark (a
    restored backup, a lost or moved mark), recording the operator's decision in the chain: an
    ``adopt`` entry with ``reason``, what the ledger held, what the mark recorded and why they
    disagreed; then a fresh mark. The ledger's own chain must hold (an edited ledger cannot be
    adopted: restore a copy that verifies). Whenever the mark cannot vouch for the ledger
    (missing, unreadable, disagreeing) or a witness kept on this node is ahead of it (the state
    dir was restored), the ledger may record less than was spent: that takes ``accept_loss``
    (the silo's spent epsilon is then what the adopted ledger says, and the entry keeps what the
    mark and the witness said; that witness no longer stops the silo). ``key_file`` and
    ``witness_dir``: the node config's ledger-key-file and ledger-witness-dir. Returns a
    one-line summary; raises LedgerError when it adopts nothing."""
    path = Path(path)
    mark_path = mark_path_for(path, mark_dir)
    try:
        key = load_or_create_key(key_path_for(path, key_file))
    except (OSError, ValueError) as exc:
        raise LedgerError(f"privacy ledger {path}: its key cannot be read ({exc})") from exc
    witness_text = read_witness_file(witness_path_for(mark_path, witness_dir))
    if not reason.strip():
        raise LedgerError("adopt needs --reason: say why this ledger is the silo's record (it is written into the "
                          "ledger)")
    with exclusive_lock(lock_path(path)):
        insp = inspect(path, mark_path, key=key, witnesses=[witness_text] if witness_text else [])
        if insp.problem is None:
            return f"{path}: verifies ({insp.action}); nothing to adopt"
        if not insp.exists:
            raise LedgerError(f"{insp.problem} (adopt takes a ledger file that exists: restore it first)")
        try:
            mark = read_mark(mark_path)
        except LedgerError:  # an unreadable mark: one that disagrees, whose numbers are unknown
            mark = None
        legacy = parse_legacy(path, insp.data)
        heads: list[str] = []
        if legacy is None:
            (_, ledger_id, eps_budget, delta, rows, calibration, adopts, entries, head, last, used, torn,
             _) = parse_v3(path, insp.data, None, key, heads=heads)  # raises when the ledger's own chain is broken
        else:
            _, eps_budget, delta, calibration, rows, used, torn = legacy
        if not accept_loss:  # nothing vouches for this ledger being the whole record
            raise LedgerError(f"{insp.problem.split('; see ')[0]}; adopting it may forget spending: rerun with "
                              "--accept-loss if you accept that (restore the most complete backup first)")
        led = PrivacyLedger(path, eps_budget, delta, mark_path=mark_path, key=key)
        witness = verified(key, witness_text) if witness_text else None
        info = {"reason": reason.strip(), "time": time.time(), "by": "python -m app.ledger adopt",
                "accept_loss": bool(accept_loss), "problem": insp.problem,
                "ledger": {"entries": insp.entries if legacy is None else len(rows), "releases": len(rows),
                           "eps_spent": epsilon_of([release_of_row(r) for r in rows], delta)},
                "mark": None if mark is None else {k: mark.get(k) for k in ("id", "entries", "releases", "eps_spent",
                                                                            "head")}}
        if witness is not None:
            info["witness"] = summary(witness)
        if legacy is not None:
            info["from_version"] = legacy[0]
            led._replace_file(rows, calibration, [info], mark)
        else:
            if torn:
                os.truncate(path, used)
            led._add_rows(rows)
            led.calibration, led.adoptions = dict(calibration), list(adopts)
            led._id, led._entries, led._head, led._last_kind = ledger_id, entries, head, last
            led._ck, led._heads = led._header_key(insp.data), heads
            led._offset, led._tail = used, insp.data[:used][-TAIL_BYTES:]
            led._append([{"adopt": info}])
            led.adoptions.append(info)
            led._mark = mark
            led._write_mark(led._eps(), fresh=True)
        return (f"{path}: adopted ({len(rows)} releases, epsilon {format_epsilon(led._eps())}); the mark {mark_path} "
                "records it now" + ("" if mark is None else f" (it had recorded {mark.get('releases')} releases, epsilon "
                                                 f"{format_epsilon(mark.get('eps_spent'))})"))
