"""A whole-file inspection of a ledger and its high-water mark (the handle's full read and the
operator's ``verify``): what opening it would do, or why the silo must refuse. Changes nothing."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.privacy.ledger.chain import (RECOVERY, LedgerError, epsilon_of, format_epsilon, parse_legacy, parse_v3,
                                      release_of_row)
from app.privacy.ledger.mark import read_mark
from app.privacy.ledger.witness import key_path_for, read_key, witness_problem


def judge(path: Path, mark_path: Path, *, ledger_id: str, entries: int, head_at_mark: str | None, torn: bool,
          last_kind: str, mark: dict[str, Any] | None, eps_here: Any = None) -> str | None:
    """Why a version-3 ledger of ``entries`` complete entries (chain verified) does not match its
    ``mark`` (None: it does, possibly with the mark behind, to be rolled forward). ``head_at_mark``:
    the chain's hash after ``mark["entries"]`` entries (None if the file has fewer); ``torn``: the
    file ends in an incomplete line; ``eps_here``: epsilon of the file's releases (for messages)."""
    hint = RECOVERY.format(path=path)
    if mark is None:
        if entries == 0 or last_kind == "adopt":
            return None
        return (f"privacy ledger {path} has {entries} entries but no high-water mark at {mark_path}: the mark was "
                f"lost, or node config ledger-mark-dir changed; {hint}")
    recorded = f"{mark.get('releases')} releases, epsilon {format_epsilon(mark.get('eps_spent'))}"
    if mark.get("id") != ledger_id:
        return (f"privacy ledger {path} is not the ledger its high-water mark {mark_path} records (id {ledger_id[:12]} "
                f"vs {str(mark.get('id'))[:12]}, which had {recorded}): it was recreated or replaced by another copy; "
                f"{hint}")
    m = int(mark["entries"])
    if m > entries:
        here = f"{entries} entries (epsilon {format_epsilon(eps_here() if eps_here else None)})"
        if torn and m == entries + 1:
            return (f"privacy ledger {path}: its last line is torn, but the high-water mark records that entry as "
                    f"complete ({m} entries, {recorded}); the file holds {here}: it lost data; {hint}")
        return (f"privacy ledger {path} holds {here} but its high-water mark records {m} entries ({recorded}): "
                f"entries were lost (truncated, cut or deleted); {hint}")
    if head_at_mark != mark.get("head"):
        return (f"privacy ledger {path}: entry {m} differs from the one its high-water mark records ({recorded}): the "
                f"history was rewritten; {hint}")
    return None


@dataclass
class Inspection:
    """What a ledger file and its mark say, without changing either. ``problem``: why the silo
    must refuse (None: usable); ``action``: what opening it does (``ok``, ``create``, ``migrate``,
    ``roll-forward``, ``mark`` (write a missing mark), ``drop-torn``, or ``refuse``)."""

    path: Path
    mark_path: Path
    exists: bool = False
    version: int = 0
    id: str = ""
    epsilon_budget: float = math.nan
    delta: float = math.nan
    releases: list[dict[str, Any]] = field(default_factory=list)
    calibration: dict[str, Any] = field(default_factory=dict)
    adoptions: list[dict[str, Any]] = field(default_factory=list)
    entries: int = 0
    head: str = ""
    last_kind: str = ""
    used: int = 0
    torn: int = 0
    data: bytes = b""
    #: the hash after each entry (a version-3 file)
    heads: list[str] = field(default_factory=list)
    mark: dict[str, Any] | None = None
    problem: str | None = None
    action: str = "ok"

    def eps(self) -> float | None:
        """Epsilon of the file's releases at its delta (None when it cannot be computed)."""
        if not self.releases:
            return 0.0
        return epsilon_of([release_of_row(r) for r in self.releases], self.delta) if 0 < self.delta < 1 else None


_UNSET: Any = object()


def inspect(path: str | Path, mark_path: str | Path, *, data: bytes | None = _UNSET,
            mark: Any = _UNSET, key: Any = _UNSET, witnesses: Any = ()) -> Inspection:
    """Read the ledger at ``path`` (or take its bytes ``data``; None: it does not exist) and its
    mark, check the chain (with the ledger ``key`` where its header names one; default: the one
    in ``ledger.key`` beside the ledger, if any), the mark and the ``witnesses`` (texts,
    app/privacy/ledger/witness.py; checked only with a key), and say what opening it would do.
    Changes nothing."""
    path, mark_path = Path(path), Path(mark_path)
    insp = Inspection(path, mark_path)
    try:
        if key is _UNSET:
            try:
                key = read_key(key_path_for(path))
            except ValueError as exc:
                raise LedgerError(str(exc)) from exc
        if mark is _UNSET:
            mark = read_mark(mark_path)
        insp.mark = mark
        if data is _UNSET:
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                data = None
            except OSError as exc:
                raise LedgerError(f"privacy ledger {path} is unreadable: {exc}") from exc
        if data is None:
            for text in witnesses if key is not None else ():
                problem = witness_problem(text, key, ledger=path.name, ledger_id="", entries=0,
                                          head_at=lambda k: None, adoptions=[], eps_here=0.0)
                if problem is not None:
                    raise LedgerError(problem)
            if mark is not None and int(mark["entries"]) > 0:
                raise LedgerError(
                    f"privacy ledger {path} is missing but its high-water mark {mark_path} records {mark['entries']} "
                    f"entries ({mark.get('releases')} releases, epsilon {format_epsilon(mark.get('eps_spent'))}): "
                    f"restore the ledger from a backup; {RECOVERY.format(path=path)}")
            insp.action = "create"
            return insp
        insp.exists, insp.data = True, data
        legacy = parse_legacy(path, data)
        if legacy is not None:
            (insp.version, insp.epsilon_budget, insp.delta, insp.calibration, insp.releases, insp.used,
             insp.torn) = legacy
            if mark is not None:
                raise LedgerError(
                    f"privacy ledger {path} is in the old version-{insp.version} format but its high-water mark "
                    f"{mark_path} records a chained ledger ({mark.get('releases')} releases, epsilon "
                    f"{format_epsilon(mark.get('eps_spent'))}): an old copy was put in its place; "
                    f"{RECOVERY.format(path=path)}")
            seqs = [r.get("seq") for r in insp.releases]
            if seqs != list(range(len(seqs))):
                raise LedgerError(f"privacy ledger {path} (version {insp.version}, before hash chaining) has gaps in "
                                  f"its sequence numbers: rows were removed; {RECOVERY.format(path=path)}")
            insp.action = "migrate"
            return insp
        want = None if mark is None else int(mark["entries"])
        parsed = parse_v3(path, data, want, key, heads=insp.heads)
        (insp.version, insp.id, insp.epsilon_budget, insp.delta, insp.releases, insp.calibration, insp.adoptions,
         insp.entries, insp.head, insp.last_kind, insp.used, insp.torn, head_at_mark) = parsed
        problem = judge(path, mark_path, ledger_id=insp.id, entries=insp.entries, head_at_mark=head_at_mark,
                        torn=insp.torn > 0, last_kind=insp.last_kind, mark=mark, eps_here=insp.eps)
        if problem is not None:
            raise LedgerError(problem)
        for text in witnesses if key is not None else ():
            problem = witness_problem(text, key, ledger=path.name, ledger_id=insp.id, entries=insp.entries,
                                      head_at=lambda k: insp.heads[k - 1] if 0 < k <= len(insp.heads) else None,
                                      adoptions=insp.adoptions, eps_here=insp.eps)
            if problem is not None:
                raise LedgerError(problem)
        insp.action = ("mark" if mark is None else "roll-forward" if int(mark["entries"]) < insp.entries
                       else "drop-torn" if insp.torn else "ok")
    except LedgerError as exc:
        insp.problem, insp.action = str(exc), "refuse"
    return insp
