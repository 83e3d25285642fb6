"""The ledger's high-water mark: two checksummed 512-byte slots in a second place
(``<mark-dir>/<ledger file name>.mark``), written alternately in place; see app/privacy/ledger/__init__.py."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from app.filelock import write_bytes_atomically
from app.privacy.ledger.chain import LedgerError, canonical

#: two slots of this many bytes, written alternately in place, each at the start of its own 4 KiB
#: page (a page torn by a power loss spoils one slot, never both)
MARK_SLOT = 512
MARK_STRIDE = 4096
#: where a node keeps its marks by default, relative to the ledger's directory (its state-dir)
MARK_DIR = "ledger-marks"


def mark_path_for(ledger_path: str | Path, mark_dir: str | Path | None = None) -> Path:
    """Where the high-water mark of ``ledger_path`` lives: ``<mark_dir>/<file name>.mark``,
    ``mark_dir`` defaulting to ``ledger-marks`` beside the ledger."""
    ledger_path = Path(ledger_path)
    where = Path(mark_dir) if mark_dir else ledger_path.parent / MARK_DIR
    return where / f"{ledger_path.name}.mark"


def _mark_slot(mark: dict[str, Any]) -> bytes:
    body = {k: v for k, v in mark.items() if k != "check"}
    text = canonical(body | {"check": hashlib.sha256(canonical(body)).hexdigest()})
    if len(text) >= MARK_SLOT:
        raise ValueError(f"high-water mark too long ({len(text)} bytes)")
    return text + b" " * (MARK_SLOT - 1 - len(text)) + b"\n"


def write_mark(path: Path, mark: dict[str, Any], *, fresh: bool = False, sync: bool = False,
               durable_create: bool = True) -> None:
    """Write ``mark`` into slot ``gen % 2`` of the mark file, in place (``fresh``: create the
    file with both slots, atomically, and durably unless ``durable_create`` is False: a
    simulation's virtual silo, PrivacyLedger.sync). ``sync``: fdatasync the slot."""
    slot = _mark_slot(mark)
    if fresh or not path.exists():
        page = slot + b" " * (MARK_STRIDE - MARK_SLOT - 1) + b"\n"
        write_bytes_atomically(path, page + slot, sync_dir=True, sync=durable_create)
        return
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, slot, MARK_STRIDE * (int(mark["gen"]) % 2))
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def read_mark(path: Path) -> dict[str, Any] | None:
    """The newest valid slot of the mark file (None when there is no file); LedgerError when
    no slot is valid."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LedgerError(f"the ledger's high-water mark {path} is unreadable: {exc}") from exc
    best = None
    for i in (0, MARK_STRIDE):
        try:
            slot = json.loads(data[i:i + MARK_SLOT])
            body = {k: v for k, v in slot.items() if k != "check"}
            if slot.get("check") != hashlib.sha256(canonical(body)).hexdigest() or body.get("mark") != 1:
                continue
            int(body["entries"]), int(body["gen"]), str(body["head"]), str(body["id"])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        if best is None or body["gen"] > best["gen"]:
            best = body
    if best is None:
        raise LedgerError(f"the ledger's high-water mark {path} is unreadable (no valid slot); "
                          f"see docs/privacy.md (\"When the ledger does not verify\")")
    return best
