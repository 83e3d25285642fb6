"""The queries besides train and evaluate (the ledger report, the identity answer, the keys) and
the shuffle-DP messages (silo -> server relays -> shuffler). Encoded with the records of
app/wire/records.py; decoding validates (a malformed message raises ``ReplyError``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, MetricRecord, RecordDict

from app.wire.records import CONFIG, EPS_SPENT, METRICS, ReplyError, read_metrics
from app.wire.messages import config_int


LEDGER = "ledger"
IDENTITY = "identity"
#: message types of the two queries a ServerApp sends besides train and evaluate
LEDGER_QUERY = f"{MessageType.QUERY}.{LEDGER}"
IDENTITY_QUERY = f"{MessageType.QUERY}.{IDENTITY}"


def identity_reply(partition_id: int) -> RecordDict:
    """A node's answer to the attack harness's one-time identity query (simulations only)."""
    return RecordDict({IDENTITY: ConfigRecord({"partition-id": int(partition_id)})})


def read_identity(content: RecordDict, num_partitions: int) -> int:
    """The partition id in an identity reply: an integer in [0, num_partitions), else ReplyError."""
    try:
        value = content.config_records[IDENTITY]["partition-id"]
    except (KeyError, TypeError) as exc:
        raise ReplyError(f"identity reply is malformed: {exc}") from exc
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_partitions:
        raise ReplyError(f"identity reply partition-id = {value!r} is not an integer in [0, {num_partitions})")
    return int(value)


def ledger_reply(report: Mapping[str, Any]) -> RecordDict:
    """A silo's public privacy record (JSON text in a ConfigRecord)."""
    return RecordDict({LEDGER: ConfigRecord({"json": json.dumps(report)})})


def read_ledger(content: RecordDict) -> dict[str, Any]:
    """Parse :func:`ledger_reply`; raises ReplyError when malformed."""
    try:
        data = json.loads(str(content.config_records[LEDGER]["json"]))
    except (KeyError, ValueError) as exc:
        raise ReplyError(f"ledger reply is malformed: {exc}") from exc
    if not isinstance(data, dict):
        raise ReplyError("ledger reply is not an object")
    return data


# -- shuffle DP: silo -> (server relays) -> shuffler ------------------------------------------------
SEALED = "sealed"  # a silo's encrypted contribution (uint8), silo -> server -> shuffler
SHUFFLE = "shuffle"
KEYS = "keys"
#: the server asks every node for its role and public key once; it relays sealed contributions
#: to the shuffler node and gets back only the totals
KEYS_QUERY = f"{MessageType.QUERY}.{KEYS}"
SHUFFLE_QUERY = f"{MessageType.QUERY}.{SHUFFLE}"
ROLE_SILO, ROLE_SHUFFLER = "silo", "shuffler"
#: the largest sealed contribution the server relays (a count vector of 8 bytes per coordinate
#: of an 11M-parameter model plus headers is ~90 MB)
MAX_SEALED_BYTES = 1 << 30


def shuffle_context(run_id: int, rnd: int, exchange: int, phase: str) -> bytes:
    """The bytes every sealed contribution of one exchange is bound to (AEAD associated data):
    a ciphertext cannot be replayed into another run, round, exchange or phase."""
    return f"silofl-shuffle-v1|run={int(run_id)}|round={int(rnd)}|exchange={int(exchange)}|phase={phase}".encode()


def _bytes_array(blob: bytes) -> Array:
    return Array(np.frombuffer(blob, dtype=np.uint8).copy())


def _array_bytes(array: Any, what: str) -> bytes:
    try:
        arr = array.numpy()
    except Exception as exc:
        raise ReplyError(f"{what}: cannot be decoded ({exc})") from exc
    if arr.dtype != np.uint8 or arr.ndim != 1:
        raise ReplyError(f"{what}: expected a 1-D uint8 array, got {arr.dtype} {arr.shape}")
    if arr.size > MAX_SEALED_BYTES:
        raise ReplyError(f"{what}: {arr.size} bytes exceed the {MAX_SEALED_BYTES} allowed")
    return arr.tobytes()


@dataclass(frozen=True)
class SealedReply:
    """Silo -> server: the silo's contribution sealed to the shuffler (the server cannot read
    it) and the epsilon the silo has spent."""

    blob: bytes
    eps_spent: float

    def encode(self) -> RecordDict:
        return RecordDict({SEALED: ArrayRecord({SEALED: _bytes_array(self.blob)}),
                           METRICS: MetricRecord({EPS_SPENT: float(self.eps_spent)})})

    @classmethod
    def decode(cls, content: RecordDict) -> SealedReply:
        if SEALED not in content.array_records or SEALED not in content.array_records[SEALED]:
            raise ReplyError(f"a shuffle-mode reply must carry an ArrayRecord {SEALED!r}; got {list(content.keys())}")
        blob = _array_bytes(content.array_records[SEALED][SEALED], SEALED)
        return cls(blob, read_metrics(content, (EPS_SPENT,))[EPS_SPENT])


@dataclass(frozen=True)
class ShuffleRequest:
    """Server -> shuffler: the exchange's sealed contributions, its context, the vector length
    and levels every contribution must have, (simulation only) the silo keys the server saw, and
    the noise bits' probability p (0: not sent; with it the shuffler drops counts impossible for
    their claimed trials)."""

    context: bytes
    dim: int
    levels: int
    blobs: tuple[bytes, ...]
    senders: tuple[str, ...] = ()
    p: float = 0.0

    def encode(self) -> RecordDict:
        return RecordDict({
            SEALED: ArrayRecord({str(i): _bytes_array(b) for i, b in enumerate(self.blobs)}),
            CONFIG: ConfigRecord({"context": self.context.decode(), "dim": int(self.dim), "levels": int(self.levels),
                                  "senders": list(self.senders)} | ({"p": float(self.p)} if self.p else {})),
        })

    @classmethod
    def decode(cls, content: RecordDict) -> ShuffleRequest:
        if SEALED not in content.array_records or CONFIG not in content.config_records:
            raise ReplyError("a shuffle request must carry the sealed contributions and a config")
        config = content.config_records[CONFIG]
        blobs = tuple(_array_bytes(a, f"{SEALED}[{k}]") for k, a in content.array_records[SEALED].items())
        senders = config.get("senders", [])
        if not isinstance(senders, list) or not all(isinstance(x, str) for x in senders):
            raise ReplyError("shuffle request senders must be a list of hex keys")
        p = config.get("p", 0.0)
        if not isinstance(p, float) or not (p == 0.0 or 0.0 < p < 1.0):
            raise ReplyError(f"shuffle request p must be a float in (0, 1) (or absent), got {p!r}")
        return cls(str(config.get("context", "")).encode(), config_int(config, "dim"), config_int(config, "levels"), blobs,
                   tuple(senders), p)


@dataclass(frozen=True)
class ShuffleReply:
    """Shuffler -> server: the per-coordinate totals of the accepted contributions, their noise
    trials and records, and how many were accepted and dropped. Nothing per silo."""

    totals: np.ndarray
    trials: int
    records: int
    accepted: int
    dropped: int

    def encode(self) -> RecordDict:
        return RecordDict({
            SHUFFLE: ArrayRecord({"totals": Array(np.ascontiguousarray(self.totals, dtype=np.int64))}),
            CONFIG: ConfigRecord({"trials": int(self.trials), "records": int(self.records),
                                  "accepted": int(self.accepted), "dropped": int(self.dropped)}),
        })

    @classmethod
    def decode(cls, content: RecordDict, dim: int) -> ShuffleReply:
        try:
            totals = content.array_records[SHUFFLE]["totals"].numpy()
            config = content.config_records[CONFIG]
        except (KeyError, TypeError) as exc:
            raise ReplyError(f"shuffle reply is malformed: {exc}") from exc
        except Exception as exc:
            raise ReplyError(f"shuffle reply totals cannot be decoded ({exc})") from exc
        if totals.dtype != np.int64 or totals.shape != (dim,):
            raise ReplyError(f"shuffle reply totals: expected int64 ({dim},), got {totals.dtype} {totals.shape}")
        reply = cls(totals, config_int(config, "trials"), config_int(config, "records"), config_int(config, "accepted"),
                    config_int(config, "dropped"))
        if reply.records < 1 or reply.accepted < 1 or reply.trials < 0 or np.any(totals < 0):
            raise ReplyError(f"shuffle reply is impossible: records {reply.records}, accepted {reply.accepted}, "
                             f"trials {reply.trials}, min total {int(totals.min(initial=0))}")
        return reply


def keys_reply(role: str, public_key: str) -> RecordDict:
    """A node's answer to the keys query: its role and its X25519 public key (hex)."""
    return RecordDict({KEYS: ConfigRecord({"role": role, "public-key": public_key})})


def read_keys(content: RecordDict) -> tuple[str, str]:
    """(role, public key hex) of a keys reply; ReplyError when malformed."""
    try:
        record = content.config_records[KEYS]
        role, key = record["role"], record["public-key"]
    except (KeyError, TypeError) as exc:
        raise ReplyError(f"keys reply is malformed: {exc}") from exc
    if role not in (ROLE_SILO, ROLE_SHUFFLER) or not isinstance(key, str) or len(key) != 64:
        raise ReplyError(f"keys reply has role {role!r}, key {key!r}: expected silo|shuffler and 64 hex characters")
    try:
        bytes.fromhex(key)
    except ValueError as exc:
        raise ReplyError(f"keys reply key is not hex: {exc}") from exc
    return str(role), str(key)
