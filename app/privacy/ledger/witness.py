"""The ledger's key and its witness: what keeps a restored backup of a silo's state dir from
resetting its lifetime budget (issue 34, section 3).

**The key.** Each silo's ledger is chained with a secret key (HMAC-SHA256 instead of SHA-256),
kept apart from the ledger: node config ``ledger-key-file`` (default ``<state-dir>/ledger.key``,
32 random bytes, mode 0600, created on first use). Rewriting rows and re-chaining them then needs
the key, not just write access to the ledger. The ledger's header names the key it was chained
with (``key``: :func:`key_id`, a hash of the key that reveals nothing about it); a ledger chained
before keys existed (no ``key`` in its header) stays readable and goes on unkeyed.

**The witness.** After every release the silo sends the server, with its reply, a *witness*: the
ledger's file name, ``id``, number of ``entries``, ``releases``, ``eps_spent`` and ``head`` (the
last entry's hash), MAC'd with the key. The server keeps the latest witness per node and ledger
(:class:`WitnessStore`, a small JSON file in its outputs-dir that outlives runs) and sends the
ones it holds for a node back with every instruction. Before it records anything, the silo
checks each one that names its ledger (:func:`witness_problem`) and refuses, in one line naming
the recovery, when a witness is *ahead* of its ledger: another ledger than the one the silo holds
(the state dir was wiped, or recreated), more entries than the ledger holds, or another entry
where the ledger has the witness's position (the history was rewritten). A witness whose MAC does
not verify with the silo's key is refused too (the key was lost along with the state dir, or the
key file was replaced). The server cannot lower what the silo counts: it can only withhold the
witness (then the silo is where it was without one), or send one that makes the silo refuse
(which it could get by sending nothing). A Byzantine silo can only write its own node's slot
(Flower authenticates the node a reply comes from).

A witness that is ahead is saved, verified, next to the ledger's mark (``<mark>.witness``), so
that the operator's ``python -m app.ledger verify`` reports it and ``adopt --accept-loss`` can
record it. A witness carries its ledger's ``epoch`` (the number of adoptions in its chain): one
made before the ledger's last adoption no longer makes the silo refuse (the operator's recorded
decision), while a backup from before an adoption is behind every witness made after it.

With node config ``ledger-witness-dir`` (a second place, on another volume or host) the silo also
writes its witness there after every release and reads it back like the server's.

Pure functions, except :func:`load_or_create_key` and the two small files (the store, the local copy).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import os
import secrets
from pathlib import Path
from typing import Any

from app.filelock import write_bytes_atomically

#: where a node keeps its ledger key by default, relative to the ledger's directory (its state-dir)
KEY_FILE = "ledger.key"
KEY_BYTES = 32
#: the server's store of witnesses, in its outputs-dir
WITNESS_FILE = "ledger-witnesses.json"
#: the most witnesses the server keeps per node (the most recently updated ones), and the longest one
MAX_PER_NODE = 16
#: the most nodes the server keeps witnesses for (the most recently updated ones)
MAX_NODES = 256
MAX_WITNESS_BYTES = 1024
_FIELDS = {"ledger": str, "id": str, "entries": int, "releases": int, "head": str}
_MAC_DOMAIN = b"silofl-ledger-witness-1\n"
RECOVERY = "see `python -m app.ledger verify` and docs/privacy.md (\"When the ledger does not verify\")"

logger = logging.getLogger(__name__)


# -- the key --------------------------------------------------------------------------------------

def key_path_for(ledger_path: str | Path, key_file: str | Path | None = None) -> Path:
    """The key file of the ledger at ``ledger_path``: ``key_file`` (node config
    ``ledger-key-file``), else ``ledger.key`` beside the ledger."""
    return Path(key_file) if key_file else Path(ledger_path).parent / KEY_FILE


def read_key(path: str | Path) -> bytes | None:
    """The key in ``path`` (None when there is no file); ValueError when it is not a key."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    try:
        key = bytes.fromhex(data.decode().strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise ValueError(f"the ledger key file {path} does not hold a {KEY_BYTES}-byte key (hex)")
    return key


def load_or_create_key(path: str | Path) -> bytes:
    """The key in ``path``, created (32 random bytes, hex, mode 0600, atomically) when missing."""
    path = Path(path)
    key = read_key(path)
    if key is not None:
        return key
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(KEY_BYTES)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, key.hex().encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never replaces a key another process created meanwhile
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return read_key(path) or key


def key_id(key: bytes) -> str:
    """A name for ``key`` that reveals nothing about it (in the ledger's header)."""
    return hmac.new(key, b"silofl-ledger-key-id", hashlib.sha256).hexdigest()[:16]


# -- the witness ------------------------------------------------------------------------------------

def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _mac(key: bytes, body: dict[str, Any]) -> str:
    return hmac.new(key, _MAC_DOMAIN + _canonical(body), hashlib.sha256).hexdigest()


def make_witness(key: bytes, *, ledger: str, ledger_id: str, entries: int, releases: int, eps_spent: float | None,
                 head: str, epoch: int = 0) -> str:
    """The witness of a ledger's position, MAC'd with ``key``, as canonical JSON text. ``epoch``:
    the number of adoptions in the ledger's chain."""
    eps = None if eps_spent is None or math.isnan(eps_spent) else ("inf" if math.isinf(eps_spent) else eps_spent)
    body = {"w": 1, "ledger": ledger, "id": ledger_id, "entries": int(entries), "releases": int(releases),
            "eps_spent": eps, "head": head, "epoch": int(epoch)}
    return _canonical(body | {"mac": _mac(key, body)}).decode()


def parse_witness(text: Any) -> dict[str, Any] | None:
    """A witness's fields when ``text`` is one in form (the server's check: it cannot verify the
    MAC), else None."""
    if not isinstance(text, str) or len(text) > MAX_WITNESS_BYTES:
        return None
    try:
        w = json.loads(text)
    except ValueError:
        return None
    if not isinstance(w, dict) or w.get("w") != 1 or not isinstance(w.get("mac"), str):
        return None
    for name, kind in _FIELDS.items():
        if not isinstance(w.get(name), kind) or isinstance(w.get(name), bool):
            return None
    if w["entries"] < 0 or w["releases"] < 0 or not isinstance(w.get("epoch", 0), int):
        return None
    return w


def verified(key: bytes, text: Any) -> dict[str, Any] | None:
    """The witness in ``text`` when it is in form and its MAC verifies with ``key``, else None."""
    w = parse_witness(text)
    if w is None:
        return None
    body = {k: v for k, v in w.items() if k != "mac"}
    return w if hmac.compare_digest(w["mac"], _mac(key, body)) else None


def summary(w: dict[str, Any]) -> dict[str, Any]:
    """What an adoption records of a witness."""
    return {k: w.get(k) for k in ("id", "entries", "releases", "eps_spent", "head", "epoch")}


def witness_problem(text: Any, key: bytes, *, ledger: str, ledger_id: str, entries: int, head_at: Any,
                    adoptions: list[dict[str, Any]], eps_here: Any = None) -> str | None:
    """Why the ledger named ``ledger`` (``ledger_id``, ``entries`` entries; ``head_at(k)``: the
    hash after its k-th entry, None past its end) is behind the witness ``text``; None when it is
    not (or the witness names another ledger, or is not a witness at all). ``eps_here``: the
    ledger's epsilon, or a function giving it (for the message only)."""
    w = parse_witness(text)
    if w is None or w["ledger"] != ledger:
        return None
    where = f"privacy ledger {ledger}"
    if verified(key, text) is None:
        return (f"{where}: the server holds a witness of this ledger that this silo's ledger key does not verify: the "
                "key file was replaced or lost (with the state dir?); restore the key file (node config "
                f"ledger-key-file) and the state dir from the most recent backup; {RECOVERY}")
    if int(w.get("epoch", 0)) < len(adoptions):  # made before the operator's last adoption: it decided
        return None
    recorded = f"{w['releases']} releases, epsilon {_fmt(w.get('eps_spent'))}"
    here = f"{entries} entries (epsilon {_fmt(eps_here() if callable(eps_here) else eps_here)})"
    if not ledger_id:  # no ledger file at all
        return None if w["entries"] == 0 else (
            f"{where} is missing but its witness records {w['entries']} entries ({recorded}): the state dir was "
            f"wiped or lost; {RECOVERY}")
    if w["id"] != ledger_id:
        return (f"{where}: its witness records another ledger (id {str(w['id'])[:12]}, {recorded}) than this one (id "
                f"{ledger_id[:12]}, {here}): the state dir was wiped, recreated or restored from an older backup; "
                f"{RECOVERY}")
    if w["entries"] > entries:
        return (f"{where} holds {here} but its witness records {w['entries']} entries ({recorded}): the state dir was "
                f"restored from an older backup, or entries were lost; {RECOVERY}")
    if w["entries"] > 0 and head_at(w["entries"]) != w["head"]:
        return (f"{where}: entry {w['entries']} differs from the one its witness records ({recorded}): the history "
                f"was rewritten; {RECOVERY}")
    return None


def ahead(a: dict[str, Any], b: dict[str, Any] | None) -> bool:
    """Whether witness ``a`` records more than ``b`` (None: nothing)."""
    return b is None or (a["entries"], a["releases"]) > (b["entries"], b["releases"]) or a["id"] != b["id"]


def _fmt(eps: Any) -> str:
    return "?" if eps is None else f"{float(eps):.4g}"


# -- the local copies -----------------------------------------------------------------------------

def witness_path_for(mark_path: Path, witness_dir: str | Path | None = None) -> Path:
    """Where the silo keeps a witness of the ledger whose mark is ``mark_path``: in
    ``witness_dir`` (node config ``ledger-witness-dir``) or beside the mark."""
    name = mark_path.name[:-len(".mark")] if mark_path.name.endswith(".mark") else mark_path.name
    return (Path(witness_dir) if witness_dir else mark_path.parent) / f"{name}.witness"


def read_witness_file(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data.decode(errors="replace").strip() or None


def write_witness_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomically(path, text.encode() + b"\n")


# -- the server's store -----------------------------------------------------------------------------

class WitnessStore:
    """The server's witnesses: per node, per ledger name, the latest one the node sent (at most
    :data:`MAX_PER_NODE` ledgers a node, the most recently updated). A JSON file, rewritten
    atomically when it changes. The server cannot verify a witness (it has no key): it keeps what
    the node sent, in form, and gives it back."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._nodes: dict[str, dict[str, str]] | None = None
        self._dirty = False

    def _load(self) -> dict[str, dict[str, str]]:
        if self._nodes is None:
            try:
                raw = json.loads(self.path.read_text())
                nodes = raw.get("nodes", {}) if isinstance(raw, dict) else {}
                self._nodes = {str(n): {str(k): str(v) for k, v in ws.items() if parse_witness(v) is not None}
                               for n, ws in nodes.items() if isinstance(ws, dict)}
            except FileNotFoundError:
                self._nodes = {}
            except (OSError, ValueError, AttributeError) as exc:
                logger.warning("ledger witnesses %s cannot be read (%s): starting with none", self.path, exc)
                self._nodes = {}
        return self._nodes

    def get(self, node: int) -> list[str]:
        """The witnesses held for ``node`` (to send back with its instructions)."""
        return list(self._load().get(str(int(node)), {}).values())

    def put(self, node: int, text: Any) -> bool:
        """Keep ``text`` (a witness in form) as ``node``'s latest for its ledger; True when kept
        (written to the file by :meth:`flush`)."""
        w = parse_witness(text)
        if w is None:
            return False
        nodes = self._load()
        held = nodes.pop(str(int(node)), {})
        nodes[str(int(node))] = held  # the most recently updated node last
        if held.get(w["ledger"]) == text:
            return False
        held.pop(w["ledger"], None)
        held[w["ledger"]] = text  # the most recently updated ledger last
        while len(held) > MAX_PER_NODE:
            del held[next(iter(held))]
        while len(nodes) > MAX_NODES:
            del nodes[next(iter(nodes))]
        self._dirty = True
        return True

    def flush(self) -> None:
        """Write the witnesses kept since the last flush (atomically, durably), after an
        ``os.sync()``: a simulation's virtual silos append their ledger rows without an fsync each
        (PrivacyLedger.sync), and this puts them on disk before the server's witness of them, so
        that a durable witness is never ahead of a ledger on the same machine; a resumed
        simulation finds ledgers that match its checkpoint, written after this."""
        if not self._dirty:
            return
        os.sync()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomically(self.path, json.dumps({"witnesses": 1, "nodes": self._load()}, indent=1).encode(),
                               sync_dir=True)
        self._dirty = False
