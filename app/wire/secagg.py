"""The secure-aggregation messages (privacy.mode secagg), typed like the rest of the wire.

One exchange of SecAgg+ (Bell et al., CCS 2020) on Flower's Message API is four message rounds;
the protocol's own payloads (adverts, sealed share payloads, unmask shares) are opaque bytes
here, built and checked by app/secagg/protocol.py:

    1. server -> sampled silos  ``query.secagg_keys``   :class:`SecAggParams`
       silo -> server           :class:`BlobReply`        its advert (fresh X25519 mask key)
    2. server -> roster U1      ``query.secagg_share``  :class:`ShareRequest` (roster, peers' static keys)
       silo -> server           :class:`ShareReply`       one sealed share payload per neighbour
    3. server -> U2             ``train``               the Instruction with ``secagg`` params and
                                                        :data:`SECAGG_SHARES` (the payloads sealed to it)
       silo -> server           :class:`MaskedReply`      the masked integer vector, K, epsilon spent
    4. server -> survivors U3   ``query.secagg_unmask`` :class:`UnmaskRequest` (survivors, dropped)
       silo -> server           :class:`BlobReply`        the shares the server may have

Node ids travel as decimal strings (Flower's are 64-bit). Every decode checks keys, types and
sizes and raises ``ReplyError``: a malformed message is a dropped silo or a refusal, never a crash.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, MetricRecord, RecordDict

from app.wire.records import EPS_SPENT, METRICS, ReplyError, read_metrics, record_of

SECAGG = "secagg"
SECAGG_KEYS_QUERY = f"{MessageType.QUERY}.secagg_keys"
SECAGG_SHARE_QUERY = f"{MessageType.QUERY}.secagg_share"
SECAGG_UNMASK_QUERY = f"{MessageType.QUERY}.secagg_unmask"
#: the training instruction's record of the share payloads sealed to its recipient (sender -> blob)
SECAGG_SHARES = "secagg-shares"
BLOB = "secagg-blob"
MASKED = "secagg-masked"
#: the largest protocol blob and the most entries a message may carry
MAX_BLOB_BYTES = 1 << 16
MAX_NODES = 10_000
_NODE = re.compile(r"^[0-9]{1,20}$")


def _node(text: Any) -> int:
    if not isinstance(text, str) or not _NODE.match(text):
        raise ReplyError(f"secagg: node id {text!r} is not a decimal integer")
    return int(text)


def _blob_array(blob: bytes) -> Array:
    return Array(np.frombuffer(bytes(blob), dtype=np.uint8).copy())


def _array_blob(array: Any, what: str) -> bytes:
    try:
        arr = array.numpy()
    except Exception as exc:  # noqa: BLE001 - any undecodable array is a malformed message
        raise ReplyError(f"secagg: {what} cannot be decoded ({exc})") from exc
    if arr.dtype != np.uint8 or arr.ndim != 1 or arr.size > MAX_BLOB_BYTES:
        raise ReplyError(f"secagg: {what} must be a 1-D uint8 array of at most {MAX_BLOB_BYTES} bytes, "
                         f"got {arr.dtype} {arr.shape}")
    return arr.tobytes()


def _blobs(record: ArrayRecord | None, what: str) -> dict[int, bytes]:
    if record is None:
        raise ReplyError(f"secagg: the message carries no {what}")
    if len(record) > MAX_NODES:
        raise ReplyError(f"secagg: {what} has {len(record)} entries, more than {MAX_NODES}")
    return {_node(k): _array_blob(v, f"{what}[{k}]") for k, v in record.items()}


def _blob_record(blobs: Mapping[int, bytes]) -> ArrayRecord:
    return ArrayRecord({str(int(k)): _blob_array(v) for k, v in blobs.items()})


def _int(config: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ReplyError(f"secagg: {key} = {value!r} must be an integer in [{lo}, {hi}]")
    return int(value)


def _node_list(config: Mapping[str, Any], key: str) -> tuple[int, ...]:
    value = config.get(key, [])
    if not isinstance(value, list) or len(value) > MAX_NODES:
        raise ReplyError(f"secagg: {key} must be a list of at most {MAX_NODES} node ids")
    nodes = tuple(_node(v) for v in value)
    if len(set(nodes)) != len(nodes):
        raise ReplyError(f"secagg: {key} names a node twice")
    return nodes


@dataclass(frozen=True)
class SecAggParams:
    """What the server chose for one exchange, the same for every silo in it (each silo binds
    all of it into the exchange's context, app/secagg/context.py): the exchange's number, round
    and phase, the modulus 2**bits, the threshold t, the neighbourhood degree (0: everyone), the
    encoding's scale gamma and the public seed of its rotation and of the SecAgg+ graph. None of
    it can weaken a silo's privacy: the silo calibrates its noise for the scale it is sent."""

    exchange: int
    round: int
    phase: str
    bits: int
    threshold: int
    degree: int
    gamma: float
    seed: int

    def context(self, run_id: int) -> bytes:
        """The bytes every seal and derived seed of the exchange is bound to: the run (the silo's
        own view of it), the exchange and everything fixed at its first round. ``gamma`` is chosen
        after the adverts and is not in it (any gamma is safe for the silo)."""
        return (f"silofl-secagg-v1|run={int(run_id)}|exchange={int(self.exchange)}|round={int(self.round)}|"
                f"phase={self.phase}|bits={int(self.bits)}|t={int(self.threshold)}|degree={int(self.degree)}|"
                f"seed={int(self.seed)}").encode()

    def same_exchange(self, other: SecAggParams) -> bool:
        """Whether ``other`` names the same exchange with the same fixed parameters (gamma aside)."""
        return (self.exchange, self.round, self.phase, self.bits, self.threshold, self.degree, self.seed) == \
            (other.exchange, other.round, other.phase, other.bits, other.threshold, other.degree, other.seed)

    def config(self) -> dict[str, Any]:
        return {"exchange": int(self.exchange), "round": int(self.round), "phase": str(self.phase),
                "bits": int(self.bits), "threshold": int(self.threshold), "degree": int(self.degree),
                "gamma": float(self.gamma), "seed": int(self.seed)}

    def encode(self) -> RecordDict:
        return RecordDict({SECAGG: ConfigRecord(self.config())})

    @classmethod
    def read(cls, config: Mapping[str, Any]) -> SecAggParams:
        gamma = config.get("gamma")
        if isinstance(gamma, bool) or not isinstance(gamma, float) or not 0.0 < gamma < 2.0**62:
            raise ReplyError(f"secagg: gamma = {gamma!r} must be a float in (0, 2**62)")
        phase = config.get("phase")
        if not isinstance(phase, str) or not 0 < len(phase) <= 32:
            raise ReplyError(f"secagg: phase = {phase!r} is not a phase name")
        return cls(_int(config, "exchange", 1, 2**62), _int(config, "round", 0, 2**31), phase,
                   _int(config, "bits", 2, 62), _int(config, "threshold", 1, MAX_NODES),
                   _int(config, "degree", 0, MAX_NODES), float(gamma), _int(config, "seed", 0, 2**63 - 1))

    @classmethod
    def decode(cls, content: RecordDict) -> SecAggParams:
        record = record_of(content, SECAGG, ConfigRecord)
        if record is None:
            raise ReplyError("secagg: the message carries no secagg parameters")
        return cls.read(record)


@dataclass(frozen=True)
class BlobReply:
    """Silo -> server: one protocol payload (an advert, or the shares of an unmask)."""

    blob: bytes

    def encode(self) -> RecordDict:
        return RecordDict({BLOB: ArrayRecord({BLOB: _blob_array(self.blob)})})

    @classmethod
    def decode(cls, content: RecordDict) -> BlobReply:
        record = record_of(content, BLOB, ArrayRecord)
        if record is None or BLOB not in record:
            raise ReplyError("secagg: the reply carries no payload")
        return cls(_array_blob(record[BLOB], "payload"))


def advert_reply(blob: bytes, records: int, noise: float) -> RecordDict:
    """Silo -> server, round 1: its advert, the K records its vector will sum and the noise
    multiplier it adds (both public: its ledger report states them)."""
    content = BlobReply(blob).encode()
    content[METRICS] = MetricRecord({"records": int(records), "noise": float(noise)})
    return content


def advert_terms(content: RecordDict) -> tuple[int, float]:
    """(K, noise multiplier) of an advert reply; ReplyError when malformed or impossible."""
    metrics = read_metrics(content, ("records", "noise"))
    records, noise = metrics["records"], metrics["noise"]
    if not float(records).is_integer() or not 1 <= records <= 2**40:
        raise ReplyError(f"secagg: records = {records!r} must be a positive integer")
    if not 0.0 < noise < 1e6:
        raise ReplyError(f"secagg: noise = {noise!r} must be in (0, 1e6)")
    return int(records), float(noise)


@dataclass(frozen=True)
class ShareRequest:
    """Server -> roster U1: the exchange's adverts (node -> advert) and the static public keys
    (hex) the server knows the roster's silos by. A silo whose node config pins its peers' keys
    uses its own and ignores these."""

    params: SecAggParams
    adverts: Mapping[int, bytes]
    static_keys: Mapping[int, str]

    def encode(self) -> RecordDict:
        return RecordDict({SECAGG: ConfigRecord(self.params.config()
                                                | {"static-keys": [f"{int(k)}:{v}" for k, v in self.static_keys.items()]}),
                           BLOB: _blob_record(self.adverts)})

    @classmethod
    def decode(cls, content: RecordDict) -> ShareRequest:
        record = record_of(content, SECAGG, ConfigRecord)
        if record is None:
            raise ReplyError("secagg: the share request carries no parameters")
        params = SecAggParams.read(record)
        keys_field = record.get("static-keys", [])
        if not isinstance(keys_field, list) or len(keys_field) > MAX_NODES:
            raise ReplyError("secagg: static-keys must be a list of 'node:hex' entries")
        static: dict[int, str] = {}
        for entry in keys_field:
            node, _, key = str(entry).partition(":")
            if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
                raise ReplyError(f"secagg: static key of node {node!r} is not 64 lowercase hex characters")
            static[_node(node)] = key
        return cls(params, _blobs(record_of(content, BLOB, ArrayRecord), "adverts"), static)


@dataclass(frozen=True)
class ShareReply:
    """Silo -> server: one sealed share payload per neighbour (receiver -> blob)."""

    blobs: Mapping[int, bytes]

    def encode(self) -> RecordDict:
        return RecordDict({BLOB: _blob_record(self.blobs)})

    @classmethod
    def decode(cls, content: RecordDict) -> ShareReply:
        return cls(_blobs(record_of(content, BLOB, ArrayRecord), "share payloads"))


def shares_record(blobs: Mapping[int, bytes]) -> ArrayRecord:
    """The training instruction's :data:`SECAGG_SHARES` record (sender -> payload sealed to the recipient)."""
    return _blob_record(blobs)


def shares_of(content: RecordDict) -> dict[int, bytes]:
    """The share payloads a training instruction routes to its recipient (sender -> blob)."""
    return _blobs(record_of(content, SECAGG_SHARES, ArrayRecord), "routed share payloads")


def vector_dtype(bits: int) -> np.dtype:
    """The narrowest unsigned dtype holding values in [0, 2**bits): what a masked vector travels as."""
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if bits <= 8 * np.dtype(dtype).itemsize:
            return np.dtype(dtype)
    raise ValueError(f"bits = {bits} exceeds 64")


@dataclass(frozen=True)
class MaskedReply:
    """Silo -> server: the masked vector y (values in [0, 2**bits), sent in the narrowest
    unsigned dtype), the number K of records in its sum (public: the plan's batch), the
    epsilon the silo has spent and the neighbours it masked against (its view)."""

    vector: np.ndarray
    records: int
    eps_spent: float
    #: the neighbours whose share payloads the silo verified (its masks cancel only against theirs)
    view: tuple[int, ...] = ()

    def encode(self, bits: int) -> RecordDict:
        vec = np.ascontiguousarray(self.vector, dtype=vector_dtype(bits))
        return RecordDict({MASKED: ArrayRecord({MASKED: Array(vec)}),
                           METRICS: MetricRecord({EPS_SPENT: float(self.eps_spent), "records": int(self.records)}),
                           SECAGG: ConfigRecord({"view": [str(int(n)) for n in self.view]})})

    @classmethod
    def decode(cls, content: RecordDict, bits: int, dim: int) -> MaskedReply:
        record = record_of(content, MASKED, ArrayRecord)
        if record is None or MASKED not in record:
            raise ReplyError("secagg: the reply carries no masked vector")
        try:
            vec = record[MASKED].numpy()
        except Exception as exc:  # noqa: BLE001
            raise ReplyError(f"secagg: the masked vector cannot be decoded ({exc})") from exc
        if vec.dtype != vector_dtype(bits) or vec.shape != (dim,):
            raise ReplyError(f"secagg: the masked vector must be {vector_dtype(bits)} ({dim},), got {vec.dtype} "
                             f"{vec.shape}")
        vec = vec.astype(np.uint64)
        if bits < 64 and np.any(vec >> np.uint64(bits)):
            raise ReplyError(f"secagg: the masked vector has values outside [0, 2**{bits})")
        metrics = read_metrics(content, (EPS_SPENT, "records"))
        records = metrics["records"]
        if not float(records).is_integer() or not 1 <= records <= 2**40:
            raise ReplyError(f"secagg: records = {records!r} must be a positive integer")
        view = record_of(content, SECAGG, ConfigRecord)
        return cls(vec, int(records), metrics[EPS_SPENT], _node_list(view, "view") if view is not None else ())


@dataclass(frozen=True)
class UnmaskRequest:
    """Server -> survivors U3: who survived (their self-mask seeds are asked for) and who dropped
    after sharing (their mask keys are asked for)."""

    params: SecAggParams
    survivors: Sequence[int]
    dropped: Sequence[int]

    def encode(self) -> RecordDict:
        return RecordDict({SECAGG: ConfigRecord(self.params.config() | {
            "survivors": [str(int(n)) for n in self.survivors], "dropped": [str(int(n)) for n in self.dropped]})})

    @classmethod
    def decode(cls, content: RecordDict) -> UnmaskRequest:
        record = record_of(content, SECAGG, ConfigRecord)
        if record is None:
            raise ReplyError("secagg: the unmask request carries no parameters")
        return cls(SecAggParams.read(record), _node_list(record, "survivors"), _node_list(record, "dropped"))


__all__ = ["advert_reply", "advert_terms", "BLOB", "BlobReply", "MASKED", "MAX_BLOB_BYTES", "MaskedReply", "SECAGG", "SECAGG_KEYS_QUERY",
           "SECAGG_SHARES", "SECAGG_SHARE_QUERY", "SECAGG_UNMASK_QUERY", "SecAggParams", "ShareReply", "ShareRequest",
           "UnmaskRequest", "shares_of", "shares_record", "vector_dtype"]
