"""The ledger's file format (version 3, and reading versions 1 and 2): canonical JSON entries
chained by SHA-256 hashes, parsed and checked line by line. The format is described in
app/privacy/ledger/__init__.py's module doc; this module only reads and encodes rows."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

from app.privacy.accounting import Release, epsilon_spent

LEDGER_VERSION = 3
_GENESIS = "silofl-ledger-3"
_KINDS = ("release", "calibration", "adopt")
RECOVERY = "see `python -m app.ledger verify {path}` and docs/privacy.md (\"When the ledger does not verify\")"


class LedgerError(RuntimeError):
    """The ledger file is unreadable, does not match its high-water mark, or belongs to a
    different budget."""


# -- the chain ----------------------------------------------------------------------------------

def canonical(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, no spaces, UTF-8 (a row's bytes as hashed and written)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def chain_hash(prev: str, body: bytes, key: bytes | None = None) -> str:
    """The hash of an entry after ``prev``: SHA-256, or HMAC-SHA256 with the ledger's ``key``
    (a ledger whose header names a key, app/privacy/ledger/witness.py)."""
    if key is None:
        return hashlib.sha256(prev.encode() + b"\n" + body).hexdigest()
    return hmac.new(key, prev.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def genesis(header_line: bytes, key: bytes | None = None) -> str:
    """hash_0 = HMAC-SHA256(key, "silofl-ledger-3\\n" + the header line) (SHA-256 without a key)."""
    return chain_hash(_GENESIS, header_line, key)


def _chain_key(path: Path, header: dict[str, Any], key: bytes | None) -> bytes | None:
    """The key the ledger whose header is ``header`` is chained with: None for one chained before
    keys (no ``key`` in its header), else ``key``, which must be the one the header names."""
    named = header.get("key")
    if named is None:
        return None
    from app.privacy.ledger.witness import key_id

    if key is None or key_id(key) != named:
        have = "no key" if key is None else f"a key with id {key_id(key)}"
        raise LedgerError(f"privacy ledger {path} is chained with the ledger key {named} but this node has {have} "
                          "(node config ledger-key-file, default <state-dir>/ledger.key): the key file was lost, "
                          "replaced or not given; restore it; " + RECOVERY.format(path=path))
    return key


class Chain:
    """Parses entry lines, checking each against its hash, from a head and entry count."""

    def __init__(self, path: Path, head: str, entries: int, releases: int, want: int | None,
                 key: bytes | None = None) -> None:
        self.path, self.head, self.entries, self.releases_before, self.want = path, head, entries, releases, want
        self.key = key
        self.head_at_want: str | None = head if want == entries else None
        #: the hash after each entry parsed, in order
        self.heads: list[str] = []

    def parse(self, lines: list[bytes]) -> tuple[list[dict[str, Any]], dict[str, Any] | None, list[dict[str, Any]],
                                                 str]:
        """(release rows, last calibration or None, adoptions, last entry's kind or "")."""
        rows: list[dict[str, Any]] = []
        calibration: dict[str, Any] | None = None
        adopts: list[dict[str, Any]] = []
        last = ""
        for raw in lines:
            k = self.entries + 1
            try:
                entry = json.loads(raw)
                if not isinstance(entry, dict) or len(entry) != 2 or not isinstance(entry.get("hash"), str):
                    raise ValueError(f"not a ledger entry: {raw[:80]!r}")
                body = {key: v for key, v in entry.items() if key != "hash"}
                (kind,) = body
                if kind not in _KINDS or not isinstance(body[kind], dict):
                    raise ValueError(f"not a ledger entry: {raw[:80]!r}")
                if kind == "release":
                    release_of_row(body[kind])  # a row the accountant can read
                expected = chain_hash(self.head, canonical(body), self.key)
            except (ValueError, KeyError, TypeError) as exc:
                raise LedgerError(f"privacy ledger {self.path} is unreadable: entry {k} (line {k + 1}): {exc}; "
                                  + RECOVERY.format(path=self.path)) from exc
            if entry["hash"] != expected:
                what = (f"release seq {body[kind].get('seq')}, round {body[kind].get('round')}" if kind == "release"
                        else kind)
                raise LedgerError(f"privacy ledger {self.path}: entry {k} (line {k + 1}, {what}) does not match its "
                                  "hash: it was edited, or an entry before it was removed, changed or inserted; "
                                  + RECOVERY.format(path=self.path))
            self.head, self.entries, last = expected, k, kind
            self.heads.append(expected)
            if self.want == k:
                self.head_at_want = expected
            if kind == "release":
                rows.append(body[kind])
            elif kind == "calibration":
                calibration = body[kind]
            else:
                adopts.append(body[kind])
        return rows, calibration, adopts, last


def parse_v3(path: Path, data: bytes, want: int | None, key: bytes | None = None, *,
              heads: list[str] | None = None) -> tuple:
    """A version-3 file's (version, id, budget, delta, rows, calibration, adoptions, entries, head,
    last kind, bytes used, torn bytes, head after ``want`` entries or None), its chain checked
    (with ``key`` when its header names one). ``heads``: filled with the hash after each entry."""
    used = data.rfind(b"\n") + 1
    lines = data[:used].split(b"\n")[:-1]
    if not lines:
        raise LedgerError(f"privacy ledger {path} is unreadable: no complete header line; {RECOVERY.format(path=path)}")
    try:
        header = json.loads(lines[0])
        if header.get("ledger") != LEDGER_VERSION or not isinstance(header.get("id"), str):
            raise ValueError(f"no version-{LEDGER_VERSION} ledger header: {lines[0][:80]!r}")
        eps, delta = decode_float(header["epsilon_budget"]), float(header["delta"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerError(f"privacy ledger {path} is unreadable: line 1: {exc}") from exc
    chain_key = _chain_key(path, header, key)
    chain = Chain(path, genesis(canonical(header), chain_key), 0, 0, want, chain_key)
    rows, calibration, adopts, last = chain.parse(lines[1:])
    if heads is not None:
        heads[:] = chain.heads
    return (LEDGER_VERSION, header["id"], eps, delta, rows, calibration or {}, adopts, chain.entries, chain.head, last,
            used, len(data) - used, chain.head_at_want)


def parse_legacy(path: Path, data: bytes) -> (tuple[int, float, float, dict[str, Any], list[dict[str, Any]], int, int]
                                              | None):
    """A version-1 or -2 ledger's (version, budget, delta, calibration, rows, bytes used, torn
    bytes); None for a version-3 file. Raises LedgerError when it cannot be read."""
    first = data.split(b"\n", 1)[0]
    try:
        head = json.loads(first)
    except ValueError:
        head = None
    if isinstance(head, dict) and head.get("ledger") == LEDGER_VERSION:
        return None
    if not (isinstance(head, dict) and "ledger" in head):  # version 1: one JSON object
        try:
            doc = json.loads(data)
            rows = [dict(r) for r in doc["releases"]]
            for r in rows:
                release_of_row(r)
            return (1, decode_float(doc["epsilon_budget"]), float(doc["delta"]), dict(doc.get("calibration", {})),
                    rows, len(data), 0)
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"privacy ledger {path} is unreadable: {exc}") from exc
    if head.get("ledger") != 2:
        raise LedgerError(f"privacy ledger {path} is unreadable: unknown ledger version {head.get('ledger')!r}")
    used = data.rfind(b"\n") + 1
    rows, calibration = [], {}
    for i, raw in enumerate(data[:used].split(b"\n")[1:-1]):
        try:
            entry = json.loads(raw)
            if not isinstance(entry, dict) or len(entry) != 1:
                raise ValueError(f"not a ledger entry: {raw[:80]!r}")
            if "release" in entry:
                release_of_row(entry["release"])
                rows.append(entry["release"])
            elif "calibration" in entry and isinstance(entry["calibration"], dict):
                calibration = entry["calibration"]
            else:
                raise ValueError(f"not a ledger entry: {raw[:80]!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"privacy ledger {path} is unreadable: line {i + 2}: {exc}") from exc
    try:
        budget, delta = decode_float(head["epsilon_budget"]), float(head["delta"])
    except (ValueError, KeyError, TypeError) as exc:
        raise LedgerError(f"privacy ledger {path} is unreadable: line 1: {exc}") from exc
    return 2, budget, delta, calibration, rows, used, len(data) - used


def read_ledger(path: str | Path, key_file: str | Path | None = None) -> dict[str, Any]:
    """A ledger file's contents (any version), read without the lock and without changing the
    file or looking at its mark: ``version``, ``epsilon_budget``, ``delta``, ``calibration`` and
    ``releases`` (a version-3 file also ``id`` and ``adoptions``; its chain is checked, with the
    ledger key in ``key_file``, default ``ledger.key`` beside it, when its header names one). An
    incomplete last line (an append in progress, or a crash's) is left out."""
    from app.privacy.ledger.witness import key_path_for, read_key

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LedgerError(f"privacy ledger {path} is unreadable: {exc}") from exc
    legacy = parse_legacy(path, data)
    if legacy is not None:
        version, eps, delta, calibration, rows, _, _ = legacy
        return {"version": version, "epsilon_budget": eps, "delta": delta, "calibration": calibration, "releases": rows}
    try:
        key = read_key(key_path_for(path, key_file))
    except ValueError as exc:
        raise LedgerError(str(exc)) from exc
    version, ledger_id, eps, delta, rows, calibration, adopts, *_ = parse_v3(path, data, None, key)
    return {"version": version, "epsilon_budget": eps, "delta": delta, "calibration": calibration, "releases": rows,
            "id": ledger_id, "adoptions": adopts}


def release_of_row(r: dict[str, Any]) -> Release:
    """The accountant's Release of a ledger row (the fields a row may lack take their defaults)."""
    return Release(r["kind"], int(r["n"]), int(r["batch"]), float(r["noise_multiplier"]), int(r.get("count", 1)),
                   bool(r.get("disjoint", False)), str(r.get("mechanism", "gaussian")), int(r.get("trials", 0)),
                   int(r.get("levels", 0)), float(r.get("p", 0.0)), int(r.get("dim", 0)),
                   str(r.get("amplification", "none")), float(r.get("silo_sampling", 1.0)),
                   float(r.get("l1", 0.0)), float(r.get("l2", 0.0)))


_RELEASE_FIELDS = tuple(f.name for f in fields(Release))
_BINOMIAL_FIELDS = ("mechanism", "trials", "levels", "p", "dim")
#: a skellam release's own fields (it also keeps mechanism and dim)
_SKELLAM_FIELDS = ("l1", "l2")
_KEPT_FOR_SKELLAM = ("mechanism", "dim")


def row_of_release(r: Release) -> dict[str, Any]:
    """A release as a ledger row (its fields in order, as ``asdict`` gives them: they are plain
    values); a Gaussian one without the binomial and skellam fields (unused there; a skellam one
    keeps mechanism, dim, l1 and l2), and ``amplification``
    only where one is claimed (rows without it read as "none"), ``silo_sampling`` likewise (1)."""
    return {name: getattr(r, name) for name in _RELEASE_FIELDS
            if (r.binomial or name not in _BINOMIAL_FIELDS or (r.skellam and name in _KEPT_FOR_SKELLAM))
            and (r.skellam or name not in _SKELLAM_FIELDS)
            and not (name == "amplification" and r.amplification == "none")
            and not (name == "silo_sampling" and r.silo_sampling == 1)}


def encode_float(x: float) -> float | str:
    """A float as JSON holds it: inf as the string "inf"."""
    return "inf" if math.isinf(x) else x


def decode_float(x: float | str) -> float:
    """The inverse of :func:`encode_float`."""
    return math.inf if x == "inf" else float(x)


def format_epsilon(eps: Any) -> str:
    """epsilon in a message: 4 significant digits, "?" when unknown (None)."""
    return "?" if eps is None else f"{float(eps):.4g}"


def epsilon_of(releases: list[Release], delta: float) -> float | None:
    """epsilon_spent of ``releases`` at ``delta``; None when the accountant cannot read them."""
    try:
        return epsilon_spent(releases, delta)
    except ValueError:
        return None
